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


def one_line(exc: ValueError) -> str:
    """A ValueError's message on one line; pydantic's ValidationError as ``field: message; ...``."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']} (got {e.get('input')!r})"
                         for e in errors())
    return " ".join(str(exc).split())


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
