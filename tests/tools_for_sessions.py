"""Tools for tests/test_sessions.py and tests/test_session_state_json.py: a tool_from_schema
handler taking ctx, a function tool with a declared session state and its own formatter, and a
second state (a float meter) for sessions with two states."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from pydantic import BaseModel

from toolfleet import ToolContext
from toolfleet.tools.spec import tool, tool_from_schema
from toolfleet.tools.state import SessionState


def _whoami(ctx: ToolContext, greeting: str) -> dict:
    return {"greeting": greeting, "session": ctx.session_id, "tool": ctx.tool_name}


whoami = tool_from_schema(
    "whoami", {"type": "object", "properties": {"greeting": {"type": "string"}}, "required": ["greeting"]},
    handler=_whoami, access="read")


class Counter(BaseModel):
    count: int = 0
    seen: list[str] = []


COUNTER = SessionState("counter", Counter, max_bytes=2000)


@tool(state=COUNTER, formatter=lambda value: f"count={value['count']}", loop_check=False)
def bump(ctx: ToolContext, label: str = "") -> dict:
    """Add one to the session's counter (and remember the label).

    Args:
        label: text to remember; a label "boom" fails after counting, a long one overflows the state.
    """
    ctx.session.count += 1
    ctx.session.seen.append(label)
    if label == "boom":
        raise RuntimeError("failed after counting")
    return {"count": ctx.session.count, "seen": len(ctx.session.seen)}


@tool(state=COUNTER, loop_check=False)
def crash_bump(ctx: ToolContext) -> str:
    """Add 100 to the counter in memory, then die (SIGKILL of its own process) before the save."""
    ctx.session.count += 100
    os.kill(os.getpid(), signal.SIGKILL)
    return "not reached"


@tool(state=COUNTER, loop_check=False, timeout_s=60)
def slow_bump(ctx: ToolContext) -> str:
    """Add 100 to the counter in memory, then wait (up to 30 s) for the turn to be cancelled."""
    ctx.session.count += 100
    ctx.cancelled.wait(30)
    ctx.check_cancelled()
    return "not cancelled"


@dataclass
class Meter:
    total: float = 0.0
    log: list[str] = field(default_factory=list)


METER = SessionState("meter", Meter)


@tool(state=METER, resources=(), loop_check=False)
def meter_add(ctx: ToolContext, x: str) -> str:
    """Add float(x) to the session's meter.

    Args:
        x: a number as text ("nan" and "inf" too).
    """
    ctx.session.total += float(x)
    ctx.session.log.append(x)
    return repr(ctx.session.total)


@tool(state=METER, access="read", resources=(), loop_check=False)
def meter_get(ctx: ToolContext) -> str:
    """The session's meter as text: its total (repr) and log."""
    return f"{ctx.session.total!r} {ctx.session.log}"
