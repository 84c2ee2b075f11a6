"""The worker side: the Celery app, the task that runs a call, the tool catalog."""

from .app import TASK_NAME, create_app
from .catalog import live_catalog

__all__ = ["TASK_NAME", "create_app", "live_catalog"]
