"""toolfleet: run the tool calls a language model proposes on Celery workers.

Public API (everything else is private by convention)::

    from toolfleet import Dispatcher, Settings, tool, Registry, ToolContext
"""

from .dispatcher import Dispatcher, Plan, Turn
from .dispatcher.adapters import OpenAIChatAdapter
from .errors import (
    BatchRejected,
    BrokerUnavailable,
    CallCancelled,
    ConfigurationError,
    PermissionDenied,
    ToolFailure,
    ToolfleetError,
    ToolTimeout,
    TurnNotFound,
)
from .models import ErrorCode, ToolCall, ToolError, ToolResult
from .settings import Settings
from .tools import Registry, ToolContext, ToolSpec, default_registry, paths, tool
from .worker import create_app

__version__ = "0.1.0"

__all__ = [
    "BatchRejected",
    "BrokerUnavailable",
    "CallCancelled",
    "ConfigurationError",
    "Dispatcher",
    "ErrorCode",
    "OpenAIChatAdapter",
    "PermissionDenied",
    "Plan",
    "Registry",
    "Settings",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolFailure",
    "ToolResult",
    "ToolSpec",
    "ToolTimeout",
    "ToolfleetError",
    "Turn",
    "TurnNotFound",
    "create_app",
    "default_registry",
    "paths",
    "tool",
]
