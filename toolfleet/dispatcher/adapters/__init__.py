"""Provider adapters: wire format in, wire format out."""

from __future__ import annotations

from typing import Any

from ...errors import BatchRejected
from .base import Adapter, as_dict
from .openai_chat import OpenAIChatAdapter

ADAPTERS: dict[str, Adapter] = {"openai_chat": OpenAIChatAdapter()}


def get_adapter(name: str) -> Adapter:
    """The adapter called ``name``; raises BatchRejected naming the known ones."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise BatchRejected(
            f"unknown format {name!r}; known: {', '.join(ADAPTERS)}", reason="unknown_format"
        ) from None


def detect(payload: Any) -> Adapter:
    """The adapter whose shape ``payload`` has; raises BatchRejected when none fits."""
    data = as_dict(payload)
    if isinstance(data, dict) and ("choices" in data or "tool_calls" in data):
        return ADAPTERS["openai_chat"]
    raise BatchRejected("cannot tell the provider format of this payload", reason="unknown_format")


__all__ = ["ADAPTERS", "Adapter", "OpenAIChatAdapter", "detect", "get_adapter"]
