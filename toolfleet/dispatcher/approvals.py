"""Calls held for a person's approval, and the decisions, in Redis (so any process can answer).

A call the policy answers ``ask`` is *pending*: it is recorded in ``<ns>:turn:<id>:pending`` and
not submitted. :meth:`Approvals.approve` / :meth:`Approvals.deny` (from the turn's handle, another
process, or ``toolfleet approve|deny``) record the first decision per call (``HSETNX``) in one Lua
script that also appends the decision to the turn's event stream, where the turn's driver picks it
up: an approved call is submitted as soon as the calls it waits for in the plan have results; a
denied call gets its ``PERMISSION_DENIED`` result in the same script. Workers read the decision
too, before running a call their own policy would ask about.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import redis

from ..audit import AuditLog
from ..errors import BrokerUnavailable, NotPending, TurnNotFound
from ..ledger import Ledger
from ..models import ErrorCode, ToolResult
from ..policy.rules import Rule, RuleStore, workspace_key

_DECIDE = """
-- KEYS: pending, decisions, results, cancelled, events, calls, audit, runs
-- ARGV: call_id, decision_json, result_json ('' to approve), ttl, decision, decision_audit
-- (a denial's audit 'finished' entry is read from its result event: AuditLog.read)
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('EXISTS', KEYS[6]) == 0 then return 'no_turn' end
  return 'unknown'
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'finished' end
if redis.call('EXISTS', KEYS[4]) == 1 then return 'cancelled' end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 'decided' end
redis.call('XADD', KEYS[5], '*', 'type', ARGV[5], 'call_id', ARGV[1], 'data', ARGV[2])
redis.call('XADD', KEYS[7], '*', 'type', ARGV[5], 'call_id', ARGV[1], 'data', ARGV[6])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('XADD', KEYS[5], '*', 'type', 'result', 'call_id', ARGV[1], 'data', ARGV[3])
  redis.call('HSET', KEYS[8], 'd:' .. ARGV[1], '1')  -- decided: a claim refuses it (Keys.turn_runs)
  redis.call('EXPIRE', KEYS[8], tonumber(ARGV[4]))
end
for i = 1, 7 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[4])) end
return 'ok'
"""

_REFUSALS = {
    "no_turn": "there is no turn {turn} (never submitted, or expired)",
    "unknown": "call {call} of turn {turn} is not waiting for approval (the policy did not ask about it)",
    "finished": "call {call} of turn {turn} already has its result",
    "cancelled": "turn {turn} was cancelled; call {call} will not run",
    "decided": "call {call} of turn {turn} was already {decision}",
}


@dataclass(frozen=True)
class PendingCall:
    """A call waiting for a person: what it would do (``arguments`` with secrets masked) and why
    the policy asks (``reason``)."""

    turn_id: str
    call_id: str
    name: str
    index: int
    arguments: dict[str, Any]
    reason: str
    workspace: str | None = None
    requested_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, raw: str | bytes) -> PendingCall:
        return cls(**json.loads(raw))


def default_approver() -> str:
    """``user@host`` of this process, recorded with each decision."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class Approvals:
    """Pending calls and decisions of one namespace (shares the ledger's Redis connection)."""

    def __init__(self, ledger: Ledger, rules: RuleStore) -> None:
        self.ledger = ledger
        self.keys = ledger.keys
        self.redis = ledger.redis
        self.rules = rules
        self.ttl_s = ledger.settings.result_ttl_s
        self._decide = self.redis.register_script(_DECIDE)

    def hold(self, turn_id: str, calls: list[PendingCall]) -> None:
        """Record ``calls`` as pending and append their ``pending`` audit events."""
        if not calls:
            return
        key, audit = self.keys.turn_pending(turn_id), self.keys.turn_audit(turn_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping={c.call_id: c.to_json() for c in calls})
        for call in calls:
            data = AuditLog.data(tool=call.name, reason=call.reason)
            pipe.xadd(audit, {"type": "pending", "call_id": call.call_id, "data": data})
        pipe.expire(key, self.ttl_s)
        pipe.expire(audit, self.ttl_s)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.ledger.settings.redis_url, str(exc)) from exc

    def pending(self, turn_id: str) -> list[PendingCall]:
        """Calls of ``turn_id`` still waiting for a decision, in model order."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(k.turn_pending(turn_id))
        pipe.hkeys(k.turn_decisions(turn_id))
        pipe.hkeys(k.turn_results(turn_id))
        pipe.exists(k.turn_calls(turn_id))
        with self.ledger._translated():
            held, decided, finished, exists = pipe.execute()
        if not exists:
            raise TurnNotFound(f"no turn {turn_id!r} in namespace {k.ns!r}")
        done = set(decided) | set(finished)
        calls = [PendingCall.from_json(v) for c, v in held.items() if c not in done]
        return sorted(calls, key=lambda c: c.index)

    def decision(self, turn_id: str, call_id: str) -> str | None:
        """``approved``, ``denied`` or ``None`` (no decision yet). Used by workers."""
        with self.ledger._translated():
            raw = self.redis.hget(self.keys.turn_decisions(turn_id), call_id)
        return None if raw is None else json.loads(raw).get("decision")

    def approve(
        self, turn_id: str, call_id: str, *, by: str | None = None, remember: str | bool = False
    ) -> Rule | None:
        """Let a pending call run, in its place in the plan. ``remember``: a command pattern
        (``"git *"``) or ``True`` (the whole tool) to keep as a rule for the turn's workspace;
        the rule is returned. Raises :class:`NotPending` if the call is not waiting (unknown,
        finished, cancelled or already decided), :class:`TurnNotFound` for an unknown turn."""
        return self._decide_once(turn_id, call_id, "approved", by=by, remember=remember)

    def deny(
        self,
        turn_id: str,
        call_id: str,
        reason: str = "a person denied it",
        *,
        by: str | None = None,
        remember: str | bool = False,
    ) -> Rule | None:
        """Refuse a pending call: its result is ``PERMISSION_DENIED`` with ``reason``; calls that
        wait for it in the plan then run. ``remember`` as for :meth:`approve` (a deny rule).
        Raises as :meth:`approve` does."""
        return self._decide_once(turn_id, call_id, "denied", by=by, reason=reason, remember=remember)

    def _decide_once(
        self, turn_id: str, call_id: str, decision: Literal["approved", "denied"], *, by: str | None,
        reason: str = "", remember: str | bool = False,
    ) -> Rule | None:
        k = self.keys
        by = by or default_approver()
        held = self._held(turn_id, call_id)
        rule = self._rule(held, "allow" if decision == "approved" else "deny", remember, by)
        record = {"decision": decision, "by": by, "reason": reason, "at": time.time()}
        audit = AuditLog.data(by=by, reason=reason or None, remembered=rule.describe() if rule else None)
        result_json = ""
        if decision == "denied":
            result = ToolResult.failure(
                call_id,
                held.name if held else "",
                ErrorCode.PERMISSION_DENIED,
                f"a person denied this call: {reason}",
                "do not repeat it; ask the user what they want instead",
            )
            result_json = result.model_dump_json(exclude_none=True)
        keys = [k.turn_pending(turn_id), k.turn_decisions(turn_id), k.turn_results(turn_id),
                k.turn_cancelled(turn_id), k.turn_events(turn_id), k.turn_calls(turn_id), k.turn_audit(turn_id),
                k.turn_runs(turn_id)]
        args = [call_id, json.dumps(record), result_json, self.ttl_s, decision, audit]
        try:
            status = self._decide(keys=keys, args=args)
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.ledger.settings.redis_url, str(exc)) from exc
        status = status.decode() if isinstance(status, bytes) else str(status)
        if status == "ok":
            return self.rules.add(rule) if rule is not None else None
        earlier = self.decision(turn_id, call_id) if status == "decided" else None
        message = _REFUSALS[status].format(turn=turn_id, call=call_id, decision=earlier)
        if status == "no_turn":
            raise TurnNotFound(message)
        raise NotPending(message, reason=status)

    def _held(self, turn_id: str, call_id: str) -> PendingCall | None:
        with self.ledger._translated():
            raw = self.redis.hget(self.keys.turn_pending(turn_id), call_id)
        return None if raw is None else PendingCall.from_json(raw)

    @staticmethod
    def _rule(
        held: PendingCall | None, action: Literal["allow", "deny"], remember: str | bool, by: str
    ) -> Rule | None:
        if not remember or held is None:
            return None
        pattern = remember if isinstance(remember, str) else None
        return Rule(tool=held.name, action=action, pattern=pattern, workspace=workspace_key(held.workspace), by=by)
