"""Sending a turn's calls: what must hold before a call goes to a worker, and after broker trouble.

- **Locks across turns** (:mod:`.locks`): a turn that writes takes the locks of all its write
  resources at once before sending any write; while another turn holds one, its writes wait (reads
  go ahead). After ``lock_wait_s`` the waiting writes get ``TOOL_UNAVAILABLE``. A turn that takes
  calls as they come (a stream) adds the resources of each new write to its set and takes them
  then, keeping those it holds; two such turns that reach for each other's resources in opposite
  orders wait until ``lock_wait_s``.
- **Availability** (:mod:`.availability`): a call no live worker serves, or whose tool's circuit
  is open, gets ``TOOL_UNAVAILABLE`` instead of being sent.
- **Broker trouble**: a call that cannot be sent is retried every tick (the driver backs off while
  Redis fails) for ``SEND_RETRY_S``, then gets ``NOT_EXECUTED`` naming the broker URL (issue 11:
  a call never sent is sent when the broker is back, or ``NOT_EXECUTED``). A batch submitted at
  once is not retried: it goes all or none (:meth:`toolfleet.Dispatcher.submit`, with the
  ledger's arming).
- **Blips**: a tool this dispatcher saw served that is missing from the catalog is waited for
  (its calls queued) for ``unserved_grace_s`` (three heartbeats + 1 s) before its calls get
  ``TOOL_UNAVAILABLE``: a worker whose heartbeats Redis could not take during a restart or pause
  is alive. Before each group is sent, a turn Redis lost (a restart without its data) is
  restored and settled first, so only calls sent into the old Redis count as lost with it.
- **Redis came back** (:meth:`Sender.reconcile`): the turn is restored in the ledger; if Redis lost
  its data, calls that were queued and never started will never be delivered and get
  ``TOOL_UNAVAILABLE`` (atomically "unless started", so a call a worker just took keeps running).
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import redis

from ..breaker import closed_state
from ..errors import BrokerUnavailable
from ..ledger import not_executed
from ..models import ErrorCode, ToolResult
from .availability import NO_LIVE_WORKER
from .turn_locks import TurnLocks

if TYPE_CHECKING:
    from .turn import Turn

log = logging.getLogger(__name__)
SEND_RETRY_S = 30.0
ALIVE_CHECK_S = 1.0


def unserved_grace_s(settings: Any) -> float:
    """How long a tool a worker served before may be missing from the catalog before its calls get
    ``TOOL_UNAVAILABLE``: three heartbeats (the catalog's expiry) + 1 s."""
    return 3 * settings.heartbeat_s + 1.0


class Sender:
    """The sending half of one :class:`Turn` (runs in the caller's thread at start, then in the
    turn's driver thread)."""

    def __init__(self, turn: Turn, availability: Any, locks: Any) -> None:
        self.turn = turn
        self.availability = availability
        self.sent_at: dict[str, float] = {}  # call id -> monotonic time of its latest send
        self.resends: dict[str, int] = {}  # call id -> times sent again after its worker died
        self._to_send: list[str] = []  # ready, not sent yet (waiting for locks or the broker)
        self._resend_queued: set[str] = set()  # of those, sends again (its worker went silent): retried as such
        self._send_failed_at: dict[str, float] = {}
        self.lock = TurnLocks(turn, locks, self.sent_at)  # the turn's locks across turns
        self._checked_at = time.monotonic()
        self._unserved_since: dict[str, float] = {}  # tool -> when a send found no live worker

    # ---- sending ----
    def submit(self, call_id: str, raise_errors: bool = False, resend: bool = False) -> None:
        """Send one call now, or queue it (locks, broker trouble), or record why it cannot run."""
        self.send_group([call_id], raise_errors=raise_errors, resend=resend)

    def send_group(self, call_ids: list[str], *, raise_errors: bool = False, resend: bool = False,
                   announce: bool = False) -> None:
        """Send ``call_ids`` together (one broker round trip; on a Redis broker all of them reach
        their queues or none does), after the checks of :meth:`submit`, the heads of the longest
        chains first (model order among equals): a call's rank in the plan is its message
        priority, and the sending order decides who goes first when idle workers take each message
        the moment it arrives. If the broker refuses, every one of them is queued for a retry (or,
        with ``raise_errors``, the :class:`BrokerUnavailable` is raised and none was sent).
        ``announce``: write the group's ``submitted`` audit entry first (with the checks' reads)."""
        turn = self.turn
        armed, closed = self._first_reads(call_ids, announce, resend)
        try:
            self._settle_if_redis_lost(armed)
            with self.group(closed):
                sendable = [c for c in call_ids if self._may_send(c, resend)]
        except (BrokerUnavailable, redis.RedisError) as exc:
            # Redis failed while checking (availability, locks): nothing was sent; every call
            # not settled yet is queued for the next tick, never dropped (a dropped call would
            # leave its turn waiting for a result that cannot come)
            if raise_errors:
                raise BrokerUnavailable(turn._settings.redis_url, str(exc)) from exc
            for call_id in call_ids:
                if call_id not in turn._finished:
                    self._queue(call_id, resend)
            return
        if not sendable:
            return
        ranks = turn.ranks(sendable)
        if len(sendable) > 1:
            order = {c.id: i for i, c in enumerate(turn._calls)}
            sendable.sort(key=lambda c: (-ranks[c], order[c]))
        sent: list[tuple[str, str]] = []
        together = turn._submitter.batch(len(sendable)) if len(sendable) > 1 else nullcontext()
        try:
            with together:
                for call_id in sendable:
                    run = turn._runnable[call_id]
                    sent.append((call_id, turn._submitter.send(
                        turn_id=turn.turn_id, call_id=call_id, spec=run.spec, arguments=run.arguments,
                        workspace=turn._workspace, session_id=turn._session_id, rank=ranks[call_id], shown=run.shown,
                        headers=None if turn._obs is None else turn._obs.sent(call_id, run.spec.name),
                    )))
        except (BrokerUnavailable, redis.RedisError) as exc:  # a Redis error: the audit's `submitted`
            if not isinstance(exc, BrokerUnavailable):
                exc = BrokerUnavailable(turn._settings.redis_url, str(exc))
            if raise_errors:
                raise exc from None
            for call_id in sendable:
                self._send_failed(call_id, exc, resend)
            return
        now = time.monotonic()
        with turn._lock:
            for call_id, tid in sent:
                self._send_failed_at.pop(call_id, None)
                turn._submitted[call_id] = tid
                self.sent_at[call_id] = now

    def _may_send(self, call_id: str, resend: bool) -> bool:
        """Whether ``call_id`` goes to the broker now; if not, it is queued (waiting for the turn's
        write locks) or its ``TOOL_UNAVAILABLE`` result is recorded."""
        turn = self.turn
        run = turn._runnable[call_id]
        lock = self.lock
        if run.spec.access == "write" and lock.locks is not None:
            if not resend and lock.held:
                lock.renew(for_call=call_id)  # its lease covers this write's hard limit before it goes
            if lock.lost_to:  # the lease lapsed and another turn took the locks
                self._record(call_id, lock.not_sent_again(call_id) if resend else lock.not_executed(call_id))
                return False
            if not lock.held and not resend:
                if lock.gave_up:
                    self._record(call_id, ToolResult.failure(
                        call_id, run.spec.name, ErrorCode.TOOL_UNAVAILABLE,
                        f"another turn ({lock.holder}) kept writing the same resources for longer than "
                        f"{turn._settings.lock_wait_s:g} s; this call did not run",
                        "ask again once the other turn is done"))
                else:
                    self._queue(call_id)
                return False
        if self.availability is not None and not resend:
            refusal = self.availability.refusal(run.spec, call_id)
            if refusal is not None:
                if refusal.error is not None and refusal.error.message.startswith(NO_LIVE_WORKER) \
                        and self._worker_may_be_back(run.spec.name):
                    self._queue(call_id)
                else:
                    self._record(call_id, refusal)
                return False
            self._unserved_since.pop(run.spec.name, None)
        return True

    def _worker_may_be_back(self, tool: str) -> bool:
        """The catalog shows no live worker for ``tool``, but this dispatcher saw one serve it: a
        worker whose heartbeats Redis could not take during a blip (a restart, a pause) looks like
        this until its next heartbeat. Wait (the call is queued) until the tool has been missing
        for ``unserved_grace_s`` (three heartbeats + 1 s, the catalog's own expiry + a beat)."""
        availability = self.availability
        settings = self.turn._settings
        if tool in availability.served_tools(fresh=True):
            return True  # its heartbeat came back just now: send it next tick
        if not availability.ever_served(tool):
            return False  # never seen served: TOOL_UNAVAILABLE at once
        since = self._unserved_since.setdefault(tool, time.monotonic())
        return time.monotonic() - since < unserved_grace_s(settings)

    def _send_failed(self, call_id: str, exc: BrokerUnavailable, resend: bool = False) -> None:
        """The broker refused ``call_id``: retry it every tick for ``SEND_RETRY_S``, then give up.
        A send again (``resend``) is retried as one; given up, it is answered as its worker's loss
        (``WORKER_LOST``, ``OUTCOME_UNKNOWN`` for a journaled write), never "it did not run": the
        first execution may have acted before its worker went silent."""
        first = self._send_failed_at.setdefault(call_id, time.monotonic())
        if time.monotonic() - first < SEND_RETRY_S:
            self._queue(call_id, resend)
            return
        if resend or self.resends.get(call_id):
            self._lost_resend(call_id, exc)
            return
        # "it did not run" only where the ledger confirms no claim began it (one atomic step): a
        # publish whose reply was lost may have reached the queue, and a worker may be running it
        turn = self.turn
        if not turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, turn._runnable[call_id].spec.name, ErrorCode.NOT_EXECUTED,
            f"{exc} The broker refused the call for {SEND_RETRY_S:g} s; it was not sent and did not run.",
            "retry when the broker is back"), unless_started=True):
            log.warning("turn %s: call %s, whose sends the broker refused, was started by a worker all the same (a "
                        "send whose reply was lost reached its queue); its execution answers it", turn.turn_id,
                        call_id)

    def _lost_resend(self, call_id: str, exc: BrokerUnavailable) -> None:
        """A call sent again after its worker went silent mid-run, that the broker would not take:
        its first execution may have acted (and may still, until its deadline: the turn's locks are
        held that long)."""
        turn = self.turn
        spec = turn._runnable[call_id].spec
        code = ErrorCode.OUTCOME_UNKNOWN if spec.journal and not spec.idempotent else ErrorCode.WORKER_LOST
        kept = turn._ledger.record_result(turn.turn_id, ToolResult.failure(
            call_id, spec.name, code,
            f"its worker went silent while it ran, and sending it again failed for {SEND_RETRY_S:g} s ({exc}); "
            "whether the first execution took effect is unknown",
            "check the real state before repeating it"))
        if kept:
            turn._watch._hold_locks(turn._watch._hard_s(call_id) + turn._settings.clock_skew_margin_s)
            turn._watch._failed_in_flower(call_id, code)

    def pump(self) -> None:
        """Each tick: retry the locks and the queued calls, renew the held locks."""
        turn = self.turn
        if turn._cancelled_at is not None:
            return
        now = time.monotonic()
        self.lock.renew()
        with turn._lock:
            pending = [c for c in self._to_send if c not in turn._finished]
            resends = [c for c in pending if c in self._resend_queued]
            self._to_send.clear()
            self._resend_queued.clear()
        if resends:  # sent again as such: no availability or lock wait, answered as a loss if never sent
            self.send_group(resends, resend=True)
            pending = [c for c in pending if c not in resends]
        if not pending:
            return
        lock = self.lock
        if not lock.held and not lock.take() and not lock.lost_to:
            if now - lock.asked_at > turn._settings.lock_wait_s:
                lock.gave_up = True
        self.send_group(pending)

    def group(self, closed: frozenset[str] | set[str] = frozenset()) -> AbstractContextManager[None]:
        """Calls sent together: each tool's availability is read once for all of them (``closed``:
        tools whose breaker :meth:`_first_reads` found closed)."""
        return self.availability.group(closed) if self.availability is not None else nullcontext()

    def _first_reads(self, call_ids: list[str], announce: bool, resend: bool) -> tuple[bool | None, set[str]]:
        """One round trip to the ledger's Redis before a group is sent, instead of up to three on
        the path from a result to the next call's send: the group's ``submitted`` audit entry (with
        ``announce``; it precedes the workers' ``started``), whether the turn is still armed
        (:meth:`_settle_if_redis_lost`), and the breaker state of each of its tools. Returns
        (armed: ``None`` if not read, the tools found closed). On any Redis error the checks read
        for themselves, as they would without this (a failed audit write is logged)."""
        turn = self.turn
        calls = [(c, turn._runnable[c].spec) for c in call_ids] if announce else []
        check_armed = turn.armed and not turn._abandoned
        tools = sorted({turn._runnable[c].spec.name for c in call_ids}) \
            if self.availability is not None and not resend else []
        if not check_armed and not tools:
            if calls:
                turn._submitter.announce(turn.turn_id, calls)
            return None, set()
        pipe = turn._ledger.redis.pipeline(transaction=False)
        audited = turn._submitter.announce(turn.turn_id, calls, pipe=pipe)
        if check_armed:
            pipe.exists(turn._ledger.keys.turn_armed(turn.turn_id))
        for tool in tools:
            self.availability.breakers.read_state(pipe, tool)
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError:
            # the audit entry may not be written (a cluster gives up on the whole pipeline when one
            # of its nodes fails, the turn's node too): it goes on its own, as before this round
            # trip was shared (at worst written twice, never lost to another key's node)
            if calls:
                turn._submitter.announce(turn.turn_id, calls)
            return None, set()
        if any(isinstance(r, Exception) for r in replies[:audited]):
            log.warning("audit: could not append the `submitted` entry of turn %s (%s)", turn.turn_id,
                        next(r for r in replies[:audited] if isinstance(r, Exception)))
        replies = replies[audited:]
        armed = None
        if check_armed:
            reply = replies.pop(0)
            armed = None if isinstance(reply, Exception) else bool(reply)
        return armed, {tool for tool, reply in zip(tools, replies, strict=True) if closed_state(reply)}

    def redis_lost_the_turn(self) -> bool:
        """Once a second: is the turn still in Redis? (redis-py reconnects by itself, so a restart
        of Redis without its data may raise no error here at all.)"""
        now = time.monotonic()
        if now - self._checked_at < ALIVE_CHECK_S or not self.turn.armed:
            return False
        self._checked_at = now
        return not self.turn._ledger.redis.exists(self.turn._ledger.keys.turn_armed(self.turn.turn_id))

    def _settle_if_redis_lost(self, armed: bool | None = None) -> None:
        """Right before sending: if Redis lost the turn (restarted without its data), restore it
        and settle the calls lost with the old queues first, so a call sent now into the new
        Redis is never taken for one of them. One EXISTS per group sent (``armed``: its reply,
        read by :meth:`_first_reads` with the group's other reads; ``None``: read it here)."""
        turn = self.turn
        if not turn.armed or turn._abandoned:
            return
        if armed is None:
            armed = bool(turn._ledger.redis.exists(turn._ledger.keys.turn_armed(turn.turn_id)))
        if not armed:
            self._checked_at = time.monotonic()
            self.reconcile()

    def reconcile(self) -> None:
        """Redis answers again after trouble: restore the turn, and settle what Redis lost."""
        turn = self.turn
        with turn._lock:
            results = list(turn._results.values())
            queued = [c for c in self.sent_at if c not in turn._started and c not in turn._finished]
        if turn._abandoned:
            return
        lost = turn._ledger.reopen(turn.turn_id, turn._names, results, armed=turn.armed)
        turn._ledger.renew_lease(turn.turn_id)
        self.lock.renew(due_only=False)
        if not lost:
            return
        log.warning("turn %s: Redis lost its data (restarted without persistence)", turn.turn_id)
        if turn.cancelled:  # the cancel went with the data: the turn is cancelled there again, and the
            # calls this dispatcher never sent are answered now (what was sent waits for the watchdog)
            turn._ledger.restore_cancel(turn.turn_id, turn._cancel_reason or "cancelled (Redis lost its data)")
            with turn._lock:
                unsent = [c for c in turn._names if c not in turn._results and c not in turn._submitted]
            for call_id in unsent:
                turn._ledger.record_result(turn.turn_id, not_executed(call_id, turn._names[call_id]),
                                           unless_started=True)
        for call_id in queued:
            turn._ledger.record_result(turn.turn_id, ToolResult.failure(
                call_id, turn._names[call_id], ErrorCode.TOOL_UNAVAILABLE,
                "Redis restarted without its data while the call waited in the queue; it never started",
                "ask again: nothing happened", attempts=0), unless_started=True)

    def _queue(self, call_id: str, resend: bool = False) -> None:
        with self.turn._lock:
            if call_id not in self._to_send:
                self._to_send.append(call_id)
            if resend:
                self._resend_queued.add(call_id)

    def _record(self, call_id: str, result: ToolResult) -> None:
        self.turn._ledger.record_result(self.turn.turn_id, result)
