"""The tool catalog that each live worker publishes to Redis, with a heartbeat.

Key ``<ns>:catalog:<worker>`` holds JSON ``{"worker", "queues", "tools": [describe()...],
"sandbox", "key_ids", "heartbeat_at"}`` and expires after three missed heartbeats, so a dead worker's tools vanish
(while Redis refuses writes for memory, a heartbeat only renews its time to live).
Its name is also kept in the set ``<ns>:workers`` so readers find the catalogs without scanning
the key space (names whose catalog expired are dropped by the readers). As it starts, a worker also
records each tool it serves in the hash ``<ns>:tools:seen`` (kept :data:`TOOLS_SEEN_TTL_S` after the
last start), so a dispatcher knows a tool whose workers are all stopped: its calls get
``TOOL_UNAVAILABLE`` ("no live worker serves the tool"), as the result contract says, not
``UNKNOWN_TOOL``, which would tell the model the tool does not exist. Once a worker consumes, it
also pushes its name on ``<ns>:workers:ready`` (tests and ``toolfleet up`` wait on that list
instead of sleeping).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from ..keys import Keys
from ..observe.metrics import heartbeat
from ..redis_client import busy, client_for
from ..settings import Settings
from . import reaper
from .runtime import MAIN_SOCKET_TIMEOUT_S

TOOLS_SEEN_TTL_S = 7 * 24 * 3600  # how long the tools a worker served are known after its last start (s)


def catalog_entry(runtime: Any, worker: str) -> dict[str, Any]:
    """``sandbox``: what ``run_command`` runs in here, ``{"mode": "bwrap"|"none", "network"[, "error"]}``;
    ``key_ids``: the fleet key ids whose signatures it accepts (:func:`accepted_key_ids`)."""
    from ..tools import sandbox

    return {
        "worker": worker,
        "queues": [runtime.keys.queue(q) for q in runtime.registry.queues()],
        "tools": [spec.describe() for spec in runtime.registry],
        "sandbox": sandbox.current().describe(),
        "key_ids": accepted_key_ids(runtime.settings),
        "heartbeat_at": time.time(),
    }


def accepted_key_ids(settings: Settings) -> list[str] | None:
    """The key ids (docs/signing.md: fingerprints, not keys) of the fleet keys a worker of ``settings``
    accepts, current and previous; ``None`` when it runs unsigned messages (``insecure_no_signing``,
    which runs signed ones too); ``[]`` when it has no key (it drops everything)."""
    keys = settings.fleet_keys
    if keys is None:
        return None if settings.insecure_no_signing else []
    return keys.accepted_ids


def signing_key_id(settings: Settings) -> str | None:
    """The key id a dispatcher of ``settings`` signs call messages with; ``None`` when it sends them
    unsigned. Never raises (a bad key is reported where it is used)."""
    try:
        keys = settings.fleet_keys
    except ValueError:
        return None
    return keys.current_id if keys is not None else None


def accepts(entry: Any, key_id: str | None) -> bool:
    """Whether the worker of catalog ``entry`` runs messages signed with ``key_id`` (``None``: unsigned).
    A catalog without ``key_ids`` (a worker older than it) is taken to accept them."""
    if not isinstance(entry, dict) or "key_ids" not in entry:
        return True
    ids = entry["key_ids"]
    if ids is None:
        return True
    return key_id is not None and isinstance(ids, list) and key_id in ids


def key_mismatch(entries: list[dict[str, Any]], key_id: str | None) -> list[str]:
    """Names of the live workers (catalog ``entries``) that would drop messages signed with ``key_id``:
    they hold another fleet key. Workers that share a namespace share its queues, so each drops the
    other's calls it takes."""
    return sorted(str(e.get("worker")) for e in entries if isinstance(e, dict) and not accepts(e, key_id))


def other_key_warning(workers: Iterable[str], namespace: str, remedy: str) -> str:
    """The warning (one line, no markup) that live ``workers`` of ``namespace`` hold another fleet
    key (:func:`key_mismatch`), ending with ``remedy``: what the one who reads it can do."""
    return (f"live worker(s) {', '.join(workers)} of namespace {namespace!r} hold another fleet key: each drops, "
            f"unrun, the calls of the other that it takes from the shared queues. {remedy}")


