"""toolfleet: run the tool calls a language model proposes on Celery workers.

Public API (everything else is private by convention)::

    from toolfleet import Dispatcher, Settings, tool, Registry, ToolContext

    with Dispatcher(settings, registry) as dispatcher:
        turn = dispatcher.submit_response(model_response)        # any provider format
        next_messages = turn.assistant_messages() + turn.messages()

        with dispatcher.open_stream() as stream:                 # a stream: early dispatch
            for event in model_stream:
                stream.feed(event)
        stream.turn.messages()
"""

from .dispatcher import Dispatcher, Plan, Repair, RepairedHistory, Turn, TurnStream, repair_history
from .dispatcher.adapters import (
    AnthropicAdapter,
    AnthropicStreamAdapter,
    OpenAIChatAdapter,
    OpenAIChatStreamAdapter,
    OpenAIResponsesAdapter,
    OpenAIResponsesStreamAdapter,
    get_adapter,
)
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
from .tools import Registry, ToolContext, ToolSpec, default_registry, paths, tool, tool_from_schema
from .worker import create_app

__version__ = "0.1.0"

__all__ = [
    "AnthropicAdapter",
    "AnthropicStreamAdapter",
    "BatchRejected",
    "BrokerUnavailable",
    "CallCancelled",
    "ConfigurationError",
    "Dispatcher",
    "ErrorCode",
    "OpenAIChatAdapter",
    "OpenAIChatStreamAdapter",
    "OpenAIResponsesAdapter",
    "OpenAIResponsesStreamAdapter",
    "PermissionDenied",
    "Plan",
    "Registry",
    "Repair",
    "RepairedHistory",
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
    "TurnStream",
    "create_app",
    "default_registry",
    "get_adapter",
    "paths",
    "repair_history",
    "tool",
    "tool_from_schema",
]
