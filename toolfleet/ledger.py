"""The turn ledger in Redis: the one place that decides each call's single result.

Both sides write through it. Each operation is one Lua script (:mod:`toolfleet.ledger_scripts`), so it
is atomic against the others:

- ``claim_start`` (worker, before a handler runs): refuses when the turn is cancelled, over
  (``end_turn``) or abandoned by a dispatcher that vanished (its lease, renewed by
  ``renew_lease``, lapsed: Redis's clock), or when the call already has a result; waits while the
  turn is not *armed* (a batch submitted at once is armed only after every call that waits for
  nothing was sent, so a half-submitted batch never runs; a turn that takes calls as they come is
  armed when opened); otherwise marks the call started, counts the attempt and appends a
  ``started`` event.
- ``record_result`` (worker or dispatcher): stores the result only if the call has none yet
  (``HSETNX``) and appends a ``result`` event; a later result for the same call is dropped. This is
  what makes "exactly one result per call" hold even when a worker and the dispatcher's watchdog race.
- ``add_calls`` (dispatcher, a streamed turn): registers calls; if the turn is already cancelled,
  records ``NOT_EXECUTED`` for them in the same step, so a call added after a cancel cannot slip by.
- ``cancel`` (any process): flags the turn, records ``NOT_EXECUTED`` for every call not started,
  appends a ``cancel`` event and publishes on the turn's cancel channel for the workers.

The turn's redacted audit trail (:mod:`toolfleet.audit`) reads its ``started`` and ``finished``
entries from the ``started`` and ``result`` events these scripts append (one write per state change,
in the ledger's order); ``cancel`` appends ``cancelled`` to the audit stream right after its step.

Keys are listed in :mod:`toolfleet.keys`; all expire ``result_ttl_s`` after the last write (the
keys a step creates get their time to live in that step; every key of the turn gets it again on
each lease renewal and at ``end_turn``, so per-call steps renew none). Every
key of a turn carries the hash tag ``{<turn_id>}``, so on a Redis Cluster (``ledger_url``
``redis+cluster://``) a turn lives on one shard and each script stays in one slot; the few steps
that also touch a key shared across turns split off that part (:attr:`Ledger.cluster`;
docs/scaling.md).
The worker's claim and fencing steps are in :mod:`toolfleet.ledger_claims` (:class:`Ledger` inherits
them; ``Claim`` and ``ARM_WAIT_S`` are importable from here as before).
Redis errors reach callers as :class:`~toolfleet.errors.BrokerUnavailable`; a worker's ledger
retries them for ``retry_s`` (a Redis restart must not lose a result the handler produced).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster

from . import ledger_scripts as lua
from .audit import AuditLog
from .breaker import success_lua
from .errors import TurnExists, TurnNotFound
from .keys import Keys
from .ledger_claims import ARM_WAIT_S as ARM_WAIT_S  # re-exported: worker/side_effects.py
from .ledger_claims import Claim as Claim  # re-exported: claim_start's answer
from .ledger_claims import ClaimSteps
from .models import ErrorCode, ToolResult
from .redis_client import as_broker_error, busy, connect, read_only, unavailable
from .settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
TTL_SLACK = 0.01  # end_turn leaves a time to live set this share of result_ttl_s ago as it is
# the longest one XREAD of events blocks: under a client's read timeout (redis-py 8's default is 5 s;
# a blocked read past it fails as TimeoutError, a Redis that looks unreachable)
EVENTS_BLOCK_MAX_MS = 2000


@dataclass(frozen=True)
class LedgerEvent:
    """One entry of a turn's event stream: ``type`` is ``started``, ``result`` or ``cancel``."""

    stream_id: str
    type: str
    call_id: str
    data: str

    def result(self) -> ToolResult:
        return ToolResult.model_validate_json(self.data)


