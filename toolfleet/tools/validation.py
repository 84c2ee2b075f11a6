"""Checking a call against its tool: name first, then arguments (DESIGN.md, step 2).

Every failure becomes that call's error result (``UNKNOWN_TOOL`` or ``INVALID_ARGUMENT``) saying
where (a JSON pointer), what was given, what the schema wants and how to fix it. Validation is
JSON Schema Draft 2020-12 through ``jsonschema``, with the validator compiled once per tool; types
are never coerced ("10" is not an integer).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any

from jsonschema.exceptions import ValidationError

from ..models import ErrorCode, ToolCall, ToolResult
from .spec import ToolSpec

GIVEN_MAX_CHARS = 80


def parse_arguments(call: ToolCall) -> dict[str, Any] | ToolResult:
    """The call's arguments as an object, or its ``INVALID_ARGUMENT`` result.

    ``""`` (or only white space) means ``{}``: OpenAI sends it for a tool called without arguments.
    """
    raw = call.arguments
    if isinstance(raw, dict):
        return raw
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return ToolResult.failure(
            call.id,
            call.name,
            ErrorCode.INVALID_ARGUMENT,
            f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(character {exc.pos}); given: {_short(raw)}",
            "send the arguments as one complete JSON object, with every brace and quote closed",
        )
    if not isinstance(value, dict):
        return ToolResult.failure(
            call.id,
            call.name,
            ErrorCode.INVALID_ARGUMENT,
            f"arguments must be a JSON object, not {type(value).__name__}; given: {_short(raw)}",
            'wrap them in an object keyed by parameter name, e.g. {"path": "README.md"}',
        )
    return value


def unknown_tool(call: ToolCall, names: Iterable[str]) -> ToolResult:
    """The ``UNKNOWN_TOOL`` result of a call whose name no tool has; lists the closest names."""
    names = list(names)
    close = difflib.get_close_matches(call.name, names, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return ToolResult.failure(
        call.id,
        call.name,
        ErrorCode.UNKNOWN_TOOL,
        f"there is no tool named {call.name!r}",
        f"{hint}tools that exist: {', '.join(names)}",
    )


def check_arguments(spec: ToolSpec, call_id: str, arguments: dict[str, Any]) -> ToolResult | None:
    """``None`` if ``arguments`` satisfy the tool's schema, else the ``INVALID_ARGUMENT`` result
    listing every violation at once."""
    errors = sorted(spec.validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return None
    lines = [_describe(error) for error in errors]
    fixes = list(dict.fromkeys(fix for _, fix in lines))
    message = f"{len(lines)} problem(s) with the arguments of {spec.name}: " + "; ".join(
        text for text, _ in lines
    )
    return ToolResult.failure(call_id, spec.name, ErrorCode.INVALID_ARGUMENT, message, " ".join(fixes))


def _pointer(parts: Iterable[Any]) -> str:
    escaped = [str(p).replace("~", "~0").replace("/", "~1") for p in parts]
    return "/" + "/".join(escaped) if escaped else "/"


def _describe(error: ValidationError) -> tuple[str, str]:
    """(where, given and wanted; one-line fix) for one violation."""
    where = _pointer(error.absolute_path)
    kind = error.validator
    if kind == "required":
        missing = [name for name in error.validator_value if name not in (error.instance or {})]
        name = missing[0] if missing else "?"
        return (
            f"{_pointer([*error.absolute_path, name])}: required parameter {name!r} is missing",
            f"add {name!r}.",
        )
    if kind == "additionalProperties":
        allowed = sorted((error.schema.get("properties") or {}).keys())
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        return (
            f"{where}: unknown parameter(s) {', '.join(map(repr, extra))}",
            f"remove {', '.join(map(repr, extra))}; parameters are {', '.join(allowed)}.",
        )
    if kind == "type":
        want = error.validator_value
        return (
            f"{where}: expected {_types(want)}, given {_short(json.dumps(error.instance))}",
            f"send {where.rsplit('/', 1)[-1]!r} as {_types(want)} (no quotes around numbers).",
        )
    if kind == "enum":
        return (
            f"{where}: must be one of {_short(json.dumps(error.validator_value))}, "
            f"given {_short(json.dumps(error.instance))}",
            f"pick one of the allowed values for {where.rsplit('/', 1)[-1]!r}.",
        )
    return (
        f"{where}: {error.message} (schema keyword {kind!r}={_short(json.dumps(error.validator_value))})",
        f"change {where.rsplit('/', 1)[-1] or 'the arguments'!r} to satisfy {kind}.",
    )


def _types(want: Any) -> str:
    names = want if isinstance(want, list) else [want]
    article = {"integer": "an integer", "object": "an object", "array": "an array"}
    return " or ".join(article.get(n, f"a {n}") for n in names)


def _short(text: str) -> str:
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= GIVEN_MAX_CHARS else text[: GIVEN_MAX_CHARS - 3] + "..."
