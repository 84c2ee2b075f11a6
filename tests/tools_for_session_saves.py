"""Tools for tests/test_session_lives.py: a session state whose save waits at a gate (a file),
so a stop lands while the worker writes it."""

from __future__ import annotations

import os

from pydantic import BaseModel, field_serializer

from toolfleet import ToolContext
from toolfleet.tools.spec import tool
from toolfleet.tools.state import SessionState


class GatedSave(BaseModel):
    """A state whose JSON form waits at a gate (a file path) once: a save that takes long, so a
    cancel's interrupt or the soft time limit lands while the worker makes it."""

    count: int = 0
    gate: str = ""

    @field_serializer("gate")
    def _wait_at_gate(self, gate: str) -> str:
        import time

        if gate and not os.path.exists(gate + ".passed"):
            open(gate + ".at", "w").close()
            deadline = time.monotonic() + 30
            while not os.path.exists(gate + ".go") and time.monotonic() < deadline:
                time.sleep(0.01)
            open(gate + ".passed", "w").close()
        return gate


GATED = SessionState("gated", GatedSave)


def _bump(ctx: ToolContext, gate: str) -> str:
    ctx.session.count += 1
    ctx.session.gate = gate
    return f"count={ctx.session.count}"


@tool(state=GATED, loop_check=False, timeout_s=60)
def gated_bump(ctx: ToolContext, gate: str) -> str:
    """Add one; the save waits at ``gate`` (a file path) while it writes the state.

    Args:
        gate: path of the gate's files.
    """
    return _bump(ctx, gate)


@tool(state=GATED, loop_check=False, timeout_s=1)
def gated_bump_1s(ctx: ToolContext, gate: str) -> str:
    """As gated_bump, with a 1 s time limit: the soft limit lands while the state is written.

    Args:
        gate: path of the gate's files.
    """
    return _bump(ctx, gate)


@tool(state=GATED, access="read", loop_check=False)
def gated_count(ctx: ToolContext, nonce: str = "") -> str:
    """The gated state's count.

    Args:
        nonce: ignored (a new one per call: no loop).
    """
    return str(ctx.session.count)
