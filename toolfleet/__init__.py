"""toolfleet: run the tool calls a language model proposes on Celery workers.

Public API (everything else is private by convention)::

    from toolfleet import Dispatcher, Settings, tool, Registry, ToolContext
    from toolfleet import Policy, PendingCall, Rule          # approvals and command rules

    with Dispatcher(settings, registry) as dispatcher:
        turn = dispatcher.submit_response(model_response)        # any provider format
        next_messages = turn.assistant_messages() + turn.messages()

        with dispatcher.open_stream() as stream:                 # a stream: early dispatch
            for event in model_stream:
                stream.feed(event)
        stream.turn.messages()
"""

import importlib as _importlib
import typing as _typing

# The public names are imported on first use (PEP 562), so `import toolfleet.cli` (and with it
# `toolfleet --help`, `toolfleet down`) does not import Celery, kombu and the dispatcher
# (issue 15, point 8; measured in bench: "CLI start-up").
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".aio": ("AsyncDispatcher", "AsyncTurn"),
    ".dispatcher": ("Dispatcher", "Plan", "Repair", "RepairedHistory", "Turn", "TurnStream", "repair_history"),
    ".dispatcher.adapters": ("AnthropicAdapter", "AnthropicStreamAdapter", "OpenAIChatAdapter",
                             "OpenAIChatStreamAdapter", "OpenAIResponsesAdapter", "OpenAIResponsesStreamAdapter",
                             "get_adapter"),
    ".dispatcher.approvals": ("PendingCall",),
    ".errors": ("BatchRejected", "BrokerBusy", "BrokerRefused", "BrokerUnavailable", "CallCancelled",
                "ConfigurationError", "NotPending", "PermissionDenied", "ToolFailure", "ToolfleetError", "ToolTimeout",
                "TurnNotFound"),
    ".models": ("ErrorCode", "ToolCall", "ToolError", "ToolResult"),
    ".policy": ("CommandRules", "LoopRules", "Policy", "Rule", "Verdict"),
    ".settings": ("Settings",),
    ".tools": ("Registry", "ToolContext", "ToolSpec", "default_registry", "paths", "tool", "tool_from_schema"),
    ".tools.from_class": ("method", "tools_from_class"),
    ".tools.redact": ("redact_arguments", "redact_text"),
    ".tools.state": ("JsonRandom", "SessionState"),
    ".worker": ("create_app",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

if _typing.TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .aio import AsyncDispatcher, AsyncTurn
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
    from .dispatcher.approvals import PendingCall
    from .errors import (
        BatchRejected,
        BrokerBusy,
        BrokerRefused,
        BrokerUnavailable,
        CallCancelled,
        ConfigurationError,
        NotPending,
        PermissionDenied,
        ToolFailure,
        ToolfleetError,
        ToolTimeout,
        TurnNotFound,
    )
    from .models import ErrorCode, ToolCall, ToolError, ToolResult
    from .policy import CommandRules, LoopRules, Policy, Rule, Verdict
    from .settings import Settings
    from .tools import Registry, ToolContext, ToolSpec, default_registry, paths, tool, tool_from_schema
    from .tools.from_class import method, tools_from_class
    from .tools.redact import redact_arguments, redact_text
    from .tools.state import JsonRandom, SessionState
    from .worker import create_app


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use (then cached in this module)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'toolfleet' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__version__ = "0.1.0"

__all__ = [
    "JsonRandom",
    "method",
    "tools_from_class",
    "AnthropicAdapter",
    "AsyncDispatcher",
    "AsyncTurn",
    "AnthropicStreamAdapter",
    "BatchRejected",
    "BrokerBusy",
    "BrokerRefused",
    "BrokerUnavailable",
    "CallCancelled",
    "CommandRules",
    "ConfigurationError",
    "Dispatcher",
    "ErrorCode",
    "LoopRules",
    "NotPending",
    "OpenAIChatAdapter",
    "OpenAIChatStreamAdapter",
    "OpenAIResponsesAdapter",
    "OpenAIResponsesStreamAdapter",
    "PendingCall",
    "PermissionDenied",
    "Plan",
    "Policy",
    "Registry",
    "Repair",
    "RepairedHistory",
    "Rule",
    "SessionState",
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
    "Verdict",
    "create_app",
    "default_registry",
    "get_adapter",
    "paths",
    "repair_history",
    "redact_arguments",
    "redact_text",
    "tool",
    "tool_from_schema",
]
