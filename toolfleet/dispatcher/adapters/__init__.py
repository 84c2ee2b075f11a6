"""Provider adapters: wire format in, wire format out, for every format by name or by shape.

============================  ==================================================================
format                        what it reads
============================  ==================================================================
``openai_chat``               a chat completion (or its assistant message): ``tool_calls``
``openai_responses``          a response (or its ``output`` list): ``function_call`` items (and
                              the built-in tool items the client executes: :mod:`.client_tools`)
``anthropic``                 a message (or its ``content`` list): ``tool_use`` blocks
``openai_chat_stream``        ``chat.completion.chunk`` events
``openai_responses_stream``   ``response.*`` events
``anthropic_stream``          ``message_start`` / ``content_block_*`` / ``message_*`` events
============================  ==================================================================

Short names are accepted too: ``chat``, ``responses``, ``messages``.
"""

from __future__ import annotations

from typing import Any

from ...errors import BatchRejected
from .anthropic import AnthropicAdapter
from .anthropic_stream import AnthropicStreamAdapter
from .base import Adapter, StreamParser, as_dict
from .client_tools import CLIENT_CALLS
from .openai_chat import OpenAIChatAdapter
from .openai_chat_stream import OpenAIChatStreamAdapter
from .openai_responses import OpenAIResponsesAdapter
from .openai_responses_stream import OpenAIResponsesStreamAdapter

ADAPTERS: dict[str, Any] = {
    adapter.name: adapter
    for adapter in (
        OpenAIChatAdapter(),
        OpenAIResponsesAdapter(),
        AnthropicAdapter(),
        OpenAIChatStreamAdapter(),
        OpenAIResponsesStreamAdapter(),
        AnthropicStreamAdapter(),
    )
}
ALIASES = {"chat": "openai_chat", "responses": "openai_responses", "messages": "anthropic",
           "anthropic_messages": "anthropic"}
_ANTHROPIC_EVENTS = frozenset({"message_start", "content_block_start", "content_block_delta",
                               "content_block_stop", "message_delta", "message_stop", "ping"})


def get_adapter(name: str) -> Any:
    """The adapter called ``name`` (or a short name); raises BatchRejected naming the known ones."""
    try:
        return ADAPTERS[ALIASES.get(name, name)]
    except KeyError:
        raise BatchRejected(
            f"unknown format {name!r}; known: {', '.join([*ADAPTERS, *ALIASES])}", reason="unknown_format"
        ) from None


def detect(payload: Any) -> Any:
    """The adapter whose shape ``payload`` has: a response, message or output list, or a list of
    stream events. Raises BatchRejected when none fits (pass ``format`` then)."""
    data = as_dict(payload)
    if isinstance(data, list):
        for event in data:
            found = detect_event(event)
            if found is not None:
                return found
        if data and all(isinstance(i, dict) and isinstance(i.get("type"), str) and i["type"] for i in data):
            kinds = {i["type"] for i in data}
            if kinds & {"function_call", "function_call_output", "reasoning", *CLIENT_CALLS, *CLIENT_CALLS.values()}:
                return ADAPTERS["openai_responses"]
            if kinds & {"tool_use", "text", "thinking"}:
                return ADAPTERS["anthropic"]
    elif isinstance(data, dict):
        found = _detect_response(data)
        if found is not None:
            return found
        if detect_event(data) is not None:
            raise BatchRejected("this is one stream event; pass the whole stream (a list of events, or a .jsonl "
                                "file) or feed events to Dispatcher.open_stream", reason="unknown_format")
    raise BatchRejected(
        "cannot tell the provider format of this payload; pass format= one of " + ", ".join(ADAPTERS),
        reason="unknown_format",
    )


def detect_event(event: Any) -> Any:
    """The stream adapter one event belongs to, or None if the event does not say."""
    data = as_dict(event)
    if not isinstance(data, dict):
        return None
    if data.get("type") == "chunk" and isinstance(data.get("chunk"), dict):
        data = data["chunk"]  # openai-python's Chat stream helper: a ChunkEvent holds the raw chunk
    kind = data.get("type")
    choices = data.get("choices")
    if data.get("object") == "chat.completion.chunk" or (isinstance(choices, list) and any(
        isinstance(c, dict) and "delta" in c for c in choices
    )):
        return ADAPTERS["openai_chat_stream"]
    if isinstance(kind, str) and kind.startswith("response."):
        return ADAPTERS["openai_responses_stream"]
    if isinstance(kind, str) and kind in _ANTHROPIC_EVENTS:
        return ADAPTERS["anthropic_stream"]
    return None


def _detect_response(data: dict[str, Any]) -> Any:
    if "choices" in data and data.get("object") != "chat.completion.chunk" and not detect_event(data):
        return ADAPTERS["openai_chat"]
    if data.get("role") == "assistant" and "tool_calls" in data:
        return ADAPTERS["openai_chat"]
    if data.get("object") == "response" or isinstance(data.get("output"), list):
        return ADAPTERS["openai_responses"]
    if data.get("type") == "message" or (data.get("role") == "assistant" and isinstance(data.get("content"), list)):
        return ADAPTERS["anthropic"]
    return None


__all__ = [
    "ADAPTERS",
    "ALIASES",
    "Adapter",
    "AnthropicAdapter",
    "AnthropicStreamAdapter",
    "OpenAIChatAdapter",
    "OpenAIChatStreamAdapter",
    "OpenAIResponsesAdapter",
    "OpenAIResponsesStreamAdapter",
    "StreamParser",
    "detect",
    "detect_event",
    "get_adapter",
]
