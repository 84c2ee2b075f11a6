"""The worker's steps in the turn ledger: claiming a call, and the fencing that keeps a stale
execution from acting (:class:`~toolfleet.ledger.Ledger` takes them from :class:`ClaimSteps`).

- ``claim_start`` (worker, before a handler runs) marks a call started, takes a fencing token and a
  deadline on the Redis clock, or says why the call must not run (:class:`Claim`); a turn not armed
  yet is waited for (``_wait_armed``).
- ``check_fence``, ``fence_dead``, ``fence_of``: whether an execution still holds its call, and the
  holder's pool process dying (docs/guarantees.md, F3).
- ``supersede`` (dispatcher, before sending a call again): the earlier messages of the call can no
  longer claim it; ``late_notes``: what refused executions reported.
- ``attempts``, ``with_run_facts``: what a claim recorded (attempts, worker, start time).

The mixin uses the :class:`~toolfleet.ledger.Ledger`'s client, keys, scripts, ``retrying`` and
``cancel``; it holds no state of its own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import TurnNotFound
from .keys import ATTEMPTS, FENCE, SENT_AFTER, STARTED, Keys, run_field
from .models import ToolResult

if TYPE_CHECKING:
    import redis

    from .ledger import LedgerEvent
    from .settings import Settings

T = TypeVar("T")
ARM_WAIT_S = 10.0  # longest a worker waits for an unarmed turn before calling it abandoned


class ClaimSteps:
    """Claims and fencing, as methods of :class:`~toolfleet.ledger.Ledger` (its base class)."""

    settings: Settings
    keys: Keys
    redis: redis.Redis
    cluster: bool
    _claim: Any
    _check_fence: Any
    _fence_dead: Any

    if TYPE_CHECKING:  # provided by Ledger
        def retrying(self, op: Callable[[], T]) -> T: ...
        def cancel(self, turn_id: str, reason: str = ...) -> int: ...
        def events(self, turn_id: str, after: str = ..., block_ms: int | None = ...) -> Iterator[LedgerEvent]: ...
        def _translated(self) -> AbstractContextManager[None]: ...

    def claim_start(self, turn_id: str, call_id: str, worker: str, *, arm_wait_s: float = ARM_WAIT_S,
                    hard_limit_s: float = 3600.0, submitted_at: float = float("inf"),
                    tool: str | None = None) -> Claim:
        """Mark a call started. Returns ``ok``, ``restarted`` (started before: a redelivery),
        ``cancelled`` (turn cancelled: do not run), ``done`` (already has a result: do not run) or
        ``ended`` (the turn is over: :meth:`end_turn` was called, or its lease lapsed because its
        dispatcher vanished; checked against Redis's clock: do not run) or ``superseded`` (this
        message, sent at ``submitted_at``, was replaced by a later send of the call: do not run) or
        ``running`` (a copy of the message whose execution still holds the call: its deadline has
        not passed, its process was not reported dead (:meth:`fence_dead`), and this message was
        not sent after it; a replay or a duplicate delivery: do not run, record nothing).
        A claim takes a new fencing token (:attr:`Claim.token`, monotonic per namespace) and a
        deadline ``hard_limit_s`` from now on the Redis clock; the execution holds the call while
        its token is the latest, the call has no result and the deadline has not passed
        (:meth:`check_fence`).

        A turn that is not armed yet is waited for (up to ``arm_wait_s``; normally the dispatcher
        arms it milliseconds after sending its first group); one that stays unarmed was abandoned
        by a dispatcher whose submission failed, so it is cancelled (``NOT_EXECUTED``) and
        ``cancelled`` returned."""
        k = self.keys
        started = json.dumps({"worker": worker, "pid": os.getpid(), "started_at": time.time()})
        keys = [
            k.turn_results(turn_id),
            k.turn_events(turn_id),
            k.turn_runs(turn_id),
            k.turn_cancelled(turn_id),
            k.turn_audit(turn_id),
            k.turn_armed(turn_id),
            k.turn_ended(turn_id),
            k.turn_lease(turn_id),
        ]
        args = [call_id, started, self.settings.result_ttl_s, int(hard_limit_s * 1000), repr(min(submitted_at, 1e15)),
                os.getpid()]
        if self.cluster:  # the namespace's counter is in its own slot: take the token first
            args.append(self.retrying(lambda: self.redis.incr(k.fence_counter)))
        else:  # and the tool's breaker failures, read with the turn's flags (Claim.failures_seen)
            keys += [k.fence_counter] + ([k.breaker_failures(tool)] if tool is not None else [])
        claim = Claim.parse(_s(self.retrying(lambda: self._claim(keys=keys, args=args))))
        if claim != "unarmed":
            return claim
        self._wait_armed(turn_id, arm_wait_s)
        claim = Claim.parse(_s(self.retrying(lambda: self._claim(keys=keys, args=args))))
        if claim != "unarmed":
            return claim
        try:
            self.cancel(turn_id, "the dispatcher never finished submitting the turn")
        except TurnNotFound:
            pass
        return Claim("cancelled")

    def check_fence(self, turn_id: str, call_id: str, token: int, *, refuse_if_cancelled: bool = True,
                    journal_key: str | None = None) -> str:
        """``""`` while the execution with fencing ``token`` still holds the call (its token is
        the latest claim's, the call has no result, the turn is not cancelled unless
        ``refuse_if_cancelled`` is False, its deadline has not passed, and it holds
        ``journal_key`` if given); else why not. One atomic script; Redis trouble past
        ``retry_s`` raises :class:`BrokerUnavailable` (the caller must then refuse its step)."""
        k = self.keys
        keys = [k.turn_runs(turn_id), k.turn_results(turn_id), k.turn_cancelled(turn_id)]
        if journal_key and not self.cluster:
            keys.append(journal_key)
        args = [call_id, str(token), "1" if refuse_if_cancelled else "0"]
        why = _s(self.retrying(lambda: self._check_fence(keys=keys, args=args)))
        if why or not journal_key or not self.cluster:
            return why
        # on a cluster the journal entry is in another slot: checked right after, in its own step
        holder = self.retrying(lambda: self.redis.hget(journal_key, "token"))
        return "" if holder is not None and _s(holder) == str(token) else "another execution holds its idempotency key"

    def fence_dead(self, turn_id: str, call_id: str, pid: int) -> bool:
        """The pool process ``pid`` that held ``call_id`` died (its worker saw it): a redelivered
        copy of its message may claim the call again before the holder's deadline (else such a
        copy is a duplicate of a live execution: ``running``). True if ``pid`` held the call.
        Retried while Redis is away, for ``retry_s`` (idempotent)."""
        return bool(self.retrying(lambda: self._fence_dead(keys=[self.keys.turn_runs(turn_id)], args=[call_id, pid])))

    def fence_of(self, turn_id: str, call_id: str) -> tuple[int, int, int] | None:
        """(token, deadline_ms on the Redis clock, pid) of the call's latest claim, or None.
        Retried while Redis is away, for ``retry_s`` (a worker's main process reads it off its
        event loop: worker/main_steps.py)."""
        raw = self.retrying(lambda: self.redis.hget(self.keys.turn_runs(turn_id), run_field(FENCE, call_id)))
        if raw is None:
            return None
        token, deadline, pid = (_s(raw).split(" ") + ["0", "0"])[:3]
        return int(token), int(deadline), int(pid or 0)

    def supersede(self, turn_id: str, call_id: str) -> None:
        """The dispatcher is about to send ``call_id`` again: every message of it sent before now
        can no longer claim it (``superseded``), wherever it is held (a frozen worker's socket, an
        unacknowledged index, a queue)."""
        key = self.keys.turn_runs(turn_id)
        with self._translated():
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(key, run_field(SENT_AFTER, call_id), repr(time.time()))
            pipe.expire(key, self.settings.result_ttl_s)
            pipe.execute()

    def late_notes(self, turn_id: str) -> dict[str, list[ToolResult]]:
        """Outcomes that stale executions reported after the caller had the call's answer, by call
        id (for the operator: the caller's answer stays final)."""
        notes: dict[str, list[ToolResult]] = {}
        for field, raw in self.redis.hgetall(self.keys.turn_late(turn_id)).items():
            call_id = _s(field).rsplit(" ", 1)[0]
            notes.setdefault(call_id, []).append(ToolResult.model_validate_json(raw))
        return notes

    def _wait_armed(self, turn_id: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        last = "0-0"
        while time.monotonic() < deadline:
            block_ms = max(int((deadline - time.monotonic()) * 1000), 1)
            read = lambda after=last, ms=block_ms: list(self.events(turn_id, after=after, block_ms=ms))  # noqa: E731
            for event in self.retrying(read):
                last = event.stream_id
                if event.type in ("armed", "cancel"):
                    return

    def attempts(self, turn_id: str, call_id: str) -> int:
        """How many times workers began the call (1 on the first run)."""
        raw = self.retrying(lambda: self.redis.hget(self.keys.turn_runs(turn_id), run_field(ATTEMPTS, call_id)))
        return int(raw or 1)

    def with_run_facts(self, turn_id: str, result: ToolResult) -> ToolResult:
        """``result`` with ``attempts``, ``worker`` and ``run_ms`` filled from the call's claim when
        a handler began it (the ledger's ``started`` record: worker and start time; the attempts
        count) and ``result`` lacks them: a result decided outside the handler (killed at the hard
        limit, presumed lost) still says who ran it and for how long. Unchanged if never started."""
        fields = [run_field(STARTED, result.call_id), run_field(ATTEMPTS, result.call_id)]
        key = self.keys.turn_runs(turn_id)
        started_raw, attempts_raw = self.retrying(lambda: self.redis.hmget(key, fields))
        if started_raw is None:
            return result
        try:
            started = json.loads(started_raw)
        except ValueError:
            started = {}
        update: dict[str, Any] = {}
        if not result.attempts:
            update["attempts"] = int(attempts_raw or 1)
        if result.worker is None and started.get("worker"):
            update["worker"] = str(started["worker"])
        if result.run_ms is None and isinstance(started.get("started_at"), (int, float)):
            update["run_ms"] = round(max(time.time() - started["started_at"], 0.0) * 1000, 3)
        return result.model_copy(update=update) if update else result


class Claim(str):
    """What ``claim_start`` answered (a ``str``: ``ok``, ``restarted``, ``cancelled``, ``done``,
    ``superseded``, ``running``), with the fencing ``token`` of an ``ok``/``restarted`` claim (else 0)
    and ``failures_seen``: False when the claim read the tool's breaker and found no failures
    counted (so the call's success has nothing to reset: ``record_result(failures_seen=...)``);
    True when it found some or did not look (no tool given; a Redis Cluster, where the breaker is
    in another slot)."""

    token: int = 0
    failures_seen: bool = True

    @classmethod
    def parse(cls, reply: str) -> Claim:
        """From the claim script's reply: ``verdict [token [0|1]]``."""
        verdict, token, seen = (reply.split(" ") + ["", ""])[:3]
        claim = cls(verdict)
        claim.token = int(token) if token.isdigit() else 0
        claim.failures_seen = seen != "0"
        return claim


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
