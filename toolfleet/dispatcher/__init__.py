"""The agent side: adapters, validation, planning, submitting, collecting, cancelling."""

from .client import Dispatcher
from .plan import Plan, PlanItem, make_plan
from .turn import Turn

__all__ = ["Dispatcher", "Plan", "PlanItem", "Turn", "make_plan"]
