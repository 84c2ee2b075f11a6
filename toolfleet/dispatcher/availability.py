"""Whether a call can run at all before it is sent (issue "Faults", availability).

- **Catalog**: workers publish the tools they serve with a heartbeat
  (:mod:`toolfleet.worker.catalog`). A tool that no live worker serves gets ``TOOL_UNAVAILABLE``
  at once instead of a task that waits in a queue nobody reads. The catalog is read at most once a
  second (two Redis round trips) and re-read before refusing, so a worker that just came up is seen.
- **One version per tool**: a tool whose live workers publish two versions of its spec or code
  (:func:`toolfleet.tools.published.version_conflicts`) gets ``TOOL_UNAVAILABLE`` naming the
  workers, rather than running on whichever worker takes the message (issue 15, point 3).
- **Circuit breaker** (:mod:`toolfleet.breaker`): a tool whose circuit is open gets
  ``TOOL_UNAVAILABLE``; the dispatcher that finds its cooldown over sends the health check.
- **Worker liveness**: a worker whose catalog expired (three missed heartbeats) is dead; the turn's
  watchdog uses this to act on calls it was running long before their time limit ends.
- **The liveness bound** (:func:`liveness_bound_s`): a tool whose catalog entries all expired is
  unserved; once that has lasted ``UNSERVED_CONFIRM_BEATS`` heartbeats, every call of it ends.
- **Messages nobody holds visibly** (:meth:`Availability.message_queued`): a call sent and not
  started is either in its queue or held by a worker; one held past the bound by a worker that
  never claims it (frozen, or killed with the message in its socket) is sent again by the watchdog.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import redis
from celery import Celery

from ..breaker import CLOSED, PROBE, Breakers
from ..keys import Keys
from ..models import ErrorCode, ToolResult
from ..redis_client import translated
from ..settings import Settings
from ..signing import signed_fields
from ..tools.published import readable_tools, version_conflicts
from ..tools.spec import ToolSpec
from ..worker.app import HEALTH_TASK_NAME
from ..worker.catalog import accepts, live_catalog, signing_key_id

log = logging.getLogger(__name__)
CATALOG_CACHE_S = 1.0
LIVENESS_CACHE_S = 0.5
NO_LIVE_WORKER = "no live worker serves the tool"  # how a refusal for that reason begins
HEALTH_CHECK_TTL_S = 3600.0  # a signed health check older than this is dropped by workers
DEAD_CONFIRM_S = 1.0  # a worker's catalog must stay missing this long before it is declared dead
UNSERVED_CONFIRM_BEATS = 1.0  # heartbeats a tool stays unserved before its calls end
CATALOG_TTL_BEATS = 3  # toolfleet.worker.catalog: a catalog expires after three missed beats
ELSEWHERE_SCAN_STEPS = 200  # SCAN steps (1,000 keys each, in a thread of its own) looking for other
# namespaces whose workers serve a tool missing here
ELSEWHERE_CACHE_S = 30.0  # ... at most once per tool this often

_QUEUED = """
-- KEYS: the queue's lists (one per priority step) ; ARGV: needle ('"<task id>"')
for _, key in ipairs(KEYS) do
  for _, body in ipairs(redis.call('LRANGE', key, 0, -1)) do
    if string.find(body, ARGV[1], 1, true) then return 1 end
  end
