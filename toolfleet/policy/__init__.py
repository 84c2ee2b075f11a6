"""Policy: what a call may do before it runs (approvals, command rules, loop detection).

Shared by the dispatcher (before submitting) and the workers (before the handler runs): a worker
never trusts a message because it arrived.
"""

from .commands import CommandAnalysis, Concern, Segment, Write, analyse
from .config import Action, CommandRules, LoopRules, Policy
from .engine import Verdict, evaluate
from .rules import Rule, RuleStore

__all__ = [
    "Action",
    "CommandAnalysis",
    "CommandRules",
    "Concern",
    "LoopRules",
    "Policy",
    "Rule",
    "RuleStore",
    "Segment",
    "Verdict",
    "Write",
    "analyse",
    "evaluate",
]
