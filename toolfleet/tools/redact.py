"""Showing what a model gave without leaking it: values shortened, secrets masked.

:func:`show_given` quotes values back in error messages; :func:`redact_arguments` /
:func:`redact_value` / :func:`redact_text` mask what is stored or shown to people: the audit trail,
approval requests, the task arguments Flower shows, error messages, log lines. What a secret looks
like is :mod:`.secret_shapes`'s (token shapes, secret-named options and assignments, URL
credentials, headers, well-known programs' password options); here:

- a value under a parameter whose name is a secret word (``password``, ``pass``, ``api_key``,
  ``auth_token``, ``client_secret``, ...; matched by whole name parts, so ``max_tokens`` is not
  one) is shown only as its kind and size, e.g. ``<hidden: a string of 32 chars>``, or as ``***``;
- a name/value pair whose name is a secret's has its value masked the same way: an object with a
  ``name``/``key``/``header``/``field`` and a ``value`` (HAR, OpenAPI and Postman headers,
  Kubernetes ``env``: ``{"name": "X-Api-Key", "value": "***"}``) and a two-item array
  (``["X-Api-Key", "***"]``);
- inside any text, each recognised secret becomes ``***`` and the text around it stays as it was.

Redaction never raises and never recurses: nested values are walked with an explicit stack and
shown to ``MAX_DEPTH`` levels (deeper ones become ``TOO_DEEP``); a text the patterns fail on is
hidden whole. Long text keeps its head and tail and says how long it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from .secret_shapes import MASK, is_secret_name, mask_secrets

GIVEN_MAX_CHARS = 80
# short texts without ``known`` values that hold no secret are remembered as clean (tool names,
# audit keys, verdicts, call ids repeat for every call): mask_secrets is pure, so the answer is the same
CACHED_MAX_CHARS = 256
CACHED_TEXTS = 8192
MAX_DEPTH = 64  # levels of a nested value that are shown (issue 12: inputs nested 900 deep)
TOO_DEEP = f"<nested deeper than {MAX_DEPTH} levels: not shown>"

# the keys of a name/value pair's name and of its value (HAR, OpenAPI, Postman, Kubernetes env,
# AWS tags and CloudFormation parameters), lower-cased
PAIR_NAME_KEYS = frozenset({"name", "key", "header", "field", "parameterkey"})
PAIR_VALUE_KEYS = frozenset({"value", "parametervalue"})

OWN_SECRET_MIN_CHARS = 8  # shorter values are not masked everywhere (a password "redis" would eat words)
_OWN: tuple[str, ...] = ()  # this process's own secrets: masked in every text, whatever its shape

__all__ = ["GIVEN_MAX_CHARS", "MASK", "MAX_DEPTH", "TOO_DEEP", "is_secret_name", "kind_of", "mask_text",
           "redact_arguments", "redact_text", "redact_value", "register_own_secrets", "secret_values",
           "sensitive_values_in_text", "shorten",
           "show_given"]


def register_own_secrets(values: Iterable[str]) -> None:
    """Add this process's own secrets (its fleet keys, the passwords in its Redis URLs:
    ``Settings.secret_values``), of ``OWN_SECRET_MIN_CHARS``+ characters, to what every
    :func:`redact_text` masks wherever they appear (process-wide, only ever added to: every app
    made in the process adds its settings' secrets): a fleet key has no shape to recognise (43
    random characters), so a model's ``echo <key> > k`` would show it in Flower and the audit."""
    global _OWN
    _OWN = tuple(dict.fromkeys([*_OWN, *(v for v in values if isinstance(v, str)
                                        and len(v) >= OWN_SECRET_MIN_CHARS)]))


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every secret :mod:`.secret_shapes` recognises masked as ``***`` (the text
    around it kept), and each of the ``known`` values (3+ characters) and of this process's own
    secrets (:func:`register_own_secrets`) wherever it appears. Never
    raises: a text the patterns fail on comes back as ``<hidden: N chars>``. Non-strings are
    returned as given."""
    if not isinstance(text, str) or not text:
        return text
    try:
        known = known if isinstance(known, (tuple, list, set, frozenset)) else tuple(known)
        own = [secret for secret in _OWN if secret in text]
        if not known and not own and len(text) <= CACHED_MAX_CHARS:
            return _mask_short(text)
        return mask_secrets(text, (*known, *own))
    except Exception:  # noqa: BLE001 - fail closed: hide it all rather than crash or leak
        return f"<hidden: {len(text)} chars>"


_CLEAN: dict[str, None] = {}  # short texts masking left as they were; emptied when full


def _mask_short(text: str) -> str:
    """:func:`mask_secrets` of a short ``text`` with no known values. A text masking left unchanged
    is remembered (up to ``CACHED_TEXTS``, then forgotten all at once), one it changed is not: a
    text holding a secret is never kept past the call. An exception propagates (the caller hides
    the text)."""
    if text in _CLEAN:
        return text
    masked = mask_secrets(text)
    if masked == text:
        if len(_CLEAN) >= CACHED_TEXTS:
            _CLEAN.clear()
        _CLEAN[text] = None
    return masked


mask_text = redact_text  # the name error messages use for quoting raw argument text


def shorten(text: str, max_chars: int = GIVEN_MAX_CHARS) -> str:
    """``text`` as is when short, else its head and tail with the full length said."""
    if len(text) <= max_chars:
        return text
    tail = max(max_chars // 5, 8)
    head = max(max_chars - tail - 1, 8)
    return f"{text[:head]}…{text[-tail:]} ({len(text)} chars)"


def kind_of(value: Any) -> str:
    """The JSON type of ``value`` with its article: ``a string``, ``an integer``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def show_given(value: Any, path: Iterable[Any] = ()) -> str:
    """How a given value is quoted in an error: JSON, secrets masked, nested values to
    ``MAX_DEPTH`` levels, shortened. Never raises."""
    if value is not None and not isinstance(value, bool) and any(is_secret_name(p) for p in path):
        size = f" of {len(value)} chars" if isinstance(value, str) else ""
        return f"<hidden: {kind_of(value)}{size}>"
    shown = redact_value(value)
    try:
        text = json.dumps(shown, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = f"<{kind_of(value)}>"
    return shorten(redact_text(text))


# --- redaction of what is stored or shown for people (audit trail, approvals, Flower) ---

def pair_secret_key(node: dict[Any, Any]) -> Any:
    """The key of ``node`` holding a secret when ``node`` is a name/value pair whose name is a
    secret's (``{"name": "X-Api-Key", "value": ...}``: the key ``"value"``), else ``None``."""
    named = False
    value_key = None
    for key, item in node.items():
        if not isinstance(key, str) or len(key) > 16:
            continue
        lower = key.lower()
        if lower in PAIR_VALUE_KEYS:
            value_key = key
        elif lower in PAIR_NAME_KEYS and isinstance(item, str) and is_secret_name(item):
            named = True
    return value_key if named else None


def is_secret_pair(node: Any) -> bool:
    """True for a two-item array whose first item is a secret's name: ``["X-Api-Key", "..."]``."""
    return isinstance(node, (list, tuple)) and len(node) == 2 and isinstance(node[0], str) and is_secret_name(node[0])


def redact_value(value: Any, known: Iterable[str] = ()) -> Any:
    """A copy of a JSON-like value with the values of secret-named keys and of name/value pairs
    named as secrets masked, secrets in strings (keys too) masked (:func:`redact_text`, with
    ``known``), and what lies deeper than ``MAX_DEPTH`` levels replaced by ``TOO_DEEP``.
    Iterative: any depth, never raises."""
    known = tuple(known)
    try:
        root: list[Any] = [None]
        stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
        while stack:
            node, parent, slot, depth = stack.pop()
            if isinstance(node, str):
                parent[slot] = redact_text(node, known)
            elif isinstance(node, (dict, list, tuple)) and depth >= MAX_DEPTH:
                parent[slot] = TOO_DEEP
            elif isinstance(node, dict):
                out: dict[Any, Any] = {}
                parent[slot] = out
                paired = pair_secret_key(node)
                for key, item in node.items():
                    shown_key = redact_text(key, known) if isinstance(key, str) else key
                    if (is_secret_name(key) or (paired is not None and key == paired)) and item is not None \
                            and item != "":
                        out[shown_key] = MASK
                    else:
                        out[shown_key] = None
                        stack.append((item, out, shown_key, depth + 1))
            elif isinstance(node, (list, tuple)):
                items: list[Any] = [None] * len(node)
                parent[slot] = items
                if is_secret_pair(node) and node[1] is not None and node[1] != "":
                    items[1] = MASK
                    node = node[:1]
                stack.extend((item, items, i, depth + 1) for i, item in enumerate(node))
            else:
                parent[slot] = node
        return root[0]
    except Exception:  # noqa: BLE001 - fail closed
        return f"<hidden: {kind_of(value)}>"


def secret_values(arguments: Any, sensitive: Iterable[str] = ()) -> set[str]:
    """The strings a call's ``arguments`` hold under the tool's declared ``sensitive`` parameters,
    under secret-named keys or as the value of a name/value pair named as a secret, at any depth
    (to mask them where a tool quotes them back)."""
    found: set[str] = set()
    hidden = set(sensitive)
    stack: list[tuple[Any, bool, int]] = [(arguments, False, 0)]
    while stack:
        node, secret, depth = stack.pop()
        if isinstance(node, str):
            if secret:
                found.add(node)
        elif isinstance(node, dict) and depth < MAX_DEPTH:
            paired = pair_secret_key(node)
            stack.extend((v, secret or (depth == 0 and k in hidden) or is_secret_name(k)
                          or (paired is not None and k == paired), depth + 1) for k, v in node.items())
        elif isinstance(node, (list, tuple)) and depth < MAX_DEPTH:
            pair = is_secret_pair(node)
            stack.extend((v, secret or (pair and i == 1), depth + 1) for i, v in enumerate(node))
        elif secret and isinstance(node, (int, float)) and not isinstance(node, bool):
            found.add(str(node))
    return found


# a JSON string (its end may be missing: text cut short), a bracket or another word, after a name's colon
_TEXT_VALUE = re.compile(r"""(["'])((?:\\.|(?!\1)[^\\])*)\1?|([\[{])|([^\s,}\]]+)""")
_TEXT_ITEM = re.compile(r"""(["'])((?:\\.|(?!\1)[^\\])*)\1?|([^\s,:\[\]{}"']+)""")


def sensitive_values_in_text(text: str, sensitive: Iterable[str]) -> set[str]:
    """The values that arguments written as text which is not JSON (cut short, single-quoted, a
    comma missing) give the declared ``sensitive`` parameters: what follows ``"name":`` (or
    ``'name':``, ``name:``), a string as written and unescaped, a bare word, or every string and
    word of an array or object up to its closing bracket. :func:`secret_values` cannot find them:
    nothing says which value is whose until the text is read as JSON."""
    found: set[str] = set()
    for name in dict.fromkeys(n for n in sensitive if isinstance(n, str) and n):
        done = 0  # the end of the last array or object read whole: a name inside it was read with it
        for head in re.finditer(r"(?<![\w-])\\?[\"']?" + re.escape(name) + r"\\?[\"']?[ \t\r\n]*:[ \t\r\n]*", text):
            value = None if head.start() < done else _TEXT_VALUE.match(text, head.end())
            if value is None:
                continue
            if value.group(3) is None:
                found.update(_unescaped(value.group(2)) if value.group(1) else {value.group(4)})
                continue
            depth, end = 0, len(text)  # the array or object, up to its closing bracket (or the end)
            for i in range(value.start(), len(text)):
                depth += text[i] in "[{"
                depth -= text[i] in "]}"
                if depth == 0:
                    end = i
                    break
            for item in _TEXT_ITEM.finditer(text, value.end(), end):
                found.update(_unescaped(item.group(2)) if item.group(1) else {item.group(3)})
            done = end
    return {value for value in found if value}


def _unescaped(written: str) -> set[str]:
    """A JSON string's text as written and, when it reads, as it means (escapes resolved)."""
    try:
        return {written, json.loads(f'"{written}"')}
    except ValueError:
        return {written}


def redact_arguments(arguments: dict[str, Any], sensitive: Iterable[str] = ()) -> dict[str, Any]:
    """A call's arguments as they may be stored or shown to people: the tool's declared
    ``sensitive`` parameters masked whole, then :func:`redact_value` over the rest. The handler
    always receives the real values."""
    hidden = set(sensitive)
    return {name: MASK if name in hidden and value not in (None, "") else redact_value({name: value})[name]
            for name, value in arguments.items()}
