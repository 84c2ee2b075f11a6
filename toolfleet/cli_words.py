"""The CLI's own words: the provider formats ``--format`` takes, library messages put in terms of
the CLI's flags, one-line errors, and usage lines that name arguments plainly (issue 15, point 7).
Used by :mod:`.cli`; imports nothing heavy (``--help`` reads it)."""

from __future__ import annotations

import re
from typing import Any

import typer

__all__ = ["FORMATS", "FORMAT_ALIASES", "FORMAT_HELP", "check_format", "cli_words", "one_line", "plain_argument_names"]


# The provider formats of toolfleet.dispatcher.adapters (ADAPTERS, then ALIASES), named here so that
# `--help` need not import the dispatcher (tests/test_newcomer.py checks they agree).
FORMATS = ("openai_chat", "openai_responses", "anthropic", "openai_chat_stream", "openai_responses_stream",
           "anthropic_stream")
FORMAT_ALIASES = ("chat", "responses", "messages", "anthropic_messages")
FORMAT_HELP = (f"Provider format: {', '.join(FORMATS)}; short names: {', '.join(FORMAT_ALIASES)}")

# Library messages speak to Python callers (keyword arguments, methods); the CLI says the same with
# its own flags (issue 15, point 7). Applied to every error the CLI prints.
_CLI_WORDS = (
    (re.compile(r"pass format= one of "), "pass --format, one of: "),
    (re.compile(r"unknown format ('[^']*'); known: "), r"unknown --format \1; choose one of: "),
    (re.compile(r" \(a list of events, or a \.jsonl file\) or feed events to Dispatcher\.open_stream"),
     " (a .jsonl file, one event a line)"),
    (re.compile(r"close it first or pass replace=True"), "close it first (`toolfleet sessions --close ID`)"),
    (re.compile(r"\bpass (\w+)=(?!\S)"), r"pass --\1"),
)


def cli_words(message: str) -> str:
    """``message`` with the Python API's wording (``pass format=``) put in the CLI's (``--format``)."""
    for pattern, words in _CLI_WORDS:
        message = pattern.sub(words, message)
    return message


def check_format(value: str | None) -> str | None:
    """``--format``'s callback: a known format or short name, else a usage error listing them."""
    if value is not None and value not in FORMATS + FORMAT_ALIASES:
        raise typer.BadParameter(f"unknown format {value!r}; choose one of: {', '.join(FORMATS + FORMAT_ALIASES)}")
    return value


# Settings fields whose value is a secret or may carry one (a Redis URL's password, a fleet key): their
# input is never quoted back whole (a URL is shown with its password masked, when that is sure to hold)
_SECRET_FIELD = re.compile(r"(?:^|_)(?:urls?|keys?|password|passwd|pass|secret|secrets|token|tokens|auth)(?:_|$)",
                           re.IGNORECASE)


def one_line(exc: ValueError) -> str:
    """A ValueError's message on one line; pydantic's ValidationError as ``field: message (got INPUT); ...``.

    No secret is quoted back: the input of a field that holds one (``fleet_key*``, ``*_url``,
    ``*password*``, a ``SecretStr``) is left out, except a URL, shown with its password masked
    (:func:`toolfleet.errors.shown_url_with_query`) and only when the password is then nowhere in it; a whole
    model's input (a dict: every setting) is never quoted; every text shown is passed through
    :func:`toolfleet.tools.redact.redact_text`, which also masks the secrets found in the inputs."""
    from .tools.redact import redact_text

    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return redact_text(" ".join(str(exc).split()))
    found = list(errors())
    known = [secret for e in found for secret in _secrets_in(e.get("loc") or (), e.get("input"))]
    lines = []
    for e in found:
        loc = tuple(e.get("loc") or ())
        shown = _shown_input(loc, e.get("input"), known)
        lines.append(f"{'.'.join(map(str, loc)) or 'value'}: {e['msg']}" + (f" (got {shown})" if shown else ""))
    return " ".join(redact_text("; ".join(lines), known).split())


def _is_secret_field(name: object) -> bool:
    from .tools.secret_shapes import is_secret_name

    return isinstance(name, str) and (bool(_SECRET_FIELD.search(name)) or is_secret_name(name))


def _secrets_in(loc: tuple[Any, ...], value: Any) -> list[str]:
    """The secret texts in ``value``, the input at ``loc``: the whole text of a secret field, the
    password of a URL (as written and unquoted), a ``SecretStr``'s value; a dict's secret fields."""
    from pydantic import SecretStr

    if isinstance(value, SecretStr):
        return [value.get_secret_value()]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _secrets_in((key,), item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _secrets_in(loc, item)]
    if not isinstance(value, str) or not (loc and _is_secret_field(loc[0])):
        return []
    return _url_passwords(value) if str(loc[0]).endswith("url") else [value]


def _url_passwords(url: str) -> list[str]:
    """What may be the password of ``url``: urllib's reading of it, and everything between the
    first ``:`` of the user part and the last ``@`` (what :func:`toolfleet.errors.shown_url` masks),
    each as written and percent-decoded; a ``password=`` query value."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    found: list[str] = []
    try:
        parts = urlsplit(url)
        found += [parts.password or "", *(v for k, v in parse_qsl(parts.query) if _is_secret_field(k))]
    except ValueError:
        pass
    rest = url.split("://", 1)[-1]
    if "@" in rest:
        userinfo = rest.rsplit("@", 1)[0]
        found.append(userinfo.split(":", 1)[1] if ":" in userinfo else userinfo)
    return [p for p in dict.fromkeys([*found, *map(unquote, found)]) if p]


def _shown_input(loc: tuple[Any, ...], value: Any, known: list[str]) -> str:
    """The input an error quotes back: ``repr`` of a plain value; a URL of a secret field with its
    password masked (nothing when a password is still in it); nothing for another secret field,
    a ``SecretStr``, or a whole model's (a dict or list: every setting at once)."""
    if not loc or isinstance(value, (dict, list, tuple)) or type(value).__name__ == "SecretStr":
        return ""
    if not _is_secret_field(loc[0]):
        return repr(value)
    if not isinstance(value, str) or "://" not in value or not str(loc[0]).endswith("url"):
        return ""
    from .errors import shown_url_with_query

    shown = shown_url_with_query(value)
    return "" if any(secret in shown for secret in [*_url_passwords(value), *known]) else repr(shown)


def plain_argument_names(command: Any) -> None:
    """Give every positional argument of ``command`` and its subcommands an upper-case metavar
    and a usage piece without typer's braces (``RESPONSE``, ``[NAME]`` when optional)."""
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "argument":
            name = param.metavar or (param.name or "arg").upper()
            param.metavar = name
            piece = (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else "")
            param.get_usage_pieces = lambda ctx, piece=piece: [piece]
    for sub in getattr(command, "commands", {}).values():
        plain_argument_names(sub)
