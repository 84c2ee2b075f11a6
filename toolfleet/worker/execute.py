"""The body of the task that runs one call on a worker (docs/design.md, step 5).

Looks the tool up, checks the arguments and the worker's own policy again (a worker never trusts
a message because it arrived: :mod:`.guard`), claims the call in the ledger (refused if the turn
was cancelled or the call already has a result), runs the handler with its context, and records
exactly one result. A tool failure is a
result, never a raised exception, so the chains of the plan keep going.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from ..errors import BrokerUnavailable, CallCancelled, ToolFailure
from ..ledger import not_executed
from ..models import CallEnvelope, ErrorCode, ToolResult
from ..observe.results import result_recorded
from ..tools.context import ToolContext
from ..tools.output import fit_output
from ..tools.spec import ToolSpec
from ..tools.validation import check_arguments
from .guard import screen_call
from .redaction import call_secrets, mask_known_secrets
from .runtime import Runtime
from .side_effects import Since, arm_wait_s, hard_limit_for, run_guarded, timeout_hint
from .stateful import call_handler
from .values import safe_text, to_content_and_data, to_json

log = logging.getLogger(__name__)
SUPERSEDED_MESSAGE = "this message of the call was superseded by a later send; it did not run"
RUNNING_COPY_MESSAGE = "a copy of this call's message arrived while the call runs; it did not run"
LOST_ANSWER_MESSAGE = "the call was answered before and Redis lost that answer (evicted)"


def with_journal_key(spec: ToolSpec, env: CallEnvelope) -> CallEnvelope:
    """``env`` with the journal key this worker's spec derives (``idempotency_key``), when it
    declares a function for it: a dispatcher that built the spec from the catalog cannot run that
    function and sends ``turn_id:call_id`` (tools/published.py)."""
    if spec.idempotency_key is None:
        return env
    return env.model_copy(update={"idempotency_key": spec.idempotency_key_for(env.turn_id, env.call_id,
                                                                               env.arguments)})


def execute(runtime: Runtime, envelope: dict[str, Any], worker: str, hard_limit_s: float | None = None) -> ToolResult:
    """Run one call and record its result; returns the result that the ledger holds for it.
    ``hard_limit_s``: the message's hard time limit (s), which the worker kills at; default: the
    call's time limit plus this worker's margins."""
    env = CallEnvelope.model_validate(envelope)
    picked_at = time.time()
    spec = runtime.registry.get(env.name)
    if spec is None:
        result = ToolResult.failure(
            env.call_id,
            env.name,
            ErrorCode.UNKNOWN_TOOL,
            f"worker {worker} does not serve the tool {env.name!r}",
            f"tools served here: {', '.join(runtime.registry.names())}",
        )
        return _record(runtime, env, result, worker, picked_at, picked_at)
    problem = check_arguments(spec, env.call_id, env.arguments) or screen_call(runtime, env, spec, worker)
    if problem is not None:
        return _record(runtime, env, problem, worker, picked_at, picked_at)
    env = with_journal_key(spec, env)

    ctx = ToolContext(
        call_id=env.call_id,
        turn_id=env.turn_id,
        tool_name=spec.name,
        session_id=env.session_id,
        workspace=None if env.workspace is None else Path(env.workspace),
        deadline=time.monotonic() + env.time_limit_s,
        output_store=runtime.outputs,
    )
    ledger = runtime.ledger
    hard_s = float(hard_limit_s) if hard_limit_s else hard_limit_for(runtime, env)
    with runtime.watcher.track(ctx):
        claim_sent = Since.now()  # before the claim reads the breaker's failures
        try:
            claim = ledger.claim_start(env.turn_id, env.call_id, worker, arm_wait_s=arm_wait_s(env),
                                       hard_limit_s=hard_s, submitted_at=env.submitted_at, tool=spec.name)
        except SoftTimeLimitExceeded:
            return _not_started_in_time(runtime, env)
        if claim == "superseded":  # the dispatcher sent the call again: that message runs it, not this one
            return ToolResult.failure(env.call_id, env.name, ErrorCode.NOT_EXECUTED, SUPERSEDED_MESSAGE, "")
        if claim == "running":  # a copy of the message whose execution holds the call: nothing recorded
            log.warning("call %s of turn %s: a copy of its message arrived while its execution runs; not run",
                        env.call_id, env.turn_id)
            return ToolResult.failure(env.call_id, env.name, ErrorCode.NOT_EXECUTED, RUNNING_COPY_MESSAGE, "")
        if claim in ("cancelled", "done", "ended"):
            recorded = ledger.results(env.turn_id).get(env.call_id)
            if recorded is not None:
                return recorded
            if claim == "ended":  # its dispatcher ended the turn or vanished (lease lapsed)
                # "it did not run" only where no claim began the call (one atomic step): a redelivery
                # of a call whose process died after the lease lapsed may have done its work, and
                # NOT_EXECUTED in the ledger is what a resume elsewhere submits again (takeover.py)
                kept = _record_unless_started(runtime, env, ToolResult.failure(
                    env.call_id, env.name, ErrorCode.NOT_EXECUTED,
                    "the turn was already over when a worker took this call (its dispatcher gave it up or went "
                    "away); it was not run",
                    "ask again if the call is still wanted",
                ))
                return kept if kept is not None else _record(runtime, env, ToolResult.failure(
                    env.call_id, env.name, ErrorCode.WORKER_LOST,
                    "the turn was already over when a worker took this call again; an earlier execution of it "
                    "had started and ended without a result (its worker died), and it was not run again",
                    "the call may or may not have taken effect; check before repeating it",
                ), worker, picked_at, picked_at)
            if claim == "done":  # answered before without a claim (the 'd:' mark: the dispatcher's
                # answer, a denial) and Redis lost that answer since (evicted): not run now. No
                # claim began it: it never ran (NOT_EXECUTED); one did (the watchdog answered a
                # started call): whether that execution did the call's work is unknown
                kept = _record_unless_started(runtime, env, ToolResult.failure(
                    env.call_id, env.name, ErrorCode.NOT_EXECUTED,
                    f"{LOST_ANSWER_MESSAGE}; it never started and was not run now",
                    "nothing happened; ask again if the call is still wanted"))
                return kept if kept is not None else _record(runtime, env, ToolResult.failure(
                    env.call_id, env.name, ErrorCode.OUTCOME_UNKNOWN,
                    f"{LOST_ANSWER_MESSAGE}; it had started before and was not run again",
                    "check whether the call's work was done before repeating it"), worker, picked_at, picked_at)
            if claim == "cancelled":  # a cancelled turn id taking calls again: those no claim began did not run
                kept = _record_unless_started(runtime, env, not_executed(env.call_id, env.name))
                if kept is not None:
                    return kept
            # Redelivered after it had started once, and the turn is cancelled: do not run again.
            result = ToolResult.failure(
                env.call_id,
                env.name,
                ErrorCode.CANCELLED,
                "the turn was cancelled; this call had started before and was not run again",
                "the call may have done part of its work; check before repeating it",
            )
            return _record(runtime, env, result, worker, picked_at, picked_at)
        ctx.attempt = 2 if claim == "restarted" else 1
        ctx.hard_deadline = time.monotonic() + hard_s  # a fencing deadline (claim + hard limit), monotonic
        ctx.fencing_token = claim.token or None
        started_at = time.time()
        result, worked = run_guarded(runtime, spec, ctx, env, claim, _run_handler, claim_sent)
    result = result.model_copy(update={"attempts": ctx.attempt})
    # a call that worked ends the tool's run of failures: one counted before its claim (which saw
    # it: Claim.failures_seen) or while it ran (heard: worker/breaker_notices.py); else nothing to reset
    reset = worked and (claim.failures_seen or runtime.watcher.failures.failed_since(spec.name, claim_sent.mono))
    return _record(runtime, env, result, worker, picked_at, started_at, tool_worked=spec.name if reset else None,
                   fencing_token=ctx.fencing_token)


def _not_started_in_time(runtime: Runtime, env: CallEnvelope) -> ToolResult:
    """The soft time limit landed while the claim waited out Redis (down, or busy): the handler
    never ran. Recorded as ``NOT_EXECUTED`` only if no claim began the call (one atomic step:
    a claim applied whose reply was lost makes it the execution's end, ``TIMEOUT``, as before)."""
    placeholder = ToolResult.failure(
        env.call_id, env.name, ErrorCode.NOT_EXECUTED,
        "the call's time limit passed before a worker could start it (Redis did not take the start); it did not run",
        "nothing happened; ask again once the fleet's Redis answers",
    )
    log.warning("call %s: its soft time limit passed while the worker waited for Redis to start it; recording "
                "NOT_EXECUTED unless a claim began it", env.call_id)
    kept = _record_unless_started(runtime, env, placeholder)
    if kept is None:
        raise SoftTimeLimitExceeded()
    return kept


def _record_unless_started(runtime: Runtime, env: CallEnvelope, placeholder: ToolResult) -> ToolResult | None:
    """Record ``placeholder`` (it says the call did not run) if no claim began the call, in one
    atomic step (``Ledger.record_result(unless_started=True)``); returns it when kept, else None."""
    if not runtime.ledger.record_result(env.turn_id, placeholder, unless_started=True):
        return None
    result_recorded(env, placeholder)
    return placeholder


def _run_handler(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    """Run the handler; whatever it returns or raises becomes a result that can be stored, with the
    call's secret argument values masked where it quotes them back (:func:`mask_known_secrets`),
    before anything stores it: the journal (worker/side_effects.py), the ledger, the result log.
    While it runs, the worker's log lines have those values masked too (:func:`call_secrets`)."""
    with call_secrets(arguments, spec.sensitive):
        result = _handler_result(runtime, spec, ctx, arguments)
    return storable(mask_known_secrets(result, arguments, spec.sensitive))


def _handler_result(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    kwargs = dict(arguments)
    if spec.context_param:
        kwargs[spec.context_param] = ctx
    budget = spec.max_output_chars

    def store(text: str) -> str:
        return ctx.output_store.save(text, turn_id=ctx.turn_id, call_id=ctx.call_id, tool=spec.name,
                                     workspace=ctx.workspace, session_id=ctx.session_id)

    try:
        with runtime.watcher.interruptible(ctx, spec.cancellable):
            value = call_handler(runtime, spec, ctx, kwargs, arguments)  # session state: worker/stateful.py
    except CallCancelled as exc:
        return ToolResult.failure(
            ctx.call_id,
            spec.name,
            ErrorCode.CANCELLED,
            f"the turn was cancelled while the call ran; it was stopped ({exc})",
            "the call may have done part of its work; check before repeating it",
            output=fit_output(exc.output, budget, store) if exc.output else "",
        )
    except SoftTimeLimitExceeded:
        return ToolResult.failure(
            ctx.call_id,
            spec.name,
            ErrorCode.TIMEOUT,
            "the call ran past its time limit and was stopped",
            timeout_hint(spec),
        )
    except ToolFailure as exc:
        return ToolResult.failure(
            ctx.call_id,
            spec.name,
            ErrorCode(exc.code),
            exc.message,
            exc.hint,
            output=fit_output(exc.output, budget, store) if exc.output else "",
        )
    except Exception as exc:  # the handler failed: that is the call's result, not the task's
        return ToolResult.failure(
            ctx.call_id,
            spec.name,
            ErrorCode.EXECUTION_ERROR,
            f"{type(exc).__name__}: {exc}",
            "the tool failed; read the message, fix the arguments or try another way",
        )
    try:
        text, data = to_content_and_data(value)  # every value becomes a result (worker/values.py)
        if spec.formatter is not None:  # the tool's own text; data kept
            text = safe_text(str(spec.formatter(value)))
    except Exception as exc:
        return ToolResult.failure(
            ctx.call_id, spec.name, ErrorCode.EXECUTION_ERROR,
            f"the handler ran but its return value could not be made a result: {safe_text(str(exc))}",
            "return text, JSON-like data, or bytes up to 1 MiB",
        )
    return ToolResult(
        call_id=ctx.call_id, name=spec.name, status="ok", content=fit_output(text, budget, store), data=data
    )


def _record(
    runtime: Runtime, env: CallEnvelope, result: ToolResult, worker: str, picked_at: float, started_at: float,
    tool_worked: str | None = None, fencing_token: int | None = None,
) -> ToolResult:
    now = time.time()
    spec = runtime.registry.get(env.name)
    # quoted-back arguments (a handler's result is masked already, before the journal stored it: _run_handler)
    result = mask_known_secrets(result, env.arguments, spec.sensitive if spec else ())
    result = result.model_copy(
        update={
            "worker": worker,
            "queued_ms": round(max(picked_at - env.submitted_at, 0.0) * 1000, 3),
            "run_ms": round((now - started_at) * 1000, 3),
        }
    )
    ledger = runtime.ledger
    try:
        try:
            result = storable(result)
            kept = ledger.record_result(env.turn_id, result, tool_worked=tool_worked, fencing_token=fencing_token)
        except SoftTimeLimitExceeded:
            # the soft limit landed while the ledger waited out Redis (down, or busy: OOM, READONLY...):
            # the handler's result is still the call's; try on, the hard limit (main process) bounds it
            log.warning("call %s: its soft time limit passed while its result was being recorded; trying on until "
                        "the hard limit", env.call_id)
            result = storable(result)
            kept = ledger.record_result(env.turn_id, result, tool_worked=tool_worked, fencing_token=fencing_token)
    except BrokerUnavailable:
        raise
    except Exception as exc:  # the result cannot be stored: that failure is the call's result
        log.warning("call %s: its result could not be recorded (%s); recording EXECUTION_ERROR", env.call_id, exc)
        result = ToolResult.failure(
            env.call_id, safe_text(env.name), ErrorCode.EXECUTION_ERROR,
            f"the handler ran but its result could not be recorded: {type(exc).__name__}: {safe_text(str(exc))[:500]}",
            "the tool returned something that cannot be stored; fix the tool or ask for less",
            attempts=result.attempts, worker=result.worker, queued_ms=result.queued_ms, run_ms=result.run_ms)
        kept = ledger.record_result(env.turn_id, result, fencing_token=fencing_token)
    if kept:
        result_recorded(env, result)  # log line, metrics, span (observe/results.py)
        return result
    if fencing_token is not None:
        log.warning("call %s of turn %s: result of a stale execution (fencing token %s) refused; kept as a late "
                    "note (%s)", env.call_id, env.turn_id, fencing_token, result.code.value if result.code else "ok")
    return ledger.results(env.turn_id).get(env.call_id, result)


def storable(result: ToolResult) -> ToolResult:
    """``result`` with every text encodable as UTF-8 (lone surrogates replaced) and ``data``
    JSON-safe (:mod:`.values`), so that recording it cannot fail on its content."""
    try:
        result.model_dump_json()
        return result
    except Exception:  # noqa: BLE001 - pydantic's serialization errors vary
        pass
    update: dict[str, Any] = {"content": safe_text(result.content), "name": safe_text(result.name),
                              "data": to_json(result.data)}
    if result.error is not None:
        update["error"] = result.error.model_copy(update={"message": safe_text(result.error.message),
                                                          "hint": safe_text(result.error.hint)})
    return result.model_copy(update=update)
