"""The worker's own policy check, before a handler runs: a worker never trusts a message because
it arrived.

The worker evaluates its own policy (given to :func:`toolfleet.worker.create_app`, or
``toolfleet worker --policy``) with the remembered rules of the workspace. ``deny`` refuses the
call; ``ask`` runs it only if a person approved this very call (the decision the dispatcher's
approvals wrote in Redis), else refuses it; ``allow`` lets it run. A refusal is the call's
``PERMISSION_DENIED`` result and a ``denied`` audit event naming the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models import CallEnvelope, ErrorCode, ToolResult
from ..policy.engine import evaluate
from ..tools.spec import ToolSpec

if TYPE_CHECKING:
    from .runtime import Runtime


def screen_call(runtime: Runtime, env: CallEnvelope, spec: ToolSpec, worker: str) -> ToolResult | None:
    """``None`` when the call may run, else its ``PERMISSION_DENIED`` result (not yet recorded)."""
    verdict = evaluate(
        runtime.policy,
        spec,
        env.arguments,
        workspace=env.workspace,
        remembered=lambda: runtime.rules.matching(spec.name, env.workspace),
    )
    if verdict.action == "allow":
        return None
    if verdict.action == "ask":
        if runtime.approvals_decision(env.turn_id, env.call_id) == "approved":
            return None
        message = f"worker {worker}'s policy needs a person's approval for this call and it has none: {verdict.reason}"
        hint = "the call must be approved (toolfleet approve TURN CALL) before it can run"
    else:
        message = f"worker {worker}'s policy refused it: {verdict.reason}"
        hint = verdict.hint
    runtime.ledger.audit.append(env.turn_id, "denied", env.call_id, by=f"policy@{worker}",
                                reason=verdict.reason, rule=verdict.rule)
    return ToolResult.failure(env.call_id, spec.name, ErrorCode.PERMISSION_DENIED, message, hint)