class Ledger(ClaimSteps):
    """Access to the turn ledger of one namespace. Safe to share between threads. The worker's
    steps (claims, fencing) are :class:`~toolfleet.ledger_claims.ClaimSteps`."""

    def __init__(self, settings: Settings, client: redis.Redis | None = None, *, retry_s: float = 0.0) -> None:
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.redis = client if client is not None else connect(settings.ledger)
        # on a Redis Cluster, keys shared across turns (the fence counter, a tool's breaker, a
        # journal entry) are in other slots than the turn's: the steps touching them are split
        self.cluster = isinstance(self.redis, RedisCluster)
        self.retry_s = retry_s
        self._record = self.redis.register_script(lua.RECORD)
        self._record_unstarted = self.redis.register_script(lua.RECORD_UNSTARTED)
        self._claim = self.redis.register_script(lua.CLAIM)
        self._open = self.redis.register_script(lua.OPEN)
        self._cancel = self.redis.register_script(lua.CANCEL)
        self._restore_cancel = self.redis.register_script(lua.RESTORE_CANCEL)
        self._add = self.redis.register_script(lua.ADD)
        self.audit = AuditLog(self.redis, self.keys, settings.result_ttl_s)
        self._reopen = self.redis.register_script(lua.REOPEN)
        self._check_fence = self.redis.register_script(lua.CHECK_FENCE)
        self._fence_dead = self.redis.register_script(lua.FENCE_DEAD)
        self._breaker_ok = self.redis.register_script(success_lua("KEYS[1]", "KEYS[2]"))

    def retrying(self, op: Callable[[], T]) -> T:
        """Run ``op``; while Redis is down or refusing writes for a while (``OOM``, ``READONLY``...:
        :func:`~toolfleet.redis_client.busy`), retry it for ``retry_s``, then raise
        :class:`BrokerUnavailable` (:class:`~toolfleet.errors.BrokerBusy` for the second). An ACL
        refusal raises :class:`~toolfleet.errors.BrokerRefused` at once; any other Redis error
        (a script's bug) is raised as it is."""
        deadline = time.monotonic() + self.retry_s
        pause_s = 0.05
        while True:
            try:
                return op()
            except (redis.RedisError, OSError) as exc:
                self._after_error(exc)
                # an ACL refusal (no outage) or a bug: at once; unreachable or busy (OOM, READONLY...): wait
                if not unavailable(exc) or time.monotonic() + pause_s > deadline:
                    raise as_broker_error(self.settings.ledger, exc) from exc
                log.warning("Redis %s (%s: %s); retrying for up to %.0f s", "busy" if busy(exc) else "unreachable",
                            type(exc).__name__, exc, deadline - time.monotonic())
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 1.0)

    def _after_error(self, exc: BaseException) -> None:
        """A ``READONLY`` reply: this Redis was demoted by a failover, and Redis keeps its clients
        connected; the next command connects again (the URL's name may point at the new master
        by then). Idle connections only: another thread's command is left to finish."""
        if read_only(exc) and not self.cluster:  # a cluster client follows its slots itself
            self.redis.connection_pool.disconnect(inuse_connections=False)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """:func:`~toolfleet.redis_client.translated` for this ledger's client, connecting again
        after a ``READONLY`` reply (:meth:`_after_error`)."""
        try:
            yield
        except (redis.RedisError, OSError) as exc:
            self._after_error(exc)
            raise as_broker_error(self.settings.ledger, exc) from exc

    # --- dispatcher side ---
    def open_turn(self, turn_id: str, calls: dict[str, str], *, armed: bool = True, exclusive: bool = False) -> str:
        """Register the calls (call_id -> tool name) of a new turn. ``armed=False`` for a turn
        whose first calls must all be sent before any runs: :meth:`arm` it once they are. Returns
        the stream id of the turn's ``open`` event, after which its driver reads (``0-0`` for a
        turn id that was opened before and still has results: read it all). ``exclusive``: raise
        :class:`TurnExists` (nothing written) if the turn id has calls registered already, in the
        same script: of processes opening one turn id at once, one does."""
        k = self.keys
        keys = [k.turn_calls(turn_id), k.turn_armed(turn_id), k.turn_lease(turn_id), k.turn_events(turn_id),
                k.turn_runs(turn_id), k.turn_results(turn_id)]
        args: list[Any] = [self.settings.result_ttl_s, int(self.settings.turn_lease_s * 1000), int(armed),
                           str(time.time()), int(exclusive)]
        for call_id, name in calls.items():
            args += [call_id, name]
        with self._translated():
            opened = self._open(keys=keys, args=args)
        if opened is None:
            raise TurnExists(f"turn {turn_id!r} was opened by another process")
        return _s(opened)

    def renew_lease(self, turn_id: str) -> None:
        """The turn's dispatcher is alive: its lease runs ``turn_lease_s`` from now (Redis's clock).
        Raises :class:`BrokerUnavailable` if Redis does not answer."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(k.turn_lease(turn_id), "1", px=int(self.settings.turn_lease_s * 1000))
        for key in self._turn_record(turn_id):  # per turn, not per call: kept alive while the turn lasts
            pipe.expire(key, self.settings.result_ttl_s)
        with self._translated():
            pipe.execute()

    def end_turn(self, turn_id: str, reason: str, *, ttl_set_s_ago: float = float("inf")) -> None:
        """The turn is over (all results in, cancelled, given up or abandoned): from now on a
        worker's claim refuses its calls, so nothing of it can run later. Idempotent. Raises
        :class:`BrokerUnavailable` if Redis does not answer (the lease then lapses by itself).

        The turn's record then lives ``result_ttl_s`` past its end: its keys' time to live is set
        again, unless the caller set it ``ttl_set_s_ago`` seconds ago (:meth:`open_turn`,
        :meth:`renew_lease`) and that is at most :data:`TTL_SLACK` of ``result_ttl_s``: the record
        then lives at least ``(1 - TTL_SLACK) * result_ttl_s`` past the end, four commands fewer
        (docs/guarantees.md, E7). The event stream and the results hash get it in any case: a
        claim's event and a worker's result re-create them without one where Redis lost them
        while the runs hash stayed (evicted)."""
        k = self.keys
        # a plain pipeline: each step holds alone (``ended`` first; the rest delete or renew)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(k.turn_ended(turn_id), reason, ex=self.settings.result_ttl_s, nx=True)
        pipe.delete(k.turn_lease(turn_id))
        renewed = (*self._turn_record(turn_id), k.turn_cancelled(turn_id))
        if 0 <= ttl_set_s_ago <= TTL_SLACK * self.settings.result_ttl_s:
            renewed = (k.turn_events(turn_id), k.turn_results(turn_id))  # what per-call steps may re-create
        for key in renewed:
            pipe.expire(key, self.settings.result_ttl_s)  # the turn's record lives result_ttl_s past its end
        with self._translated():
            pipe.execute()

    def _turn_record(self, turn_id: str) -> tuple[str, ...]:
        """The keys of a turn that per-call steps write without renewing their time to live."""
        k = self.keys
        return (k.turn_calls(turn_id), k.turn_runs(turn_id), k.turn_results(turn_id), k.turn_events(turn_id),
                k.turn_audit(turn_id))

    def arm(self, turn_id: str) -> None:
        """Confirm that every call of the turn's first group was sent: workers may run them now.
        Raises :class:`BrokerUnavailable` if Redis does not answer (the turn then never runs)."""
        k, ttl = self.keys, self.settings.result_ttl_s
        # a plain pipeline: the flag is what a claim reads; the event only wakes waiting workers
        # sooner (one that missed it claims again, reading the flag, when its wait ends: _wait_armed)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(k.turn_armed(turn_id), "1", ex=ttl)
        pipe.xadd(k.turn_events(turn_id), {"type": "armed", "call_id": "", "data": ""})
        with self._translated():
            pipe.execute()

    def reopen(self, turn_id: str, calls: dict[str, str], results: Sequence[ToolResult], *, armed: bool) -> bool:
        """After Redis came back: restore the turn's calls, its arming (only if the dispatcher had
        armed it) and the ``results`` the caller already holds (first result still wins). True when
        the turn had vanished (Redis lost its data)."""
        k = self.keys
        args: list[Any] = [self.settings.result_ttl_s, int(armed), len(calls)]
        for call_id, name in calls.items():
            args += [call_id, name]
        for result in results:
            args += [result.call_id, result.model_dump_json(exclude_none=True)]
        keys = [k.turn_calls(turn_id), k.turn_armed(turn_id), k.turn_results(turn_id), k.turn_events(turn_id),
                k.turn_runs(turn_id)]
        with self._translated():
            return bool(self._reopen(keys=keys, args=args))

    def add_calls(self, turn_id: str, calls: dict[str, str]) -> set[str]:
        """Register more calls (call_id -> tool name) of an open turn, atomically against
        ``cancel``: a call added before a cancel is marked ``NOT_EXECUTED`` by the cancel; one added
        after it is marked here. Returns the ids refused that way (the turn was cancelled)."""
        if not calls:
            return set()
        k = self.keys
        args: list[Any] = [self.settings.result_ttl_s]
        for call_id, name in calls.items():
            args += [call_id, name, not_executed(call_id, name).model_dump_json(exclude_none=True)]
        keys = [k.turn_calls(turn_id), k.turn_results(turn_id), k.turn_events(turn_id), k.turn_cancelled(turn_id),
                k.turn_runs(turn_id)]
        with self._translated():
            return {_s(cid) for cid in self._add(keys=keys, args=args)}

    def cancel(self, turn_id: str, reason: str = "cancelled by caller") -> int:
        """Cancel a turn from any process. Returns how many calls were marked ``NOT_EXECUTED``,
        or -1 if the turn was already cancelled. Raises :class:`TurnNotFound` for an unknown turn."""
        k = self.keys
        with self._translated():
            if not self.redis.exists(k.turn_calls(turn_id)) and not self.redis.exists(k.turn_events(turn_id)):
                raise TurnNotFound(f"no turn {turn_id!r} in namespace {k.ns!r}")
            keys = [
                k.turn_calls(turn_id),
                k.turn_runs(turn_id),
                k.turn_results(turn_id),
                k.turn_cancelled(turn_id),
                k.turn_events(turn_id),
                k.turn_audit(turn_id),
            ]
            reply = self._cancel(keys=keys, args=[reason, self.settings.result_ttl_s, k.cancel_channel(turn_id)])
            if not isinstance(reply, list):
                return int(reply)  # -1: already cancelled
            not_started = [_s(cid) for cid in reply]
            self.audit.append(turn_id, "cancelled", reason=reason, not_executed=not_started)
            return len(not_started)

    def restore_cancel(self, turn_id: str, reason: str) -> bool:
        """Cancel a turn again after Redis lost its data (:meth:`reopen` said so): its flag (claims
        refuse its calls), its cancel event and the workers' broadcast (running calls stop), but no
        call is marked ``NOT_EXECUTED`` here, since what had started went with the data; the turn's
        driver answers its calls (guarantee E13). True if the turn was not cancelled there yet."""
        k = self.keys
        with self._translated():
            return bool(self._restore_cancel(keys=[k.turn_cancelled(turn_id), k.turn_events(turn_id)],
                                             args=[reason, self.settings.result_ttl_s, k.cancel_channel(turn_id)]))

    def events(
        self, turn_id: str, after: str = "0-0", block_ms: int | None = 1000
    ) -> Iterator[LedgerEvent]:
        """Events after stream id ``after``, waiting up to ``block_ms`` for the first, at most
        :data:`EVENTS_BLOCK_MAX_MS` (none may come sooner: callers that wait longer read again;
        0, Redis's "for ever", waits that long too). ``None``: what is there, without waiting."""
        if block_ms is not None:
            block_ms = min(int(block_ms), EVENTS_BLOCK_MAX_MS) or EVENTS_BLOCK_MAX_MS
        key = self.keys.turn_events(turn_id)
        if self.cluster:  # sent to the stream's node: redis-py's cluster client would first ask a
            # node for the keys of an XREAD (COMMAND GETKEYS), one more round trip per read
            node = self.redis.get_node_from_key(key)
            reply = self.redis.execute_command("XREAD", "BLOCK", block_ms, "STREAMS", key, after, target_nodes=node)
        else:
            reply = self.redis.xread({key: after}, block=block_ms)
        for _stream, entries in reply or ():
            for stream_id, fields in entries:
                yield LedgerEvent(
                    stream_id=_s(stream_id),
                    type=_s(fields.get(b"type", b"")),
                    call_id=_s(fields.get(b"call_id", b"")),
                    data=_s(fields.get(b"data", b"")),
                )

    def results(self, turn_id: str) -> dict[str, ToolResult]:
        """Every result recorded so far, by call id."""
        raw = self.redis.hgetall(self.keys.turn_results(turn_id))
        return {_s(k): ToolResult.model_validate_json(v) for k, v in raw.items() if k != b""}  # '': OPEN's marker

    def calls(self, turn_id: str) -> dict[str, str]:
        """call_id -> tool name of a turn."""
        return {_s(k): _s(v) for k, v in self.redis.hgetall(self.keys.turn_calls(turn_id)).items()}

    # --- both sides ---
    def record_result(self, turn_id: str, result: ToolResult, *, unless_started: bool = False,
                      tool_worked: str | None = None, fencing_token: int | None = None) -> bool:
        """Store ``result`` unless its call already has one (or, with ``unless_started``, a worker
        already began it: for placeholders that say "it did not run"). True if this one was kept.
        ``tool_worked``: a tool whose circuit breaker (:mod:`toolfleet.breaker`) counts this call
        as one that worked, in the same script (a worker's report, whether or not the result is
        kept; a worker whose claim found no failures counted, :attr:`Claim.failures_seen`, passes
        none: a call that worked ends a run of failures counted before it began).
        ``fencing_token``: a worker's claim token; the result is then refused (False) when a newer
        execution holds the call or the call already has a result, and kept as a late note
        (:meth:`late_notes`) instead."""
        k = self.keys
        keys = [k.turn_results(turn_id), k.turn_events(turn_id), k.turn_audit(turn_id), k.turn_runs(turn_id)]
        payload = result.model_dump_json(exclude_none=True)
        audit = self.audit.finished_data(result)
        args = [result.call_id, payload, self.settings.result_ttl_s, audit]
        if not unless_started:
            keys.append(k.turn_late(turn_id))
            args.append("" if fencing_token is None else str(fencing_token))
            if tool_worked is not None and not self.cluster:
                keys += [k.breaker(tool_worked), k.breaker_failures(tool_worked)]
        script = self._record_unstarted if unless_started else self._record
        kept = bool(self.retrying(lambda: script(keys=keys, args=args)))
        if tool_worked is not None and not unless_started and self.cluster:  # its own slot
            self.retrying(lambda: self._breaker_ok(keys=[k.breaker(tool_worked), k.breaker_failures(tool_worked)]))
        return kept

    def record_failures(
        self, turn_id: str, failures: Sequence[ToolResult]
    ) -> None:
        for result in failures:
            self.record_result(turn_id, result)

    # --- worker side: claim_start, check_fence... in ledger_claims.py (ClaimSteps) ---
    def is_cancelled(self, turn_id: str) -> bool:
        return bool(self.redis.exists(self.keys.turn_cancelled(turn_id)))

    def cancel_reason(self, turn_id: str) -> str | None:
        """The reason the turn's first cancel gave (whoever sent it), or None if it was not cancelled
        (or its keys expired). Raises what redis-py raises."""
        reason = self.redis.get(self.keys.turn_cancelled(turn_id))
        return None if reason is None else _s(reason)


def not_executed(call_id: str, name: str) -> ToolResult:
    """The placeholder for a call the turn's cancel kept from starting."""
    return ToolResult.failure(
        call_id,
        name,
        ErrorCode.NOT_EXECUTED,
        "The turn was cancelled before this call started; it did not run.",
        "Nothing happened; ask again if the call is still wanted.",
    )


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
