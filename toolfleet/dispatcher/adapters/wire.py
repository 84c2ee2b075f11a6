"""Reading provider payloads strictly, and writing what goes back as the providers accept it.

Reading: every field an adapter interprets is checked for its type; a wrong type raises
:class:`~toolfleet.errors.BatchRejected` whose ``pointer`` (RFC 6901) says where, never a raw
Python exception. Fields an adapter does not interpret are kept as they came.

Text: a stream may cut a UTF-16 surrogate pair between two fragments (``"\\ud83d"`` then
``"\\ude00"`` as JSON escapes); :func:`join_surrogates` joins such pairs after the fragments are
concatenated. What goes back to a provider must be encodable as UTF-8 (the SDKs encode request
bodies so), so :func:`for_wire` writes a lone surrogate left in a value as U+FFFD, and
:func:`arguments_for_wire` writes one in argument text as its JSON escape (``\\udXXX``, which is
valid JSON text and keeps what the model wrote).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ...errors import BatchRejected
from ...models import NOT_JSON_ARGUMENTS, means_no_arguments, plain_json
from ...tools.redact import redact_text
from ...tools.validation import MAX_NESTING

MAX_WIRE_DEPTH = 200  # a value nested deeper than this goes back as null (no provider sends one)
_SURROGATE = re.compile("[\ud800-\udfff]")
_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
          float: "a number", type(None): "null"}


def kind(value: Any) -> str:
    """``an object``, ``an array``, ``a string``, ``a number``, ``a boolean``, ``null`` (JSON terms)."""
    return _KINDS.get(type(value), type(value).__name__)


def at(pointer: str, key: Any) -> str:
    """``pointer`` extended by one token (``~`` and ``/`` escaped as RFC 6901 says)."""
    return f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}"


def reject(pointer: str, message: str) -> BatchRejected:
    """The BatchRejected for a wrong value at ``pointer`` (``reason="unreadable_payload"``)."""
    return BatchRejected(f"{pointer or '/'}: {message}", reason="unreadable_payload", pointer=pointer or "/")


def refuse_legacy_function_call(value: Any, pointer: str) -> None:
    """Raise BatchRejected (reason ``missing_call_id``, ``pointer``) when ``value`` (a Chat
    message's or delta's ``function_call``) is a call of the deprecated ``functions`` API: a
    mapping with a name or arguments. Such a call has no id to pair its result with (its answer is
    a ``role: "function"`` message keyed by name; OpenAI API reference, Chat Completions,
    ``function_call`` "Deprecated and replaced by tool_calls"), so toolfleet does not run it; read
    as no call at all, the caller would have been told the model asked for nothing. ``null`` and
    ``{}`` (what SDK dumps and gateways write when there is none) pass."""
    value = value.model_dump() if hasattr(value, "model_dump") else value
    if isinstance(value, Mapping) and (value.get("name") or value.get("arguments")):
        name = value.get("name") if isinstance(value.get("name"), str) else "?"
        raise BatchRejected(
            f"{pointer}: a function_call of the deprecated functions API ({cut(name, 60)!r}) has no call id, so "
            "its result could not be paired; nothing ran. Declare the tools with `tools` (Dispatcher.tools()) so "
            "the model answers with tool_calls", reason="missing_call_id", pointer=pointer)


def need_object(value: Any, pointer: str, what: str, optional: bool = False) -> dict[str, Any]:
    """``value`` as a dict (SDK objects dumped); ``{}`` for a missing optional one. Raises
    BatchRejected naming ``pointer`` for anything else."""
    if value is None and optional:
        return {}
    if hasattr(value, "model_dump"):
        from .base import as_dict

        value = as_dict(value)
    if not isinstance(value, dict):
        raise reject(pointer, f"{what} must be an object, not {kind(value)}")
    return value


def need_list(value: Any, pointer: str, what: str, optional: bool = True) -> list[Any]:
    """``value`` as a list (``[]`` for a missing optional one); BatchRejected otherwise."""
    if value is None and optional:
        return []
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise reject(pointer, f"{what} must be an array, not {kind(value)}")
    return value


def need_text(value: Any, pointer: str, what: str) -> str:
    """``value`` if it is a string, ``""`` if missing; BatchRejected for another type."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise reject(pointer, f"{what} must be a string, not {kind(value)}")
    return value


