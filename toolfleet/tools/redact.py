"""Showing what a model gave without leaking it: values shortened, secrets masked.

The one module that knows what a secret looks like. :func:`show_given` quotes values back in
error messages; :func:`redact_arguments` / :func:`redact_value` / :func:`redact_text` mask what is
stored or shown to people: the audit trail, approval requests, the task arguments Flower shows.

Error messages quote the given value back to the model (and into logs, the ledger and UIs), so
anything that looks like a credential is replaced before it is quoted:

- a value under a parameter whose name is a secret word (``password``, ``api_key``,
  ``auth_token``, ``client_secret``, ...; matched by whole name parts, so ``max_tokens`` is not
  one) is shown only as its kind and size, e.g. ``<hidden: a string of 32 chars>``;
- inside any text, well-known token shapes (OpenAI/Anthropic ``sk-`` keys, GitHub tokens, Slack
  tokens, AWS access key ids, Google API keys, JWTs, PEM private keys, ``Bearer``/``Basic``
  credentials) and ``"<secret name>": "<value>"`` pairs of raw JSON become ``***``.

Long text keeps its head and tail and says how long it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

GIVEN_MAX_CHARS = 80

_SECRET_PARTS = frozenset(
    {"password", "passwd", "passphrase", "pwd", "secret", "token", "apikey", "credential", "credentials",
     "authorization", "auth", "cookie", "privatekey", "accesskey", "secretkey", "sessionid", "otp"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
                           ("session", "id"), ("client", "secret")})
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_TOKEN_SHAPES = re.compile(
    r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
    r"|(?i:\b(?:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,})"
)
_JSON_PAIR = re.compile(r'("([^"\\]*)"\s*:\s*)"((?:[^"\\]|\\.)*)("?)')


def is_secret_name(name: Any) -> bool:
    """True when a parameter called ``name`` holds a credential (by whole name parts:
    ``api_key``, ``apiKey``, ``X-Auth-Token`` are; ``max_tokens``, ``keyword`` are not)."""
    if not isinstance(name, str):
        return False
    parts = [p.lower() for p in _SPLIT.split(name) if p]
    if not parts:
        return False
    if any(p in _SECRET_PARTS for p in parts) or "".join(parts) in _SECRET_PARTS:
        return True
    return any(pair in _SECRET_PAIRS for pair in zip(parts, parts[1:], strict=False))


def mask_text(text: str) -> str:
    """``text`` with token shapes and secret JSON pairs replaced by ``***``."""
    text = _TOKEN_SHAPES.sub("***", text)

    def pair(match: re.Match[str]) -> str:
        if is_secret_name(match.group(2)):
            return f'{match.group(1)}"***{match.group(4)}'
        return match.group(0)

    return _JSON_PAIR.sub(pair, text)


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
    """How a given value is quoted in an error: JSON, secrets masked, shortened."""
    if value is not None and not isinstance(value, bool) and any(is_secret_name(p) for p in path):
        size = f" of {len(value)} chars" if isinstance(value, str) else ""
        return f"<hidden: {kind_of(value)}{size}>"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return shorten(mask_text(_mask_nested(text, value)))


def _mask_nested(text: str, value: Any) -> str:
    """Re-dump ``value`` with secret-named members hidden (objects given where a scalar was due)."""
    if not isinstance(value, (dict, list)):
        return text

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: ("***" if is_secret_name(k) and v is not None else walk(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return json.dumps(walk(value), ensure_ascii=False, default=str)


# --- redaction of what is stored or shown for people (audit trail, approvals, Flower) ---

MASK = "***"
_KEY_VALUE = re.compile(r"""(?<![\w-])([A-Za-z_][\w.-]*)(["']?\s*[=:]\s*["']?)([^\s"'&,;}]{4,})""")
_FLAG_VALUE = re.compile(r"""(?<![\w-])--?([A-Za-z][\w-]*)(\s+["']?)([^\s"'-][^\s"']{3,})""")
_MORE_SHAPES = re.compile(
    r"\bsk-(?:live-|test-)[A-Za-z0-9_-]{16,}"
    r"|\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|\bglpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|\bASIA[0-9A-Z]{16}\b"  # AWS temporary key id
)
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+(@)")
_AUTH_HEADER = re.compile(r"""(?i)(authorization["']?\s*[:=]\s*["']?(?:[a-z]+\s+)?)[^\s"']{4,}""")


def redact_text(text: str) -> str:
    """``text`` with every secret found masked as ``***``: the shapes :func:`mask_text` knows, plus
    Stripe and GitLab keys, credentials in URLs (``https://user:***@host``), ``Authorization``
    header values, ``KEY=value`` / ``"key": "value"`` / ``--password value`` where the key names a
    secret (:func:`is_secret_name`)."""
    if not text:
        return text
    text = mask_text(text)
    text = _MORE_SHAPES.sub(MASK, text)
    text = _URL_CREDENTIALS.sub(r"\1" + MASK + r"\2", text)
    text = _AUTH_HEADER.sub(r"\1" + MASK, text)

    def pair(match: re.Match[str]) -> str:
        if is_secret_name(match.group(1)) and match.group(3) != MASK:
            return match.group(1) + match.group(2) + MASK
        return match.group(0)

    text = _KEY_VALUE.sub(pair, text)
    return _FLAG_VALUE.sub(pair, text)


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value with secret-named keys masked and secrets in strings masked."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: MASK if is_secret_name(k) and value[k] not in (None, "") else redact_value(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def redact_arguments(arguments: dict[str, Any], sensitive: Iterable[str] = ()) -> dict[str, Any]:
    """A call's arguments as they may be stored or shown to people: the tool's declared
    ``sensitive`` parameters masked whole, then :func:`redact_value` over the rest. The handler
    always receives the real values."""
    hidden = set(sensitive)
    return {name: MASK if name in hidden and value not in (None, "") else redact_value({name: value})[name]
            for name, value in arguments.items()}
