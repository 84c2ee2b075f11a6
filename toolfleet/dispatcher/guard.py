"""The dispatcher's policy step, between validation and planning (called by :meth:`Turn.add_calls`
for each group of calls it takes: a whole batch, or the calls a stream event completed).

For each valid call, in model order: the policy's verdict (:func:`toolfleet.policy.evaluate`, with
the remembered rules of the workspace), then loop detection over the session for the calls not
denied. ``deny`` → ``PERMISSION_DENIED`` and repeats → ``LOOP_DETECTED`` (neither is planned nor
run); ``ask`` → held as a :class:`PendingCall` (planned, not submitted until approved);
``allow`` → planned and submitted as usual. Then :meth:`Guard.record` writes the ``planned`` audit
event of those calls, the pending records and the policy's ``denied`` events.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..models import ErrorCode, ToolCall, ToolResult
from ..policy.config import Policy
from ..policy.engine import Verdict, evaluate
from ..policy.loops import LoopCheck, LoopDetector
from ..policy.rules import Rule, RuleStore
from ..tools.redact import redact_text, redact_value, secret_values, sensitive_values_in_text
from ..tools.registry import Registry
from ..tools.spec import ToolSpec
from ..tools.state import SessionStore, loop_epochs
from ..tools.validation import parse_arguments
from .approvals import Approvals, PendingCall
from .wire import shown_arguments

# what validation made of a call: its tool and arguments, or its error result
Checked = tuple[ToolSpec, dict[str, Any]] | ToolResult


@dataclass
class Screened:
    """What the policy step decided for a group of calls."""

    refused: dict[str, ToolResult] = field(default_factory=dict)
    held: dict[str, PendingCall] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)


class Guard:
    """Policy, remembered rules, loop detection and the audit of one dispatcher."""

    def __init__(
        self, policy: Policy, registry: Registry, approvals: Approvals, rules: RuleStore, loops: LoopDetector
    ) -> None:
        self.policy = policy
        self.registry = registry
        self.approvals = approvals
        self.rules = rules
        self.loops = loops
        self.audit = approvals.ledger.audit

    def screen(
        self,
        turn_id: str,
        calls: Sequence[ToolCall],
        checked: Sequence[Checked],
        *,
        workspace: str | None,
        session_id: str | None,
    ) -> Screened:
        """Decide every valid call of ``calls`` (``checked`` says which are valid). Raises
        :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer."""
        out = Screened()
        rules_cache: list[Rule] | None = None

        def remembered(name: str) -> list[Rule]:
            nonlocal rules_cache
            if rules_cache is None:  # read once per group, and only if some call would be asked about
                rules_cache = self.rules.all()
            return [rule for rule in rules_cache if rule.applies(name, workspace)]

        candidates: list[tuple[LoopCheck, ToolSpec, dict[str, Any]]] = []
        for call, outcome in zip(calls, checked, strict=True):
            if isinstance(outcome, ToolResult):
                continue
            spec, arguments = outcome
            verdict = evaluate(
                self.policy, spec, arguments, workspace=workspace,
                remembered=lambda name=spec.name: remembered(name),
            )
            # a reason quotes the call (a command); its declared-sensitive and secret-named values are
            # masked wherever they appear in it, as in the `planned` entry (the `denied` entry, the
            # model's PERMISSION_DENIED, the person's approval request)
            known = secret_values(arguments, spec.sensitive)
            if known:
                verdict = replace(verdict, reason=redact_text(verdict.reason, known),
                                  hint=redact_text(verdict.hint, known))
            out.verdicts[call.id] = verdict
            if verdict.action == "deny":
                out.refused[call.id] = ToolResult.failure(
                    call.id, spec.name, ErrorCode.PERMISSION_DENIED, f"policy: {verdict.reason}", verdict.hint
                )
                continue
            candidates.append((LoopCheck(call.id, spec.name, arguments, spec.poll_interval_s if spec.pollable else 0.0),
                               spec, arguments))
            if verdict.action == "ask":
                out.held[call.id] = PendingCall(
                    turn_id=turn_id,
                    call_id=call.id,
                    name=spec.name,
                    index=call.index,
                    arguments=shown_arguments(arguments, spec.sensitive),
                    reason=redact_text(verdict.reason),
                    workspace=workspace,
                    requested_at=time.time(),
                )
        # state-aware (issue 13, item 7): a write on a session state between two identical calls
        # makes them different calls; a tool with loop_check=False is never counted
        epochs = loop_epochs(self._sessions(), session_id, [(s, a) for _, s, a in candidates])
        looping = [replace(check, epoch=epoch) for (check, spec, _), epoch in zip(candidates, epochs, strict=True)
                   if spec.loop_check]
        for result in self.loops.check(session_id, looping, turn_id=turn_id):
            out.refused[result.call_id] = result
            out.held.pop(result.call_id, None)
        return out

    def record(
        self,
        turn_id: str,
        calls: Sequence[ToolCall],
        checked: Sequence[Checked],
        screened: Screened,
        deps: Mapping[str, frozenset[str]],
        *,
        workspace: str | None,
        session_id: str | None,
    ) -> dict[str, Any]:
        """Write the ``planned`` audit event of ``calls`` (``deps``: what each planned call waits
        for), hold the pending ones, and audit the ones the policy refused. Call after planning and
        before any of them is submitted or gets a result. Returns the redacted arguments of each
        valid call (call id -> :func:`~.wire.shown_arguments`), which the submitter shows Flower."""
        entries = []
        shown: dict[str, Any] = {}
        for call, outcome in zip(calls, checked, strict=True):
            verdict = screened.verdicts.get(call.id)
            refused = screened.refused.get(call.id)
            if refused is not None and refused.code == ErrorCode.LOOP_DETECTED:
                decided = "loop"
            elif verdict is not None:
                decided = verdict.action
            else:  # invalid: never reached the policy
                decided = outcome.code.value if isinstance(outcome, ToolResult) and outcome.code else "error"
            arguments = self._shown_arguments(call, outcome)
            if not isinstance(outcome, ToolResult):
                shown[call.id] = arguments
            entries.append({"index": call.index, "id": call.id, "tool": call.name,
                            "arguments": arguments, "verdict": decided,
                            "rule": verdict.rule if verdict else None})
        # the session id is the caller's label for a conversation, not a credential: it is masked
        # only when it is shaped like one (redact_text), not for its key's name as redact_value would
        waits = {c: sorted(d) for c, d in deps.items()}
        planned = redact_value({"workspace": workspace, "calls": entries, "deps": waits})
        planned["session_id"] = redact_text(session_id) if isinstance(session_id, str) else session_id
        self.audit.append_many(turn_id, [("planned", "", planned)], redact=False)
        self.approvals.hold(turn_id, list(screened.held.values()))
        for call_id, result in screened.refused.items():
            if result.code == ErrorCode.PERMISSION_DENIED:
                verdict = screened.verdicts[call_id]
                self.audit.append(turn_id, "denied", call_id, by="policy", reason=verdict.reason, rule=verdict.rule)
        return shown

    def _sessions(self) -> SessionStore:
        if getattr(self, "_session_store", None) is None:
            self._session_store = SessionStore(self.approvals.ledger.redis, self.approvals.ledger.keys,
                                               url=self.loops.url)
        return self._session_store

    def _shown_arguments(self, call: ToolCall, outcome: Checked) -> object:
        if not isinstance(outcome, ToolResult):
            spec, arguments = outcome
            return shown_arguments(arguments, spec.sensitive)
        spec = self.registry.get(call.name)
        sensitive = spec.sensitive if spec else ()
        parsed = parse_arguments(call, sensitive)
        if isinstance(parsed, dict):
            return shown_arguments(parsed, sensitive)
        if isinstance(call.arguments, str):  # not JSON: the sensitive values as the text gives them
            return redact_text(call.arguments, sensitive_values_in_text(call.arguments, sensitive))
        return redact_value(call.arguments)