end
return 0
"""
KOMBU_PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: queue name + sep + priority step
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)


def liveness_bound_s(settings: Settings) -> float:
    """The liveness bound (s): when no live worker serves a call's tool, the call ends this long
    after the last worker serving it died or froze, at most: its catalog expires after three
    missed heartbeats, the tool must stay unserved one more heartbeat (a worker that comes back
    within it still takes the call), plus one second for the watchdog's tick and caches. 9 s with
    the default ``heartbeat_s`` of 2 s. A message held past this bound by a worker that never
    claims it is sent again."""
    return (CATALOG_TTL_BEATS + UNSERVED_CONFIRM_BEATS) * settings.heartbeat_s + 1.0


class Availability:
    """Shared by the turns of one dispatcher (thread-safe)."""

    def __init__(self, settings: Settings, client: redis.Redis, app: Celery) -> None:
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.redis = client
        self.app = app
        self.breakers = Breakers(settings, client)
        self._lock = threading.Lock()
        self._served: set[str] = set()
        self._other_key: dict[str, list[str]] = {}  # tool -> live workers that serve it and hold another key
        self._warned_other_key: set[str] = set()
        self._conflicts: dict[str, dict[str, list[str]]] = {}
        self._ever_served: set[str] = set()  # tools this dispatcher has seen a live worker serve
        self._served_at = -1e9
        self._alive: dict[str, tuple[float, bool]] = {}  # worker -> (checked at, catalog present)
        self._missing_since: dict[str, float] = {}
        self._group = threading.local()  # .closed: tools found closed in the group being sent
        self._unserved_since: dict[str, float] = {}
        self._queued_script = client.register_script(_QUEUED)
        self._broker_client: redis.Redis | None = None
        self._told_elsewhere: dict[str, float] = {}  # tool -> when other namespaces were looked at

    @contextmanager
    def group(self, closed: Iterable[str] = ()) -> Iterator[None]:
        """Calls sent together (a turn's ready calls): inside the block each tool's breaker is
        read once, not once per call; an open or probing breaker is read again for every call.
        ``closed``: tools whose breaker a read made just before found closed (the sender reads
        them with the group's other first reads, :meth:`Breakers.read_state`): not read again."""
        self._group.closed = set(closed)
        try:
            yield
        finally:
            self._group.closed = None

    def _say_where_else(self, tool: str) -> None:
        """Log (never in the result the model reads) the other namespaces on this Redis whose live
        workers serve ``tool``: a dispatcher in the wrong namespace is a newcomer's first trap.
        Bounded: in a daemon thread (the refusal does not wait for it), at most
        ``ELSEWHERE_SCAN_STEPS`` SCAN steps, once per tool per ``ELSEWHERE_CACHE_S``; any Redis
        refusal (an ACL user without SCAN) leaves it unsaid."""
        now = time.monotonic()
        with self._lock:
            if now - self._told_elsewhere.get(tool, -ELSEWHERE_CACHE_S) < ELSEWHERE_CACHE_S:
                return
            self._told_elsewhere[tool] = now
        threading.Thread(target=self._look_elsewhere, args=(tool,), daemon=True,
                         name=f"toolfleet-elsewhere-{tool[:20]}").start()

    def _look_elsewhere(self, tool: str) -> None:
        found: set[str] = set()
        try:
            cursor, steps = 0, 0
            while steps < ELSEWHERE_SCAN_STEPS:
                cursor, keys = self.redis.scan(cursor, match="*:workers", count=1000)
                steps += 1
                for key in keys:
                    name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
                    namespace = name[: -len(":workers")]
                    if ":" not in namespace and namespace != self.settings.namespace and \
                            self._serves_in(namespace, tool):
                        found.add(namespace)
                if cursor == 0:
                    break
        except Exception as exc:  # noqa: BLE001 - a hint only: Redis refusing SCAN, the dispatcher closed
            log.debug("could not look for %r in other namespaces (%s)", tool, exc)
            return
        if found:
            log.warning("no live worker in namespace %r serves %r, but live workers in namespace(s) %s do: set "
                        "TOOLFLEET_NAMESPACE / --namespace / Settings(namespace=...) to theirs to use them",
                        self.settings.namespace, tool, ", ".join(sorted(found)))

    def _serves_in(self, namespace: str, tool: str) -> bool:
        try:
            entries = live_catalog(self.settings.model_copy(update={"namespace": namespace}), self.redis)
        except (redis.RedisError, ValueError):
            return False
        return any(isinstance(t, dict) and t.get("name") == tool
                   for e in entries if isinstance(e, dict) for t in e.get("tools", ()) or ())

    def refusal(self, spec: ToolSpec, call_id: str) -> ToolResult | None:
        """``None`` if the call may be sent, else its ``TOOL_UNAVAILABLE`` result. Raises
        :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer."""
        with translated(self.settings.redis_url):
            return self._refusal(spec, call_id)

    def _refusal(self, spec: ToolSpec, call_id: str) -> ToolResult | None:
        if self.settings.require_live_worker and not self._is_served(spec.name):
            with self._lock:
                other_key = self._other_key.get(spec.name)
            if other_key:
                return ToolResult.failure(
                    call_id, spec.name, ErrorCode.TOOL_UNAVAILABLE,
                    f"the live workers that serve {spec.name!r} ({', '.join(other_key)}) hold another fleet key: "
                    f"they would drop this call unrun (this dispatcher signs with key id "
                    f"{signing_key_id(self.settings) or 'none: unsigned'}); it did not run",
                    "give the dispatcher and the workers the same fleet key (TOOLFLEET_FLEET_KEY_FILE; after "
                    "`toolfleet down` and `up` the local stack has a new one: restart workers started by hand)",
                )
            self._say_where_else(spec.name)
            return ToolResult.failure(
                call_id, spec.name, ErrorCode.TOOL_UNAVAILABLE,
                f"{NO_LIVE_WORKER} {spec.name!r} (queue {self.keys.queue(spec.queue)}); it did not run",
                "start a worker that serves it (`toolfleet worker --tools <module>`), or use another tool",
            )
        with self._lock:
            versions = self._conflicts.get(spec.name)
        if versions:
            told = "; ".join(f"{v}: {', '.join(sorted(w))}" for v, w in sorted(versions.items()))
            return ToolResult.failure(
                call_id, spec.name, ErrorCode.TOOL_UNAVAILABLE,
                f"live workers serve {len(versions)} different versions of {spec.name!r} ({told}); it did not run",
                "stop the workers that serve the old version (`toolfleet tools` lists them), then call it again",
            )
        closed = getattr(self._group, "closed", None)
        if closed is not None and spec.name in closed:
            return None
        state = self.breakers.check(spec.name)
        if state == CLOSED:
            if closed is not None:
                closed.add(spec.name)
            return None
        if state == PROBE:  # the cool-down is over: this call sends the health check that closes the circuit
            self._send_health_check(spec)
            hint = "a health check of the tool was sent just now: retry in a few seconds; or use another tool"
        else:
            hint = (f"retry in about {self.settings.breaker_cooldown_s:g} s, once a health check has passed; "
                    "or use another tool")
        return ToolResult.failure(
            call_id, spec.name, ErrorCode.TOOL_UNAVAILABLE,
            f"the circuit of {spec.name!r} is open after {self.settings.breaker_failures} failures in a row; "
            "it did not run",
            hint,
        )

    def served_tools(self, *, fresh: bool = False) -> set[str]:
        """Names of the tools some live worker serves."""
        with self._lock:
            if fresh or time.monotonic() - self._served_at > CATALOG_CACHE_S:
                entries = live_catalog(self.settings, self.redis)
                kid = signing_key_id(self.settings)  # a worker of another fleet key drops our calls
                usable = [entry for entry in entries if accepts(entry, kid)]
                self._served = {tool["name"] for entry in usable for tool in readable_tools(entry)}
                self._other_key = {}
                for entry in entries:
                    if not accepts(entry, kid):
                        for tool in readable_tools(entry):
                            self._other_key.setdefault(tool["name"], []).append(str(entry.get("worker")))
                self._say_shared_with_other_keys()
                self._conflicts = version_conflicts(entries)
                self._served_at = time.monotonic()
                self._ever_served |= self._served
            return set(self._served)

    def shared_with_other_keys(self) -> dict[str, list[str]]:
        """Tools this dispatcher's calls are sent for whose queues a live worker of another fleet key
        also takes from: ``{tool: [worker, ...]}``. Such a worker drops, unrun, each call it takes;
        the call is sent again once the watchdog sees it lost (seconds later), so a turn runs slowly
        or its calls end ``NOT_EXECUTED`` at the caller's timeout. (Tools only such workers serve
        are refused at once instead, :meth:`refusal`.)"""
        self.served_tools()
        with self._lock:
            return {tool: sorted(workers) for tool, workers in self._other_key.items() if tool in self._served}

    def _say_shared_with_other_keys(self) -> None:
        """Log once per worker that shares a served tool's queue and holds another key (lock held),
        naming every such tool of it (a newcomer's find: the one named was the first shared, often a
        built-in tool the batch did not call, not the tool whose calls were slow)."""
        shared: dict[str, set[str]] = {}
        for tool, workers in self._other_key.items():
            for worker in workers:
                if tool in self._served and worker not in self._warned_other_key:
                    shared.setdefault(worker, set()).add(tool)
        for worker, tools in shared.items():
            self._warned_other_key.add(worker)
            listed = sorted(tools)
            named = ", ".join(listed[:8]) + (f" and {len(listed) - 8} more" if len(listed) > 8 else "")
            log.warning("live worker %s of namespace %r holds another fleet key and takes from the queues "
                        "of tools this dispatcher sends (%s): it drops each call it takes, which is sent "
                        "again seconds later; restart it with the fleet's key (docs/signing.md)",
                        worker, self.settings.namespace, named)

    def ever_served(self, name: str) -> bool:
        """Whether this dispatcher has seen a live worker serve ``name`` (then a missing catalog
        may be a heartbeat Redis could not take during a blip: :class:`Sender` waits a little)."""
        with self._lock:
            return name in self._ever_served

    def worker_dead(self, worker: str) -> bool:
        """True once ``worker``'s catalog has been missing for ``DEAD_CONFIRM_S``."""
        now = time.monotonic()
        with self._lock:
            checked = self._alive.get(worker)
            if checked is None or now - checked[0] > LIVENESS_CACHE_S:
                present = bool(self.redis.exists(self.keys.catalog(worker)))
                self._alive[worker] = checked = (now, present)
            if checked[1]:
                self._missing_since.pop(worker, None)
                return False
            since = self._missing_since.setdefault(worker, now)
            return now - since >= DEAD_CONFIRM_S

    def unserved_for_s(self, tool: str) -> float:
        """How long (s) no live worker has served ``tool``, as this dispatcher saw it (0 while one
        does). Reads the catalog at most every ``LIVENESS_CACHE_S``."""
        with self._lock:
            stale = time.monotonic() - self._served_at > LIVENESS_CACHE_S
        served = tool in self.served_tools(fresh=stale)
        now = time.monotonic()
        with self._lock:
            if served:
                self._unserved_since.pop(tool, None)
                return 0.0
            return now - self._unserved_since.setdefault(tool, now)

    def unserved_confirm_s(self) -> float:
        return UNSERVED_CONFIRM_BEATS * self.settings.heartbeat_s

    def message_queued(self, queue: str, task_id: str) -> bool | None:
        """Whether a message of ``task_id`` waits in ``queue`` (any priority step): ``None`` when
        the broker is not Redis (RabbitMQ redelivers a lost consumer's messages itself)."""
        if not self.settings.broker_is_redis:
            return None
        if self._broker_client is None:
            self._broker_client = (self.redis if self.settings.broker == self.settings.ledger
                                   else redis.Redis.from_url(self.settings.broker, socket_connect_timeout=3))
        keys = [queue if pri == 0 else f"{queue}{KOMBU_PRIORITY_SEP}{pri}" for pri in KOMBU_PRIORITY_STEPS]
        script = self._queued_script if self._broker_client is self.redis else \
            self._broker_client.register_script(_QUEUED)
        return bool(script(keys=keys, args=[f'"{task_id}"']))

    def dropped_unsigned(self) -> int:
        """How many call messages workers of this namespace dropped unrun so far for failing the
        fleet signature check (``<ns>:security:dropped`` ``total``, worker/authenticity.py): a
        worker of another fleet key takes them from the shared queues. 0 when Redis does not say."""
        try:
            return int(self.redis.hget(self.keys.security_dropped, "total") or 0)
        except (redis.RedisError, ValueError):
            return 0

    def report_lost(self, tool: str) -> None:
        """The dispatcher declared a call of ``tool`` lost: that counts against its breaker."""
        try:
            self.breakers.observe(tool, ok=False)
        except redis.RedisError as exc:
            log.warning("could not update the circuit breaker of %s (%s)", tool, exc)

    def _is_served(self, name: str) -> bool:
        return name in self.served_tools() or name in self.served_tools(fresh=True)

    def _send_health_check(self, spec: ToolSpec) -> None:
        try:
            queue, task_id = self.keys.queue(spec.queue), uuid.uuid4().hex
            keys = self.settings.fleet_keys
            auth = None if keys is None else signed_fields(keys, task=HEALTH_TASK_NAME, task_id=task_id, queue=queue,
                                                           fields={"tool": spec.name}, ttl_s=HEALTH_CHECK_TTL_S)
            self.app.send_task(HEALTH_TASK_NAME, kwargs={"tool": spec.name, "auth": auth}, queue=queue,
                               task_id=task_id, shadow=f"health.{spec.name}", retry=False, ignore_result=True)
        except Exception as exc:  # the breaker re-probes after its cooldown
            log.warning("could not send the health check of %s (%s)", spec.name, exc)
