"""LangGraph approvals: a call the policy holds for a person, as an ``interrupt`` and its resume.

:class:`~toolfleet.integrations.langgraph.FleetToolNode` raises a LangGraph ``interrupt`` whose
value is :func:`_ask`'s (``{"turn_id": ..., "pending": [{"call_id", "name", "arguments", "reason"},
...]}``) once every other call has its result, and applies the resume value with
:func:`answer_pending`: a map by call id, or one decision for every pending call
(:func:`decisions_for`); each decision is ``approve`` or ``deny`` with a reason and what to remember
(:func:`_decision`), and an answer that is not understood is a denial (fail closed). A pending call
the answer does not mention stays pending and is asked about again. Nothing here imports LangGraph.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ..errors import NotPending

if TYPE_CHECKING:
    from ..dispatcher.approvals import PendingCall
    from ..dispatcher.turn import Turn

_APPROVE = {"approve", "approved", "allow", "allowed", "accept", "yes", "y", "ok"}
_DENY = {"deny", "denied", "reject", "rejected", "refuse", "no", "n"}


def _ask(turn_id: str, pending: Sequence[PendingCall]) -> dict[str, Any]:
    return {"turn_id": turn_id,
            "pending": [{"call_id": p.call_id, "name": p.name, "arguments": p.arguments, "reason": p.reason}
                        for p in pending]}


def decisions_for(pending: Sequence[str], answer: Any) -> dict[str, Any]:
    """The answer for each of the ``pending`` call ids in a resume value: a map by call id (a call
    it leaves out stays pending; ids not pending are skipped: decided before), or, for anything else
    (``"approve"``, ``True``, ``{"decision": ..., "reason": ...}``), that one answer for every call."""
    if isinstance(answer, dict) and not ({"decision", "action", "type"} & set(answer)):
        return {cid: answer[cid] for cid in pending if cid in answer}
    return {cid: answer for cid in pending}


def _decision(value: Any) -> tuple[str, str, str | bool]:
    """(``approve`` | ``deny``, reason, remember) from one answer; not understood: a denial."""
    reason, remember = "a person denied it", False
    if isinstance(value, dict):
        reason = str(value.get("reason") or reason)
        remember = value.get("remember", False)
        if not isinstance(remember, str | bool):
            remember = False
        value = value.get("decision", value.get("action", value.get("type")))
    if value is True or (isinstance(value, str) and value.strip().lower() in _APPROVE):
        return "approve", reason, remember
    if value is False or (isinstance(value, str) and value.strip().lower() in _DENY):
        return "deny", reason, remember
    return "deny", f"the answer {value!r} was not understood as approve or deny, so the call was denied", False


def answer_pending(turn: Turn, pending: Sequence[PendingCall], answer: Any) -> None:
    """Apply a resume value to the calls still pending (an answer for a call already decided, in
    an earlier run of the node, is skipped)."""
    for call_id, value in decisions_for([p.call_id for p in pending], answer).items():
        verdict, reason, remember = _decision(value)
        with suppress(NotPending):  # decided meanwhile (another process, an earlier run)
            if verdict == "approve":
                turn.approve(call_id, by="langgraph", remember=remember)
            else:
                turn.deny(call_id, reason, by="langgraph", remember=remember)