def need_index(value: Any, pointer: str, what: str = "index") -> int | None:
    """A non-negative integer position, or None when missing; BatchRejected otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise reject(pointer, f"{what} must be a non-negative integer, not {kind(value)} {short(value)}")
    return value


def short(value: Any, limit: int = 40) -> str:
    """``repr(value)``, secrets masked, then cut to ``limit`` characters (masked first: a secret cut
    from the name or shape that makes it recognisable would be shown)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        text = f"<{kind(value)}>"
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    """``text`` with its secrets masked (:func:`~toolfleet.tools.redact.redact_text`), then cut to
    ``limit`` characters: what a message quotes of a model's or provider's text."""
    text = redact_text(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def join_surrogates(text: str) -> str:
    """``text`` with every high+low surrogate pair joined into its character; lone surrogates stay."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def clean_text(text: str) -> str:
    """``text`` encodable as UTF-8: pairs joined, a lone surrogate written as U+FFFD."""
    return _SURROGATE.sub("\ufffd", join_surrogates(text)) if _SURROGATE.search(text) else text


def escape_surrogates(text: str) -> str:
    """JSON text encodable as UTF-8: pairs joined, a lone surrogate written as its JSON escape."""
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", join_surrogates(text))


def call_arguments(value: Any) -> str | dict[str, Any]:
    """A call's arguments as :class:`~toolfleet.models.ToolCall` takes them: text (pairs joined) or
    an object as is; missing means ``""`` (``{}``); any other JSON value, an object nested past
    ``MAX_NESTING``, and one that is not plain JSON (a payload built in Python: a key that is not a
    string, a set, bytes), its JSON text (or a note that it has none), so validation says what is
    wrong with that call alone."""
    if isinstance(value, str):
        return join_surrogates(value)
    if isinstance(value, dict) and not plain_json(value):
        return NOT_JSON_ARGUMENTS  # a payload built in Python (ToolCall says why)
    if isinstance(value, dict) and depth_of(value, MAX_NESTING) <= MAX_NESTING:
        return value
    if value is None:
        return ""
    # anything else goes on as text, which nothing downstream walks recursively; validation reads
    # it and says what is wrong (not an object, or too deep)
    return dumps(value) or NOT_JSON_ARGUMENTS


def dumps(value: Any) -> str | None:
    """``value`` as JSON text (UTF-8 safe), or None when it cannot be written (too deep, not JSON)."""
    try:
        return escape_surrogates(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return None


def arguments_for_wire(value: Any) -> str:
    """Chat and Responses ``arguments`` as the APIs take them: a JSON string. Text goes back as the
    model wrote it (pairs joined, lone surrogates escaped); missing (``null``), empty (``""``,
    white space only: what vLLM and Ollama write for a tool without parameters) or the JSON text
    ``null`` (Groq's) as ``"{}"``, how the call was run, since servers that read the history's
    arguments as a JSON object refuse those (Claude behind OpenAI-compatible gateways,
    labring/FastGPT#4754; Databricks, agno-agi/agno#9229; Gemini, langroid/langroid#988); an object
    as its JSON text."""
    if isinstance(value, str):
        return "{}" if means_no_arguments(value) else escape_surrogates(value)
    if value is None:
        return "{}"
    return dumps(value) or "{}"


def for_wire(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that encodes as UTF-8 JSON: strings cleaned (:func:`clean_text`), keys
    made strings, values nested past :data:`MAX_WIRE_DEPTH` written as null."""
    if depth > MAX_WIRE_DEPTH:
        return None
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): for_wire(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [for_wire(v, depth + 1) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def depth_of(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), counted without recursion; stops past ``limit``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            level += 1
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            stack.extend((v, level) for v in (item.values() if isinstance(item, dict) else item))
    return deepest
