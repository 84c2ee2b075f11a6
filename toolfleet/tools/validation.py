"""Checking a call against its tool: name first, then arguments (docs/design.md, step 2).

Used by the dispatcher (before anything is submitted) and again by the worker (which never trusts
a message because it arrived). Every failure becomes that call's error result:

- ``UNKNOWN_TOOL``: no tool by that name; the hint lists the closest existing names, then all.
- ``INVALID_ARGUMENT``: the arguments are not JSON (the message says where parsing stopped and
  shows the text up to there), not a JSON object, or against the tool's JSON Schema (Draft
  2020-12 through ``jsonschema``, the validator compiled once per tool). Schema problems are all
  reported at once, one line each: where (a JSON pointer), what was given (shortened, secrets
  masked), what the schema wants, and a one-line fix. The same problems are in
  ``result.data["errors"]`` for programs.

Types are never coerced: ``"10"`` is not an integer, ``"true"`` is not a boolean.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from typing import Any

from ..models import NOT_JSON_ARGUMENTS, ErrorCode, ToolCall, ToolResult, means_no_arguments
from .redact import MASK, kind_of, mask_text, sensitive_values_in_text, shorten
from .registry import Registry
from .spec import ToolSpec
from .violations import violations

NAMES_LISTED = 30
CONTEXT_CHARS = 40  # shown before where parsing stopped
AFTER_CHARS = 12  # shown from there on
MAX_NESTING = 100  # levels of arrays and objects in a call's arguments
_PREFIX = re.compile(r"^(functions|function|tools|tool|default_api|api)[.:/]", re.I)


def check_call(registry: Registry, call: ToolCall) -> tuple[ToolSpec, dict[str, Any]] | ToolResult:
    """Name, then arguments: ``(spec, arguments)`` for a call that may run, else its error
    result (``UNKNOWN_TOOL`` or ``INVALID_ARGUMENT``)."""
    spec = registry.get(call.name)
    if spec is None:
        return unknown_tool(call, registry.names())
    arguments = parse_arguments(call, spec.sensitive)
    if isinstance(arguments, ToolResult):
        return arguments
    problem = check_arguments(spec, call.id, arguments)
    return problem if problem is not None else (spec, arguments)


def parse_arguments(call: ToolCall, sensitive: Iterable[str] = ()) -> dict[str, Any] | ToolResult:
    """The call's arguments as an object, or its ``INVALID_ARGUMENT`` result (``sensitive``: the
    tool's declared sensitive parameters, whose values a message quoting text that is not JSON
    masks: :func:`~.redact.sensitive_values_in_text`).

    ``""`` (or only white space) means ``{}``: OpenAI sends it for a tool called without
    arguments, and an Anthropic ``tool_use`` streamed with no ``input_json_delta`` means ``{}``.
    So does JSON ``null``: Groq writes such a call as ``arguments: "null"``
    (langchain-ai/langchain#33896), which the model cannot write otherwise; any other JSON that is
    not an object is refused. JSON is read strictly (RFC 8259): no ``NaN``/``Infinity``, no key
    given twice.
    """
    raw = call.arguments
    if isinstance(raw, dict):
        return _readable(call, raw)
    if means_no_arguments(raw):
        return {}
    if raw == NOT_JSON_ARGUMENTS:  # an object built in Python that JSON cannot carry (models.ToolCall)
        return _invalid(call, "the arguments hold what JSON cannot carry (a key that is not a string, a set, bytes, "
                        "an object held twice or holding itself); nothing ran",
                        "send the arguments as one JSON object of strings, numbers, booleans, null, arrays and "
                        "objects.")
    def known() -> set[str]:  # only a message quoting the text needs them (a scan per name)
        return sensitive_values_in_text(raw, sensitive)

    try:
        value = json.loads(raw, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicate_keys,
                           parse_int=_integer)
    except json.JSONDecodeError as exc:
        return _invalid(call, *_where_parsing_stopped(raw, exc, known()))
    except _StrictJSONError as exc:
        return _invalid(call, f"arguments are not strict JSON: {exc}",
                        "send every parameter once, with plain JSON values (no NaN or Infinity).")
    except RecursionError:  # the decoder recurses: issue 12's deeply nested input
        return _invalid(call, f"arguments are nested more than {MAX_NESTING} levels deep; nothing ran",
                        "send flatter arguments, as the tool's schema describes them.")
    if isinstance(value, str) and value.strip().startswith("{"):
        return _invalid(
            call,
            f"arguments are a JSON string that holds JSON ({shorten(mask_text(raw, known()))}), not a JSON object",
            "send the object itself, not encoded a second time as a string.",
        )
    if not isinstance(value, dict):
        return _invalid(
            call,
            f"arguments must be a JSON object, not {kind_of(value)}; given {shorten(mask_text(raw, known()))}",
            'wrap them in an object keyed by parameter name, e.g. {"path": "README.md"}.',
        )
    return _readable(call, value)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_DIGITS = 4300  # Python's default int_max_str_digits: a longer integer cannot be read


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_DIGITS:
        raise _StrictJSONError(f"a number of {len(text.lstrip('-'))} digits (at most {_MAX_DIGITS}; send a longer "
                               "one as a string)")
    return int(text)


def _readable(call: ToolCall, value: dict[str, Any]) -> dict[str, Any] | ToolResult:
    """``value``, or INVALID_ARGUMENT when it nests past :data:`MAX_NESTING` or holds text
    that is not Unicode (a lone UTF-16 surrogate, which no UTF-8 file, command or request can carry)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, pointer, depth = stack.pop()
        if depth > MAX_NESTING:
            return _too_deep(call)
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            where = f"{pointer}/{key}"
            for text in (key, child) if isinstance(item, dict) else (child,):
                if isinstance(text, str) and _LONE_SURROGATE.search(text):
                    return _invalid(call, f"arguments hold text that is not Unicode at {where or '/'}: a lone "
                                    f"UTF-16 surrogate (U+{ord(_LONE_SURROGATE.search(text).group()):04X})",
                                    "send the whole character (both halves of a surrogate pair) or leave it out.")
            if isinstance(child, (dict, list)):
                stack.append((child, where, depth + 1))
    return value


def _too_deep(call: ToolCall) -> ToolResult:
    return _invalid(call, f"arguments are nested more than {MAX_NESTING} levels deep; nothing ran",
                    "send flatter arguments, as the tool's schema describes them.")


def unknown_tool(call: ToolCall, names: Iterable[str]) -> ToolResult:
    """The ``UNKNOWN_TOOL`` result of a call whose name no tool has; lists the closest names."""
    names = list(names)
    close = closest_names(call.name, names)
    listed = ", ".join(names[:NAMES_LISTED]) + (f" … ({len(names)} in all)" if len(names) > NAMES_LISTED else "")
    given = shorten(mask_text(call.name), 64) if call.name else ""  # masked whole, then cut
    message = f"there is no tool named {given!r}" if given else "the call names no tool"
    if close:
        hint = f"did you mean {' or '.join(close)}? Call one of the tools that exist: {listed}."
    else:
        hint = f"call one of the tools that exist: {listed}." if names else "no tool is registered."
    return ToolResult.failure(call.id, call.name, ErrorCode.UNKNOWN_TOOL, message, hint,
                              data={"closest": close, "tools": names})


def closest_names(name: str, names: list[str], n: int = 3) -> list[str]:
    """Existing tool names closest to ``name``: same name up to case and separators or a
    ``functions.``-style prefix first, then by similarity (difflib ratio ≥ 0.5)."""
    def norm(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", _PREFIX.sub("", text).lower())

    wanted = norm(name)
    exact = [candidate for candidate in names if wanted and norm(candidate) == wanted]
    by_norm = {norm(candidate): candidate for candidate in names}
    similar = [by_norm[m] for m in difflib.get_close_matches(wanted, list(by_norm), n=n, cutoff=0.5)]
    return list(dict.fromkeys(exact + similar))[:n]


def check_arguments(spec: ToolSpec, call_id: str, arguments: dict[str, Any]) -> ToolResult | None:
    """``None`` if ``arguments`` satisfy the tool's schema, else the ``INVALID_ARGUMENT`` result
    listing every violation at once (see the module docstring for the shape). Arguments nested
    deeper than ``MAX_NESTING`` levels are refused before the schema is checked (the checker
    recurses: issue 12's input nested 900 deep crashed it)."""
    if _deeper_than(arguments, MAX_NESTING):
        return ToolResult.failure(
            call_id, spec.name, ErrorCode.INVALID_ARGUMENT,
            f"the arguments of {spec.name} are nested more than {MAX_NESTING} levels deep; nothing ran",
            f"send flatter arguments, as the schema of {spec.name} describes them.",
            data={"errors": [{"pointer": "", "keyword": "maxDepth", "given": f"more than {MAX_NESTING} levels",
                              "wants": f"at most {MAX_NESTING} levels", "fix": "send flatter arguments"}]})
    found = violations(spec.validator, arguments, spec.sensitive)
    if not found:
        whole_numbers_as_int(spec.parameters, arguments, spec.parameters)
        return None
    count = "1 problem" if len(found) == 1 else f"{len(found)} problems"
    lines = "\n".join(f"- {v.line()}" for v in found)
    message = f"the arguments of {spec.name} have {count}; nothing ran:\n{lines}"
    hint = f"correct {'it' if len(found) == 1 else 'each one'} as the fix says and call {spec.name} again."
    return ToolResult.failure(call_id, spec.name, ErrorCode.INVALID_ARGUMENT, message, hint,
                              data={"errors": [v.as_dict() for v in found]})


def whole_numbers_as_int(schema: Any, value: Any, root: Any) -> Any:
    """``value`` (checked against ``schema``) with each float where the schema says ``integer`` made
    an ``int``, in place where it is a container; returns the value. JSON Schema 2020-12 (section
    6.1.1, "type") counts ``2.0`` and ``1e1`` as integers, so they pass the check, and a handler typed
    ``int`` got a float (``TypeError`` in a slice: a breaker's find; a model behind a gateway that
    re-encodes numbers as doubles sends them). Follows ``properties``, ``additionalProperties``,
    ``items``, ``prefixItems``, ``$ref`` into ``root``'s ``$defs``, and ``anyOf``/``oneOf``/``allOf``
    branches that say ``integer`` and not ``number``."""
    if not isinstance(schema, dict):
        return value
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and isinstance(root, dict):
        schema = {**(root.get("$defs") or {}).get(ref[len("#/$defs/"):], {}), **{k: v for k, v in schema.items()
                                                                                if k != "$ref"}}
    kinds = schema.get("type")
    kinds = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in schema.get(key) or [] if isinstance(b, dict)]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        said = kinds or {k for b in branches for k in ({b.get("type")} if isinstance(b.get("type"), str) else [])}
        return int(value) if "integer" in said and "number" not in said else value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                value[key] = whole_numbers_as_int(sub, value[key], root)
        for branch in branches:
            whole_numbers_as_int(branch, value, root)
    elif isinstance(value, list):
        prefix = schema.get("prefixItems") or []
        items = schema.get("items")
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else items
            if isinstance(sub, dict):
                value[i] = whole_numbers_as_int(sub, item, root)
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (JSON-like) has arrays or objects nested more than ``limit`` levels deep
    (an explicit stack: any depth)."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            if depth >= limit:
                return True
            stack.extend((item, depth + 1) for item in (node.values() if isinstance(node, dict) else node))
    return False


def _invalid(call: ToolCall, message: str, hint: str) -> ToolResult:
    return ToolResult.failure(call.id, call.name, ErrorCode.INVALID_ARGUMENT, message, hint)


def _where_parsing_stopped(raw: str, exc: json.JSONDecodeError, known: Iterable[str] = ()) -> tuple[str, str]:
    shown, after = around(raw, exc.pos, CONTEXT_CHARS, AFTER_CHARS, known)
    where = f"line {exc.lineno} column {exc.colno} (character {exc.pos} of {len(raw)})"
    if exc.pos >= len(raw.rstrip()):
        unclosed = _unclosed(raw)
        missing = f": {unclosed} never closed" if unclosed else ""
        message = (f"arguments are not valid JSON: the text ends at {where} before the JSON is complete"
                   f"{missing}; parsing stopped after {shown!r}")
        return message, "send the whole JSON object, with every string, bracket and brace closed."
    message = (f"arguments are not valid JSON: {exc.msg} at {where}; parsing stopped after {shown!r}, "
               f"before {after!r}")
    if "double quotes" in exc.msg:
        return message, "write keys and strings in double quotes, as JSON requires."
    if exc.msg == "Extra data":
        return message, "send exactly one JSON object, with nothing after its closing brace."
    return message, "send one valid JSON object, e.g. {\"name\": \"value\"}, with commas between members."


def around(text: str, pos: int, before: int = CONTEXT_CHARS, after: int = AFTER_CHARS,
           known: Iterable[str] = ()) -> tuple[str, str]:
    """The ``before`` characters of ``text`` up to ``pos`` (``…`` first when more came before) and
    the ``after`` characters from it, secrets masked in the WHOLE text first, then cut: a piece cut
    out first may no longer hold the name or program that makes a secret recognisable
    (``-u root -pSECRET`` without ``mysql``, a URL's password without its ``scheme://user:``).

    Everything shown is a piece of ``mask_text(text)``: the text up to ``pos`` is masked on its own
    (its end is where the masked whole text goes on); when that differs from the start of the masked
    whole text (a secret runs across ``pos``, or what follows makes one recognisable), only their
    common start is shown, then ``***``. ``known``: values masked wherever they appear too."""
    known = tuple(known)
    head = mask_text(text[:pos], known)
    whole = mask_text(text, known)
    if whole.startswith(head):
        shown, rest = head, whole[len(head):]
    else:
        same = 0
        for a, b in zip(head, whole, strict=False):
            if a != b:
                break
            same += 1
        shown, rest = whole[:same].rstrip("*") + MASK, ""
    return ("…" + shown[-before:] if len(shown) > before else shown), rest[:after]


def _unclosed(raw: str) -> str:
    """What is still open at the end of ``raw``: e.g. ``a string and 1 object``."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    parts = ["a string"] if in_string else []
    objects, arrays = stack.count("{"), stack.count("[")
    if objects:
        parts.append(f"{objects} object{'s' if objects > 1 else ''} ('}}' missing)")
    if arrays:
        parts.append(f"{arrays} array{'s' if arrays > 1 else ''} (']' missing)")
    return " and ".join(parts)


class _StrictJSONError(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _StrictJSONError(f"{name} is not a JSON value")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _StrictJSONError(f"parameter {key!r} is given twice")
        seen[key] = value
    return seen
