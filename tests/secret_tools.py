"""Tools that quote their secret arguments back, for tests/test_secrets_flower.py (loaded by the
test's worker with ``--tools tests.secret_tools``)."""

from __future__ import annotations

import logging

from toolfleet import ToolFailure, tool
from toolfleet.tools.spec import tool_from_schema

log = logging.getLogger(__name__)


def _log_in(**arguments: str) -> str:
    # a careless tool: its failure message repeats every argument it was given
    raise ToolFailure(f"login refused for {arguments}", f"check pass {arguments.get('pass')} and try again")


log_in = tool_from_schema(
    "log_in",
    {"type": "object",
     "properties": {name: {"type": "string"} for name in ("user", "pass", "password", "token")},
     "required": ["user"]},
    description="Log in (always refused, quoting what it was given).",
    handler=_log_in,
    access="read",
    resources=lambda a: [],
)


@tool(access="read", resources=lambda a: [])
def open_db(dsn: str, password: str) -> str:
    """Open a database (always fails with an exception that quotes the password; logs the DSN)."""
    log.warning("open_db: connecting to %s", dsn)  # a careless log line: the DSN holds a password
    raise RuntimeError(f"could not connect to {dsn} with {password}")


@tool(access="read", resources=lambda a: [])
def show_config(text: str) -> dict:
    """Return ``text`` and a structured copy (the content and data the model reads)."""
    return {"config": text}