def connect_catalog(app: Celery, runtime: Any) -> None:
    """Publish the catalog of ``app``'s worker while it runs."""
    stop = threading.Event()
    published: dict[str, Any] = {}

    @worker_ready.connect(weak=False)
    def _ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        worker = sender.hostname
        # a read that a frozen Redis never answers fails (whatever redis-py's default), so neither the
        # heartbeat nor the worker's shutdown waits on it for ever
        client = client_for(runtime.settings.ledger, socket_connect_timeout=3, socket_timeout=MAIN_SOCKET_TIMEOUT_S)
        key = runtime.keys.catalog(worker)
        ttl_ms = int(runtime.settings.heartbeat_s * reaper.CATALOG_TTL_BEATS * 1000)

        def publish() -> None:
            sent_at = time.monotonic()
            pipe = client.pipeline()
            pipe.set(key, json.dumps(catalog_entry(runtime, worker)), px=ttl_ms)
            pipe.sadd(runtime.keys.workers, worker)
            pipe.execute()
            reaper.renew(sent_at, runtime.settings.heartbeat_s)  # the sandboxes' lease (worker/reaper.py)
            heartbeat(worker, time.time())  # observe/metrics.py (a no-op without --metrics-port)

        def beat() -> None:
            while not stop.is_set():
                try:
                    publish()
                except redis.RedisError as exc:  # Redis away: the key expires, the tools read as unavailable
                    if busy(exc):
                        keep_alive()
                stop.wait(runtime.settings.heartbeat_s)

        def keep_alive() -> None:
            """Redis refuses writes for now (out of memory at maxmemory...): the last catalog is kept
            alive with PEXPIRE, which Redis does not refuse for memory, so a live worker is not
            judged dead (its calls answered WORKER_LOST) while it waits Redis out with them."""
            try:
                sent_at = time.monotonic()
                if client.pexpire(key, ttl_ms):
                    reaper.renew(sent_at, runtime.settings.heartbeat_s)
            except redis.RedisError:
                pass

        publish()
        record_seen(client, runtime.keys, worker, catalog_entry(runtime, worker)["tools"])
        published.update(client=client, key=key)
        client.rpush(runtime.keys.workers_ready, worker)
        client.expire(runtime.keys.workers_ready, runtime.settings.result_ttl_s)
        threading.Thread(target=beat, name="toolfleet-catalog", daemon=True).start()

    @worker_shutdown.connect(weak=False)
    def _shutdown(sender: Any = None, **_: Any) -> None:
        stop.set()
        if published:
            try:
                published["client"].delete(published["key"])
            except redis.RedisError:
                pass


def record_seen(client: redis.Redis, keys: Keys, worker: str, tools: list[dict[str, Any]]) -> None:
    """Record that ``worker`` serves ``tools`` (their descriptions) in ``keys.tools_seen``; best
    effort (a Redis error is ignored: the tools are then known while the worker is live only)."""
    if not tools:
        return
    now = time.time()
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.hset(keys.tools_seen, mapping={t["name"]: json.dumps({"tool": t, "worker": worker, "at": now})
                                                for t in tools})
            pipe.expire(keys.tools_seen, TOOLS_SEEN_TTL_S)
            pipe.execute()
    except redis.RedisError:
        pass


def seen_tools(settings: Settings, client: redis.Redis | None = None) -> list[dict[str, Any]]:
    """The descriptions of every tool a worker of ``settings.namespace`` served in the last
    :data:`TOOLS_SEEN_TTL_S` (one round trip; records this version cannot read are skipped)."""
    client = client or client_for(settings.ledger)
    found = []
    for raw in client.hvals(Keys(settings.namespace).tools_seen):
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # junk another process wrote: skipped
            continue
        tool = record.get("tool") if isinstance(record, dict) else None
        at = record.get("at") if isinstance(record, dict) else None
        fresh = isinstance(at, (int, float)) and time.time() - at < TOOLS_SEEN_TTL_S  # the hash's TTL is renewed
        if fresh and isinstance(tool, dict) and isinstance(tool.get("name"), str):  # by every start: each
            found.append(tool)  # record counts from its own
    return found


def live_catalog(settings: Settings, client: redis.Redis | None = None) -> list[dict[str, Any]]:
    """The catalogs of the live workers of ``settings.namespace``, by worker name (two round trips;
    names of workers whose catalog expired are removed from the set on the way)."""
    client = client or client_for(settings.ledger)
    keys = Keys(settings.namespace)
    names = sorted(_s(n) for n in client.smembers(keys.workers))
    if not names:
        return []
    entries, dead = [], []
    for name, raw in zip(names, mget(client, [keys.catalog(n) for n in names]), strict=True):
        if not raw:
            dead.append(name)
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):  # junk another process wrote: that worker's tools unread
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    if dead:
        client.srem(keys.workers, *dead)
    return entries


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mget(client: redis.Redis, keys: list[str]) -> list[Any]:
    """MGET of keys that may sit in different slots: on a Redis Cluster, redis-py's
    ``mget_nonatomic`` (one MGET per slot; these reads need no atomicity), else one MGET."""
    many = getattr(client, "mget_nonatomic", None)
    return many(keys) if many is not None else client.mget(keys)
