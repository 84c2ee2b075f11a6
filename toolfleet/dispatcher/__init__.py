"""The agent side: adapters, validation, planning, submitting, collecting, cancelling, history."""

from .client import Dispatcher
from .history import Repair, RepairedHistory, repair_history
from .plan import Plan, PlanItem, Planner, make_plan
from .streaming import TurnStream
from .turn import Turn

__all__ = [
    "Dispatcher",
    "Plan",
    "PlanItem",
    "Planner",
    "Repair",
    "RepairedHistory",
    "Turn",
    "TurnStream",
    "make_plan",
    "repair_history",
]
