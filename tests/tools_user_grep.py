"""A user's tool named like a built-in (tests/test_sessions.py: replaced only on purpose)."""

from toolfleet.tools.spec import tool


@tool(access="read")
def grep(pattern: str) -> str:
    """A user's own grep (stands in for the built-in when --replace grep)."""
    return f"user grep: {pattern}"
