"""The idempotency journal (docs/design.md, "Side effects").

A side-effecting tool that is not idempotent has every execution journaled in Redis under its
idempotency key (default: turn id + call id; or the key the tool derives from its arguments, so a
retry in a later turn is recognised too). One hash per key, ``<ns>:journal:<tool>:<key>``::

    state        started | done
    token        the execution that holds it (one per attempt)
    owner        turn_id:call_id of that execution
    lease_until  ms (Redis clock) until which the holder is presumed alive; renewed every
                 heartbeat while the handler runs, cleared when it stops without an outcome
    deadline     ms (Redis clock) after which the holder can no longer act: its claim's hard time
                 limit (a holder checks it at its last moment, ``ToolContext.check_fence``)
    released     1 once the holder's end is confirmed (it stopped itself, or the worker that saw
                 its process die released it)
    result       ToolResult JSON once done
    executions   how many times a handler was entered for this key

``begin`` decides atomically (one Lua script) what an execution may do:

- ``new``: never started: run the handler (its entry is counted in the same step).
- ``done``: finished before: replay the recorded result, do not run.
- ``busy``: another live execution holds the key: wait for its outcome (then replay).
- ``takeover``: started before, and its holder can no longer act, without an outcome: its end was
  confirmed (released), or its lease lapsed *and* its deadline plus ``clock_skew_margin_s`` has
  passed. A holder whose lease lapsed but whose deadline has not passed may only be frozen (a
  stopped process, a long pause, a partition): that is ``busy``, never a takeover. Then ask the
  tool's probe, else ``OUTCOME_UNKNOWN``.

Tokens are fencing tokens: the execution's ledger claim token (monotonic per namespace), so a
stale holder's ``finish`` is refused (``finish`` returns ``None``) and ``check_fence`` tells a
handler at its last moment whether it still holds the key. So a handler never runs twice for one
key: a holder acts only before its deadline, a takeover happens only after it (assumption: the
step between a holder's last ``check_fence`` and its effect takes less than the margin).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..keys import FENCE, Keys, run_field
from ..models import ToolResult
from ..settings import Settings

_BEGIN = """
-- KEYS: entry ; ARGV: token, owner, lease_ms, ttl_s, hard_limit_ms, margin_ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then return {'done', redis.call('HGET', KEYS[1], 'result') or ''} end
if state == 'started' then
  local lease = tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0')
  local deadline = tonumber(redis.call('HGET', KEYS[1], 'deadline') or '0')
  local released = redis.call('HGET', KEYS[1], 'released') == '1'
  if lease > now or (not released and now < deadline + tonumber(ARGV[6])) then
    return {'busy', redis.call('HGET', KEYS[1], 'owner') or ''}
  end
end
local before = redis.call('HGET', KEYS[1], 'owner') or ''
redis.call('HSET', KEYS[1], 'state', 'started', 'token', ARGV[1], 'owner', ARGV[2],
  'lease_until', now + tonumber(ARGV[3]), 'deadline', now + tonumber(ARGV[5]), 'released', '0')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
if state == 'started' then return {'takeover', before} end
redis.call('HINCRBY', KEYS[1], 'executions', 1)  -- the caller enters the handler at once
return {'new', ''}
"""

_ENTER = """
-- KEYS: entry ; ARGV: token
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
return redis.call('HINCRBY', KEYS[1], 'executions', 1)
"""

_RENEW = """
-- KEYS: entry ; ARGV: token, lease_ms
if redis.call('HGET', KEYS[1], 'state') ~= 'started' then return 0 end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- a holder past its deadline (it was frozen) can no longer act: it renews nothing
if now >= tonumber(redis.call('HGET', KEYS[1], 'deadline') or '0') and redis.call('HEXISTS', KEYS[1], 'deadline') == 1
  and tonumber(redis.call('HGET', KEYS[1], 'deadline')) > 0 then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
