"""A turn's side of the resource locks across turns (:mod:`.locks`): which locks it needs, taking
them, renewing their lease, and what it does once it has lost them.

- **Lease**: a turn holds its locks for ``lock_lease_s`` while none of its writes is in flight; while
  some are (sent, no result yet), for ``lock_lease_s`` + ``turn_lease_s`` + the longest hard limit
  among them + ``clock_skew_margin_s`` (:func:`.locks.lease_s`), set before such a write is sent. A
  dispatcher frozen (not dead) right after a renewal kept its turn's lease up to ``turn_lease_s``
  longer, so a worker may claim one of its writes until then and the write may act until its hard
  limit: the locks outlive every effect of a holder that stopped renewing them.
- **Renewal**: every ``lock_lease_s / 3`` from the driver's tick, before the turn's own lease is
  renewed, and before a write is sent when the lease it needs is longer than the one set. The
  locks already held are renewed while the turn waits for more (a stream's new write on another
  turn's path).
- **Lost**: a holder whose lease lapsed and whose locks another turn then removed is refused by
  every later acquire (:data:`.locks.LAPSED`). It sends no more writes: those sent and not started
  get ``NOT_EXECUTED`` (atomically unless a claim began them), later ones ``NOT_EXECUTED`` when they
  would be sent, and a write its watchdog would send again (its worker went silent) is answered
  ``WORKER_LOST`` (``OUTCOME_UNKNOWN`` for a journaled write) instead: the first execution may have
  acted.

Thread safety: the caller's thread (a stream's new calls) and the driver thread both get here; one
lock orders them.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ..models import ErrorCode, ToolResult
from .locks import LAPSED, lease_s, lock_names
from .submit import hard_limit_s

if TYPE_CHECKING:
    from .turn import Turn

log = logging.getLogger(__name__)


class TurnLocks:
    """The resource locks of one :class:`Turn` (``locks``: the namespace's
    :class:`~.locks.ResourceLocks`, or ``None``: no locks across turns)."""

    def __init__(self, turn: Turn, locks: Any, sent_at: dict[str, float]) -> None:
        self.turn = turn
        self.locks = locks
        self._sent_at = sent_at  # the sender's: call id -> when it was last sent
        self.names: frozenset[str] = frozenset()  # every lock the turn's writes need
        self._held_names: frozenset[str] = frozenset()  # those taken by the last acquire that succeeded
        self.held = True  # all of ``names`` held (nothing to hold yet)
        self.gave_up = False
        self.asked_at = time.monotonic()
        self.holder = ""  # the turn whose lock this one waits for
        self.lost_to = ""  # the turn that removed this one's lapsed locks: no more writes
        self._renewed_at = 0.0
        self._lease_s = 0.0  # the lease of the last acquire that succeeded
        self._released = False
        self._hold_until = 0.0  # monotonic: an execution the watchdog answered may act until then
        self._mu = threading.RLock()

    # ---- taking and renewing ----
    def note_writes(self, resources: frozenset[str]) -> None:
        """A write on ``resources`` was taken: its locks join the turn's set (taken by :meth:`take`)."""
        if self.locks is None:
            return
        names = lock_names(self.turn._workspace, resources)
        with self._mu:
            if not names <= self.names:
                self.names |= names
                self.held = False
                self.asked_at = time.monotonic()

    def take(self) -> bool:
        """Try to take every lock the turn needs (all or none). True when held."""
        with self._mu:
            if self.held or self.gave_up or self.lost_to:
                return self.held
            lease = self._lease_needed()
            asked_at = time.monotonic()
            holder = self.locks.acquire(self.turn.turn_id, self.names, lease)
            if holder is None:
                self.held, self._held_names = True, self.names
                self._renewed_at, self._lease_s = asked_at, lease
                if self.holder:
                    log.info("turn %s: got the locks turn %s held", self.turn.turn_id, self.holder)
            elif holder.startswith(LAPSED):
                self._lost(holder.removeprefix(LAPSED))
            elif holder != self.holder:
                self.holder = holder
                log.info("turn %s: waiting for turn %s, which writes the same resources", self.turn.turn_id, holder)
            return self.held

    def renew(self, *, due_only: bool = True, for_call: str | None = None) -> bool:
        """Renew the lease of the locks held (one script): when due (every ``lock_lease_s / 3``;
        any time without ``due_only``), or when ``for_call``, a write about to be sent, needs a
        longer lease than the one set. False once the turn has lost its locks (:meth:`_lost`).
        Raises :class:`~toolfleet.errors.BrokerUnavailable` if Redis is away."""
        with self._mu:
            if self.lost_to:
                return False
            if not self._held_names or self._released:
                return True
            lease = self._lease_needed(for_call)
            now = time.monotonic()
            due = now - self._renewed_at > self.turn._settings.lock_lease_s / 3
            if due_only and not due and lease <= self._lease_s:
                return True
            holder = self.locks.acquire(self.turn.turn_id, self._held_names, lease)
            if holder is None:
                self._renewed_at, self._lease_s = now, lease
                return True
            self._lost(holder.removeprefix(LAPSED))
            return False

    def note_hold(self, seconds: float) -> None:
        """The watchdog answered a call whose execution may still act for ``seconds``: the lease
        set by later renewals covers that too (the hold itself only outlives a release)."""
        with self._mu:
            self._hold_until = max(self._hold_until, time.monotonic() + seconds)

    def _lease_needed(self, for_call: str | None = None) -> float:
        """The lease (s) the locks need now: ``lock_lease_s``, or :func:`.locks.lease_s` of the
        longest hard limit among the writes in flight (and ``for_call``), and at least
        ``lock_lease_s`` past a hold (:meth:`note_hold`)."""
        turn = self.turn
        with turn._lock:
            flying = [c for c in self._sent_at if c not in turn._finished]
        if for_call is not None:
            flying.append(for_call)
        hard = [self.hard_s(c) for c in flying if turn._runnable[c].spec.access == "write"]
        lease = lease_s(turn._settings, max(hard)) if hard else turn._settings.lock_lease_s
        return max(lease, self._hold_until - time.monotonic() + turn._settings.lock_lease_s)

    def hard_s(self, call_id: str) -> float:
        """The hard limit (s) of ``call_id``: how long after its start its execution may still act."""
        run = self.turn._runnable[call_id]
        return hard_limit_s(self.turn._settings, run.spec.time_limit_s(run.arguments))

    def release(self) -> None:
        """The turn is over: its locks go (those under a hold stay until it ends)."""
        with self._mu:
            if self.names and not self._released:
                self._released, self.held = True, False
                with suppress(Exception):  # the lease lapses by itself
                    self.locks.release(self.turn.turn_id)

    # ---- lost ----
    def _lost(self, holder: str) -> None:
        """Another turn removed this turn's locks after their lease lapsed: writes of the two could
        interleave, so this turn sends no more writes (module docstring)."""
        turn = self.turn
        self.lost_to, self.held = holder or "another turn", False
        log.warning("turn %s: lost its resource locks (their lease lapsed; turn %s removed them); its writes not "
                    "started will not run", turn.turn_id, self.lost_to)
        with turn._lock:
            waiting = [c for c in self._sent_at if c not in turn._started and c not in turn._finished
                       and turn._runnable[c].spec.access == "write"]
        for call_id in waiting:
            turn._ledger.record_result(turn.turn_id, self.not_executed(call_id), unless_started=True)

    def not_executed(self, call_id: str) -> ToolResult:
        """The answer of a write not sent (or not started) after the turn lost its locks."""
        return ToolResult.failure(
            call_id, self.turn._runnable[call_id].spec.name, ErrorCode.NOT_EXECUTED,
            f"the turn lost its locks on the resources it writes: their lease lapsed (its dispatcher did not renew "
            f"them in time) and turn {self.lost_to} removed them; this write did not run, so that no other "
            "turn's writes on the same resources come between this turn's", "check the current state, then ask "
            "again if the write is still wanted")

    def not_sent_again(self, call_id: str) -> ToolResult:
        """The answer of a write whose worker went silent, when the turn has lost its locks: it is
        not sent again; the first execution may have acted."""
        spec = self.turn._runnable[call_id].spec
        return ToolResult.failure(
            call_id, spec.name, ErrorCode.OUTCOME_UNKNOWN if spec.journal and not spec.idempotent
            else ErrorCode.WORKER_LOST,
            f"its worker went silent while it ran, and the turn has lost its locks (turn {self.lost_to} removed "
            "them after their lease lapsed), so it was not sent again; whether the first execution took effect is "
            "unknown", "check the real state before repeating it")
