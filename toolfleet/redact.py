"""Masking secrets before anything is written where people (or logs) read it.

Two rules, applied together by :func:`redact_arguments`:

- **Sensitive parameters**: a tool declares them (``@tool(sensitive=("api_token",))``); their values
  are replaced whole. Parameters whose *name* looks like a secret (``password``, ``token``,
  ``api_key``, ``secret``, ``authorization``, ...) are treated the same even when undeclared.
- **Secret shapes** in any text (:func:`redact_text`): provider API keys (``sk-...``, ``sk-ant-...``),
  GitHub, GitLab, Slack, Stripe, Google and AWS keys, JSON Web Tokens, ``Bearer`` tokens,
  PEM private keys, credentials in URLs (``https://user:pass@host``) and ``key=value`` assignments
  whose key names a secret (``API_KEY=...``, ``--password ...``, ``"token": "..."``).

Used for the audit trail, the pending-approval records, and the task arguments Flower shows
(``kwargsrepr``). The value that runs the tool is never changed: only what is shown or stored for
people is masked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "[REDACTED]"

# A parameter or key name that holds a secret (matched on the whole name, case-insensitive).
SECRET_NAME = re.compile(
    r"(?i)^(?:.*[_-])?(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|client[_-]?secret|auth(?:orization)?|credentials?|cookie|session[_-]?key|pwd)"
    r"(?:[_-].*)?$"
)

_KEY_WORDS = (
    r"pass(?:word|wd|phrase)?|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
    r"client[_-]?secret|auth[_-]?token|credentials?|pwd"
)

_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys (whole block)
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), MASK),
    # credentials in URLs: scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+(@)"), r"\1" + MASK + r"\2"),
    # Authorization headers and bearer tokens
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z]+\s+)?)[^\s\"']{4,}"), r"\1" + MASK),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1" + MASK),
    # key = value, key: value, "key": "value" where the key names a secret
    (
        re.compile(
            r"(?i)((?:[\w.-]*[_-])?(?:" + _KEY_WORDS + r")(?:[_-][\w.-]*)?[\"']?\s*[=:]\s*[\"']?)"
            r"([^\s\"'&,;}]{4,})"
        ),
        r"\1" + MASK,
    ),
    # command-line flags: --password VALUE, -p is too ambiguous to mask
    (re.compile(r"(?i)(--?(?:[\w-]*-)?(?:" + _KEY_WORDS + r")(?:-[\w-]*)?\s+[\"']?)([^\s\"']{4,})"), r"\1" + MASK),
    # provider and platform key shapes
    (re.compile(r"\bsk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{16,}"), MASK),  # OpenAI / Anthropic
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"), MASK),  # GitHub
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), MASK),  # GitLab
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), MASK),  # Slack
    (re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"), MASK),  # Stripe
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), MASK),  # Google API key
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),  # AWS access key id
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MASK),  # JWT
)


def redact_text(text: str) -> str:
    """``text`` with every secret shape listed in the module docstring replaced by ``[REDACTED]``."""
    if not text:
        return text
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text


def is_secret_name(name: str) -> bool:
    """True when a parameter or key called ``name`` holds a secret by its name alone."""
    return bool(SECRET_NAME.match(name))


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value with secret-named keys masked and secret shapes in strings masked."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "") else redact_value(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def redact_arguments(arguments: Mapping[str, Any], sensitive: Iterable[str] = ()) -> dict[str, Any]:
    """The arguments of a call as they may be shown or stored: the tool's ``sensitive`` parameters
    masked whole, then :func:`redact_value` over the rest."""
    hidden = set(sensitive)
    return {
        name: MASK if name in hidden and value not in (None, "") else redact_value({name: value})[name]
        for name, value in arguments.items()
    }
