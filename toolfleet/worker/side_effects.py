"""The side-effect rules around one handler run (docs/design.md, "Side effects"; issue "Faults").

:func:`run_guarded` is what the task body calls instead of running the handler directly:

- A call that was started before (a redelivery after its worker died, or the dispatcher resending
  it after the worker vanished): an idempotent tool (every read) runs again; a journaled tool goes
  through the journal; any other write gets ``WORKER_LOST`` without running. A call started more
  than ``max_attempts`` times gets ``WORKER_LOST`` whatever it is (a call that kills its worker
  must not do so forever).
- A journaled tool (:mod:`.journal`): finished before under the same key → the recorded result is
  replayed and the handler does not run; another live execution holds the key → wait for its
  outcome; started before and abandoned → the tool's probe decides, else ``OUTCOME_UNKNOWN``.
  Only a definite outcome is recorded (a result, or a ``ToolFailure`` the handler raised); a
  handler stopped by cancel or time limit, or crashed, leaves the key "started without outcome".
- Fencing: the execution's claim token (``ctx.fencing_token``) is its journal token too, and
  ``ctx.check_fence()`` checks both at a handler's last moment. A claim whose answer took longer
  than :func:`recheck_after_s` to reach the handler (its worker frozen, a VM paused, Redis slow)
  is checked once more before anything runs: the caller may have its answer by then
  (``WORKER_LOST`` at the liveness bound, ``OUTCOME_UNKNOWN`` after ``cancel_grace_s``), and
  the handler must not start after that; likewise before a journaled handler whose idempotency key
  took that long to take (it waited for another holder). A quick claim costs no check. A stale execution (a newer one
  claimed the call, the caller already has its answer, its deadline passed) neither finishes the
  journal nor has its result recorded (the ledger keeps it as a late note).
- The tool's circuit breaker (:mod:`toolfleet.breaker`) is told whether the tool worked: a failure
  at once, a call that worked together with its result (one round trip).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from ..errors import CallCancelled, StaleFence, ToolFailure
from ..ledger import ARM_WAIT_S
from ..models import CallEnvelope, ErrorCode, ToolResult
from ..tools.context import ToolContext
from ..tools.spec import ToolSpec
from .journal import new_token
from .runtime import Runtime

log = logging.getLogger(__name__)
Runner = Callable[[Runtime, ToolSpec, ToolContext, dict[str, Any]], ToolResult]
BUSY_POLL_S = 0.1
UNSETTLED = (ErrorCode.CANCELLED, ErrorCode.TIMEOUT)  # stopped part-way: no definite outcome


class _NotDone(Exception):
    """The probe found no trace of the effect."""


@dataclasses.dataclass
class _Watch:
    """What happened inside a handler, as the wrapper saw it."""

    fault: str = ""  # "crash" | "timeout": the tool itself is in trouble
    not_done: bool = False


def arm_wait_s(env: CallEnvelope) -> float:
    """How long a call may wait for its turn to be armed: at most half its time limit, which the
    wait counts against (so an abandoned turn's call ends cleanly before the limit)."""
    return min(ARM_WAIT_S, env.time_limit_s / 2)


def hard_limit_for(runtime: Runtime, env: CallEnvelope) -> float:
    """How long after its claim a call's execution may still act (s), when the message does not
    say (its Celery ``time_limit`` does): its time limit, the soft limit's margin and this
    worker's kill grace."""
    from ..dispatcher.submit import hard_limit_s  # the dispatcher imports the worker's app

    return hard_limit_s(runtime.settings, env.time_limit_s)


def recheck_after_s(settings: Any) -> float:
    """How long a claim may take (s, from before it was sent until the handler would start)
    before its fence is checked again: under half the earliest time a dispatcher can answer a
    claimed call without its worker (``cancel_grace_s`` after a cancel; two heartbeats after a
    freeze, the least a lease can have left), and at most 0.25 s."""
    return min(0.25, settings.cancel_grace_s / 2, settings.heartbeat_s / 2)


TIMEOUT_HINT = "ask for less work per call, or a longer time limit where the tool allows it"


def timeout_hint(spec: ToolSpec | None) -> str:
    """The hint of a ``TIMEOUT``: a tool that is not idempotent was stopped part-way, so it may
    have done part of its work (a model that simply asks again may apply it twice)."""
    if spec is None or spec.idempotent:
        return TIMEOUT_HINT
    return f"the call may have done part of its work; check before repeating it, or {TIMEOUT_HINT}"


def run_guarded(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, env: CallEnvelope, claim: str,
                run: Runner, claim_sent: Since | None = None) -> tuple[ToolResult, bool]:
    """Run ``spec``'s handler for the call under the rules above; ``claim`` is what the ledger's
    ``claim_start`` answered (``ok`` or ``restarted``); ``run`` turns a handler run into a result;
    ``claim_sent``: the moment just before the claim was sent (``None``: just now).
    Returns the result and whether the caller still owes the breaker a "the tool worked" (told
    with the result, in the same round trip: ``Ledger.record_result(tool_worked=...)``)."""
    claim_took_s = 0.0 if claim_sent is None else claim_sent.elapsed_s()
    journal_key = runtime.journal.key(spec.name, env.idempotency_key) if spec.journal else None
    since = Since.ago(claim_took_s)  # since the claim was sent, or its fence last checked
    if ctx.fencing_token is not None:
        token = ctx.fencing_token

        def fence(key: str | None) -> Callable[[], str]:
            return lambda: runtime.ledger.check_fence(
                env.turn_id, env.call_id, token, refuse_if_cancelled=spec.cancellable, journal_key=key)

        if claim_took_s > recheck_after_s(runtime.settings):
            ctx.fence_check = fence(None)  # the journal's key is not taken yet: not checked
            refused = _refused_late_start(spec, ctx, claim_took_s)
            if refused is not None:
                return refused, False
            since = Since.now()
        ctx.fence_check = fence(journal_key)
    if claim == "restarted":
        ctx.attempt = runtime.ledger.attempts(env.turn_id, env.call_id)
        if ctx.attempt > runtime.settings.max_attempts:
            return _lost(spec, ctx, f"it was started {ctx.attempt} times and its worker died each time"), False
        if not spec.idempotent and not spec.journal:
            why = "it is a write that is neither idempotent nor journaled, so it is not run again"
            return _lost(spec, ctx, why), False
    if not spec.journal:
        result, watch = _run_watched(runtime, spec, ctx, env.arguments, run)
        if watch.fault:
            _breaker_failure(runtime, spec)
        return result, not watch.fault
    return _journaled(runtime, spec, ctx, env, run, since)


@dataclasses.dataclass(frozen=True)
class Since:
    """A moment, on the monotonic and the wall clock (a paused VM may stop one of them);
    :meth:`elapsed_s` is the later of the two clocks' counts since."""

    mono: float
    wall: float

    @classmethod
    def now(cls) -> Since:
        return cls(time.monotonic(), time.time())

    @classmethod
    def ago(cls, seconds: float) -> Since:
        return cls(time.monotonic() - seconds, time.time() - seconds)

    def elapsed_s(self) -> float:
        return max(time.monotonic() - self.mono, time.time() - self.wall)


def _journaled(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, env: CallEnvelope,
               run: Runner, since: Since | None = None) -> tuple[ToolResult, bool]:
    """The journal's rules around one handler run; returns the result and whether the handler ran
    and worked (see :func:`run_guarded`). ``since``: when the execution's claim was sent or its
    fence last checked; when the journal took longer than ``recheck_after_s`` since (it waited
    for another execution holding the key, its worker was frozen meanwhile), the fence is checked
    again before the probe or the handler: the caller may have its answer by then (F7)."""
    journal = runtime.journal
    key = journal.key(spec.name, env.idempotency_key)
    token = new_token() if ctx.fencing_token is None else str(ctx.fencing_token)
    owner = f"{env.turn_id}:{env.call_id}"
    while True:
        begun = journal.begin(key, token, owner, min(max(ctx.hard_deadline - time.monotonic(), 0.0), 1e6))
        if begun.verdict == "done" and begun.result is not None:
            log.info("call %s: replaying the journaled outcome of %s", owner, key)
            return begun.result.model_copy(update={"call_id": ctx.call_id, "name": spec.name}), False
        if begun.verdict == "busy":
            if ctx.cancelled.is_set():
                return ToolResult.failure(
                    ctx.call_id, spec.name, ErrorCode.NOT_EXECUTED,
                    f"the turn was cancelled while this call waited for {begun.holder}, which holds the same "
                    "idempotency key; it did not run",
                    "nothing happened here; the other call's outcome is replayed when you ask again",
                ), False
            if ctx.remaining_s <= 0:
                return _unknown(spec, ctx, f"another call ({begun.holder}) with the same idempotency key was still "
                                "running when this call's time limit ended",
                                "ask again later: once that call finishes, its outcome is replayed"), False
            ctx.cancelled.wait(min(BUSY_POLL_S, max(ctx.remaining_s, 0.001)))
            continue
        break
    if since is not None and ctx.fencing_token is not None:
        took_s = since.elapsed_s()
        if took_s > recheck_after_s(runtime.settings):
            refused = _refused_late_start(spec, ctx, took_s)  # this execution holds the key now
            if refused is not None:
                journal.release(key, token)
                return refused, False
    if begun.verdict == "takeover":
        settled = _probe(runtime, spec, ctx, env, run, begun.holder)
        if settled is not None:
            if settled.code is ErrorCode.OUTCOME_UNKNOWN:
                journal.release(key, token)
                return settled, False
            kept = journal.finish(key, settled, token, fenced_call(ctx, env))
            if kept is None:
                return _stale(spec, ctx, key), False
            return kept.model_copy(update={"call_id": ctx.call_id, "name": spec.name}), False
        journal.enter(key, token)  # a `new` verdict counted its entry already
    with journal.holding(key, token):
        result, watch = _run_watched(runtime, spec, ctx, env.arguments, run)
    if watch.fault:
        _breaker_failure(runtime, spec)
    if ctx.fenced:  # check_fence refused the step: this execution no longer holds the key
        return result, False
    if watch.fault or result.code in UNSETTLED:
        journal.release(key, token)
        return result, False
    kept = journal.finish(key, result, token, fenced_call(ctx, env))
    if kept is None:
        log.warning("call %s: journal %s is held by a newer execution; this stale execution's outcome is not "
                    "recorded there", owner, key)
        return result, False
    if kept.content != result.content or kept.status != result.status:
        log.error("call %s: journal %s already held another outcome; this execution's is dropped", owner, key)
    return result, True


def _refused_late_start(spec: ToolSpec, ctx: ToolContext, claim_took_s: float) -> ToolResult | None:
    """``None`` if this execution still holds its call after a slow claim (``ctx.check_fence()``:
    one Redis round trip; Redis unreachable refuses too, fail closed), else the result that says
    its handler never started. Guarantee F7 (docs/guarantees.md)."""
    try:
        ctx.check_fence()  # a refusal is logged there
        return None
    except SoftTimeLimitExceeded:  # it landed while the check waited out Redis: the handler never started
        log.warning("call %s (turn %s): its time limit passed while its claim was checked again (Redis did not "
                    "answer); the handler was not started", ctx.call_id, ctx.turn_id)
        return ToolResult.failure(ctx.call_id, spec.name, ErrorCode.NOT_EXECUTED,
                                  "the call's time limit passed before its handler could start (Redis did not "
                                  "answer the check that this execution still held its call); it did not run",
                                  "nothing happened; ask again once the fleet's Redis answers")
    except CallCancelled:
        log.info("call %s (turn %s): its claim took %.1f s and the turn was cancelled meanwhile; the handler was "
                 "not started", ctx.call_id, ctx.turn_id, claim_took_s)
        return ToolResult.failure(ctx.call_id, spec.name, ErrorCode.CANCELLED,
                                  "the turn was cancelled before this call's handler started; it did not run",
                                  "nothing happened; ask again if the call is still wanted")
    except StaleFence:
        if ctx.fence_unconfirmed:  # fail closed; this execution may still hold the call, and this be its answer
            return ToolResult.failure(ctx.call_id, spec.name, ErrorCode.NOT_EXECUTED,
                                      f"its handler was not started: Redis could not be reached to confirm that "
                                      f"this execution still held its call ({ctx.fenced}); it did not run",
                                      "nothing happened; ask again once the fleet's Redis answers")
        return ToolResult.failure(ctx.call_id, spec.name, ErrorCode.NOT_EXECUTED,
                                  f"this execution no longer held its call when its handler could start "
                                  f"({ctx.fenced}); it did not run", "the caller's answer for this call stands")


def _probe(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, env: CallEnvelope, run: Runner,
           holder: str) -> ToolResult | None:
    """The outcome of an abandoned execution: its result (probe found the effect), ``None`` (no
    effect: run the handler), or ``OUTCOME_UNKNOWN``."""
    why = f"an earlier execution of this call ({holder}) started and never recorded an outcome"
    if spec.probe is None:
        return _unknown(spec, ctx, f"{why}; the tool has no probe to tell whether it took effect",
                        "check the real state before asking again; the call is not retried automatically")
    probe = spec.probe
    watch = _Watch()

    def probed(**kwargs: Any) -> Any:
        try:
            value = probe(**kwargs)
        except (ToolFailure, CallCancelled, SoftTimeLimitExceeded):
            raise
        except Exception:
            watch.fault = "crash"
            raise
        if value is None:
            watch.not_done = True
            raise _NotDone()
        return value

    result = run(runtime, dataclasses.replace(spec, handler=probed), ctx, env.arguments)
    if watch.not_done:
        log.info("call %s:%s: probe found no effect of %s; running the handler", ctx.turn_id, ctx.call_id, holder)
        return None
    if watch.fault or result.code in UNSETTLED:
        return _unknown(spec, ctx, f"{why}; its probe could not tell whether it took effect ({result.content})",
                        "check the real state before asking again; the call is not retried automatically")
    return result


def _run_watched(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, arguments: dict[str, Any],
                 run: Runner) -> tuple[ToolResult, _Watch]:
    handler = spec.handler
    watch = _Watch()

    def watched(**kwargs: Any) -> Any:
        try:
            return handler(**kwargs)
        except ToolFailure:
            raise
        except SoftTimeLimitExceeded:
            watch.fault = "timeout"
            raise
        except Exception:
            watch.fault = "crash"
            raise

    return run(runtime, dataclasses.replace(spec, handler=watched), ctx, arguments), watch


def _breaker_failure(runtime: Runtime, spec: ToolSpec) -> None:
    """Count a crash or an unnoticed time limit against the tool's breaker (a call that worked is
    counted by the ledger's record script, with its result)."""
    try:
        runtime.breakers.observe(spec.name, ok=False)
    except Exception as exc:  # the breaker is advisory: never fail a call over it
        log.warning("could not update the circuit breaker of %s (%s)", spec.name, exc)


def fenced_call(ctx: ToolContext, env: CallEnvelope) -> tuple[str, str] | None:
    """(turn_id, call_id) for the journal's fenced finish, when this execution has a claim token."""
    return None if ctx.fencing_token is None else (env.turn_id, env.call_id)


def _stale(spec: ToolSpec, ctx: ToolContext, key: str) -> ToolResult:
    return _unknown(spec, ctx, f"a newer execution took over the idempotency key {key}; this one's outcome was "
                    "refused", "the caller's answer for this call stands")


def _lost(spec: ToolSpec, ctx: ToolContext, why: str) -> ToolResult:
    return ToolResult.failure(
        ctx.call_id, spec.name, ErrorCode.WORKER_LOST,
        f"the worker running this call died; {why}",
        "the call may or may not have taken effect; check before repeating it",
    )


def _unknown(spec: ToolSpec, ctx: ToolContext, message: str, hint: str) -> ToolResult:
    return ToolResult.failure(ctx.call_id, spec.name, ErrorCode.OUTCOME_UNKNOWN, message, hint)