return 1
"""

_FINISH = """
-- KEYS: entry[, ledger runs (field f:<call_id>: the fence), ledger results]
-- ARGV: result_json, ttl_s, token ('' = unfenced)[, call_id]
if redis.call('HGET', KEYS[1], 'state') == 'done' then return {0, redis.call('HGET', KEYS[1], 'result')} end
local holder = redis.call('HGET', KEYS[1], 'token')  -- false: the entry was lost with Redis's data
if ARGV[3] ~= '' and holder and holder ~= ARGV[3] then return {-1, ''} end
if #KEYS >= 3 then
  -- the caller's answer is final: an execution whose call was answered by someone else (or
  -- claimed again) does not record its outcome as the key's
  local f = redis.call('HGET', KEYS[2], 'f:' .. ARGV[4])
  if f and string.match(f, '^(%d+)') ~= ARGV[3] then return {-1, ''} end
  if redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1 then return {-1, ''} end
end
redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[1], 'lease_until', 0)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {1, ARGV[1]}
"""

_RELEASE = """
-- KEYS: entry ; ARGV: field (token|owner), value[, a token whose entry stays held]
if redis.call('HGET', KEYS[1], 'state') ~= 'started' then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[3] and redis.call('HGET', KEYS[1], 'token') == ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', 0, 'released', '1')
return 1
"""


@dataclass(frozen=True)
class Begun:
    """What ``begin`` decided: ``verdict`` (new/done/busy/takeover), the recorded result when
    done, the previous holder (turn_id:call_id) when busy or taken over."""

    verdict: str
    result: ToolResult | None = None
    holder: str = ""


class Journal:
    """The journal of one namespace, for one process (not shared across ``fork``)."""

    def __init__(self, settings: Settings, client: redis.Redis,
                 retrying: Callable[[Callable[[], Any]], Any] | None = None) -> None:
        self.settings = settings
        self._retrying = retrying or (lambda op: op())
        self.keys = Keys(settings.namespace)
        self.redis = client
        self.cluster = isinstance(client, RedisCluster)  # ledger_url redis+cluster://
        self.lease_ms = int(settings.heartbeat_s * 3 * 1000)
        self.margin_ms = int(settings.clock_skew_margin_s * 1000)
        self._begin = client.register_script(_BEGIN)
        self._enter = client.register_script(_ENTER)
        self._renew = client.register_script(_RENEW)
        self._finish = client.register_script(_FINISH)
        self._release = client.register_script(_RELEASE)

    def key(self, tool: str, idempotency_key: str) -> str:
        return self.keys.journal(tool, idempotency_key)

    def begin(self, key: str, token: str, owner: str, hard_limit_s: float = 0.0) -> Begun:
        """Decide what the execution ``token`` (``owner`` = turn_id:call_id) may do (see the module
        text); ``hard_limit_s``: how long from now it may still act (its claim's deadline)."""
        args = [token, owner, self.lease_ms, self.settings.journal_ttl_s, int(hard_limit_s * 1000), self.margin_ms]
        verdict, payload = self._retrying(lambda: self._begin(keys=[key], args=args))
        verdict = _s(verdict)
        if verdict == "done":
            return Begun("done", ToolResult.model_validate_json(payload))
        return Begun(verdict, holder=_s(payload))

    def enter(self, key: str, token: str) -> int:
        """Count one entry into the handler after a ``takeover`` (``new`` counts its own); returns
        the count (0 if ``token`` lost the key)."""
        return int(self._retrying(lambda: self._enter(keys=[key], args=[token])))

    def renew(self, key: str, token: str) -> bool:
        return bool(self._renew(keys=[key], args=[token, self.lease_ms]))

    def finish(self, key: str, result: ToolResult, token: str = "",
               call: tuple[str, str] | None = None) -> ToolResult | None:
        """Record the outcome; the first outcome recorded wins and is returned. With ``token``:
        ``None`` (nothing recorded) when another execution holds the key (this one is stale), or,
        with ``call`` = (turn_id, call_id), when the ledger's latest claim of that call is not
        ``token``'s or the call already has its answer (the caller's answer is final)."""
        payload_in = result.model_dump_json(exclude_none=True)
        args = [payload_in, self.settings.journal_ttl_s, token]
        keys = [key]
        if call is not None and token and self.cluster:
            # on a Redis Cluster the journal entry and the turn are in different slots: the
            # ledger's side is checked first, in its own step (the entry's token check stays atomic)
            fence, answered = self._retrying(lambda: self._ledger_side(call[0], call[1]))
            if (fence is not None and _s(fence).split(" ")[0] != token) or answered:
                return None
        elif call is not None and token:
            keys += [self.keys.turn_runs(call[0]), self.keys.turn_results(call[0])]
            args.append(call[1])
        kept, payload = self._retrying(lambda: self._finish(keys=keys, args=args))
        if int(kept) < 0:
            return None
        return ToolResult.model_validate_json(payload)

    def _ledger_side(self, turn_id: str, call_id: str) -> list[Any]:
        pipe = self.redis.pipeline(transaction=True)  # both keys carry the turn's hash tag
        pipe.hget(self.keys.turn_runs(turn_id), run_field(FENCE, call_id))
        pipe.hexists(self.keys.turn_results(turn_id), call_id)
        return pipe.execute()

    def release(self, key: str, token: str) -> bool:
        """The holder stopped without an outcome (cancelled, timed out, crashed): let the next
        execution take over at once (and probe) instead of waiting for the lease to lapse."""
        return bool(self._retrying(lambda: self._release(keys=[key], args=["token", token])))

    def release_owner(self, key: str, owner: str, keep_token: str | None = None) -> bool:
        """Same, by owner (turn_id:call_id), tried once: for the worker's main process, which saw
        the pool process running ``owner`` die and does not know its token. ``keep_token``: the
        token of the call's newest claim when another process made it: an execution of the same
        call (the same owner) that may hold the entry live, which stays held."""
        args = ["owner", owner] + ([keep_token] if keep_token else [])
        return bool(self._release(keys=[key], args=args))

    def entry(self, key: str) -> dict[str, str]:
        """The raw entry (for diagnostics and tests)."""
        return {_s(k): _s(v) for k, v in self.redis.hgetall(key).items()}

    def holding(self, key: str, token: str) -> Lease:
        """A context manager that renews ``token``'s lease every heartbeat while the block runs."""
        return Lease(self, key, token)

    def _renewer(self) -> _Renewer:
        """This process's lease renewer (one thread for every held lease, started on first use)."""
        renewer = getattr(self, "_lease_renewer", None)
        if renewer is None or renewer.pid != os.getpid():
            renewer = self._lease_renewer = _Renewer(self)
        return renewer


class Lease:
    """Holds a journal lease while the handler runs: the journal's renewer renews it every
    heartbeat (one thread per process for all held leases, not a thread per call)."""

    def __init__(self, journal: Journal, key: str, token: str) -> None:
        self._renewer = journal._renewer()
        self.key = key
        self.token = token
        self.released = False

    def __enter__(self) -> Lease:
        self._renewer.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._renewer.remove(self)


class _Renewer:
    """Renews the held leases of one journal every heartbeat, from one daemon thread (started when
    the first lease is held, in the process that holds it). A lease its renewal refuses (another
    execution holds the key) is no longer renewed; a Redis error is retried next beat."""

    def __init__(self, journal: Journal) -> None:
        self.pid = os.getpid()
        self._journal = journal
        self._held: dict[int, Lease] = {}
        self._lock = threading.Lock()  # guards _held and starting the thread
        self._renewing = threading.Lock()  # held while one lease is renewed
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._held[id(lease)] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="toolfleet-journal-lease", daemon=True)
                self._thread.start()

    def remove(self, lease: Lease) -> None:
        """No renewal of ``lease`` starts after this; one under way is waited for (at most 1 s)."""
        lease.released = True
        with self._lock:
            self._held.pop(id(lease), None)
        acquired = False
        try:  # released even if a soft time limit (SIGUSR1) lands right after the acquire
            acquired = self._renewing.acquire(timeout=1.0)
        finally:
            if acquired:
                self._renewing.release()

    def _run(self) -> None:
        every_s = self._journal.settings.heartbeat_s
        while True:
            time.sleep(every_s)
            with self._lock:
                held = list(self._held.values())
            for lease in held:
                with self._renewing:
                    if lease.released:
                        continue
                    try:
                        if not self._journal.renew(lease.key, lease.token):
                            lease.released = True
                    except redis.RedisError:
                        continue  # Redis away for a moment: try again next beat


def new_token() -> str:
    return uuid.uuid4().hex


def _s(value: object) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
