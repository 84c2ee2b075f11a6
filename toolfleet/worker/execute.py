"""The body of the task that runs one call on a worker (DESIGN.md, step 5).

Looks the tool up, checks the arguments and the worker's own policy again (a worker never trusts
a message because it arrived: :mod:`.guard`), claims the call in the ledger (refused if the turn
was cancelled or the call already has a result), runs the handler with its context, and records
exactly one result. A tool failure is a
result, never a raised exception, so the chains of the plan keep going.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from ..errors import CallCancelled, ToolFailure
from ..models import CallEnvelope, ErrorCode, ToolResult
from ..tools.context import ToolContext
from ..tools.output import fit_output
from ..tools.spec import ToolSpec
from ..tools.validation import check_arguments
from .guard import screen_call
from .runtime import Runtime
from .side_effects import arm_wait_s, hard_limit_for, run_guarded

log = logging.getLogger(__name__)


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
        claim = ledger.claim_start(env.turn_id, env.call_id, worker, arm_wait_s=arm_wait_s(env),
                                   hard_limit_s=hard_s, submitted_at=env.submitted_at)
        if claim == "superseded":  # the dispatcher sent the call again: that message runs it, not this one
            return ToolResult.failure(env.call_id, env.name, ErrorCode.NOT_EXECUTED,
                                      "this message of the call was superseded by a later send; it did not run", "")
        if claim in ("cancelled", "done"):
            recorded = ledger.results(env.turn_id).get(env.call_id)
            if recorded is not None:
                return recorded
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
        result, worked = run_guarded(runtime, spec, ctx, env, claim, _run_handler)
    result = result.model_copy(update={"attempts": ctx.attempt})
    return _record(runtime, env, result, worker, picked_at, started_at, tool_worked=spec.name if worked else None,
                   fencing_token=ctx.fencing_token)


def _run_handler(runtime: Runtime, spec: ToolSpec, ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
    kwargs = dict(arguments)
    if spec.context_param:
        kwargs[spec.context_param] = ctx
    budget = spec.max_output_chars

    def store(text: str) -> str:
        return ctx.output_store.save(text, turn_id=ctx.turn_id, call_id=ctx.call_id, tool=spec.name)

    try:
        with runtime.watcher.interruptible(ctx, spec.cancellable):
            value = spec.handler(**kwargs)
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
            "ask for less work per call, or a longer time limit where the tool allows it",
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
    if isinstance(value, str):
        return ToolResult(call_id=ctx.call_id, name=spec.name, status="ok", content=fit_output(value, budget, store))
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    return ToolResult(
        call_id=ctx.call_id, name=spec.name, status="ok", content=fit_output(text, budget, store), data=value
    )


def _record(
    runtime: Runtime, env: CallEnvelope, result: ToolResult, worker: str, picked_at: float, started_at: float,
    tool_worked: str | None = None, fencing_token: int | None = None,
) -> ToolResult:
    now = time.time()
    result = result.model_copy(
        update={
            "worker": worker,
            "queued_ms": round(max(picked_at - env.submitted_at, 0.0) * 1000, 3),
            "run_ms": round((now - started_at) * 1000, 3),
        }
    )
    ledger = runtime.ledger
    if ledger.record_result(env.turn_id, result, tool_worked=tool_worked, fencing_token=fencing_token):
        return result
    if fencing_token is not None:
        log.warning("call %s of turn %s: result of a stale execution (fencing token %s) refused; kept as a late "
                    "note (%s)", env.call_id, env.turn_id, fencing_token, result.code.value if result.code else "ok")
    return ledger.results(env.turn_id).get(env.call_id, result)
