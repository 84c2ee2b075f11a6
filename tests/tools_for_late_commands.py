"""Tools for tests/test_late_commands.py: ``run_command``'s pool process stops itself (SIGSTOP)
inside the handler, right before the command's sandbox starts, and a hosted MCP tool's right
before the call goes to its server: a GC pause, a VM stall between the handler's start and its
effect. Only in a worker started with ``TOOLFLEET_TEST_LATE_CMD_DIR`` set (a folder: the handler
leaves ``starting-<call id>``, or ``starting-mcp-<server>``, there before it stops)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from toolfleet.tools.context import ToolContext
from toolfleet.tools.spec import tool

_check_fence = ToolContext.check_fence


def _stop(call_id: str) -> None:
    folder = os.environ.get("TOOLFLEET_TEST_LATE_CMD_DIR")
    if folder:
        (Path(folder) / f"starting-{call_id}").touch()
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the test's SIGCONT


def _stop_then_check_fence(ctx):  # type: ignore[no-untyped-def]
    if ctx.tool_name == "run_command":  # its sandbox's argv built; the sandbox starts right after the check
        _stop(ctx.call_id)
    return _check_fence(ctx)


ToolContext.check_fence = _stop_then_check_fence

try:
    from toolfleet.integrations import mcp_host
except ImportError:  # no MCP SDK: the MCP test is skipped
    mcp_host = None  # type: ignore[assignment]
if mcp_host is not None:
    _hosted = mcp_host.hosted

    def _stop_then_hosted(name, argv):  # type: ignore[no-untyped-def]
        host = _hosted(name, argv)  # the server found (or started) for the call, which goes to it next
        _stop(f"mcp-{name}")
        return host

    mcp_host.hosted = _stop_then_hosted


@tool(access="read", timeout_s=30)
def late_cmd_echo(text: str) -> str:
    """Return ``text`` (a call to join on: the pool took it after the one before).

    Args:
        text: echoed back.
    """
    return text
