"""Tools only the tests register (workers load them with ``--tools tests.tools_for_tests``)."""

from __future__ import annotations

import time

from toolfleet import ToolContext, tool
from toolfleet.tools.resources import path_resource


@tool(access="read", resources=lambda a: [f"key:{a['label']}"], timeout_s=30)
def wait_read(ctx: ToolContext, label: str, seconds: float = 0.0) -> str:
    """Wait (cooperatively) then return the label; a read of resource key:<label>.

    Args:
        label: Echoed back; also the resource it reads.
        seconds: How long to wait.
    """
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"read {label}"


@tool(access="write", resources=lambda a: [f"key:{a['label']}"], timeout_s=30)
def wait_write(ctx: ToolContext, label: str, seconds: float = 0.0) -> str:
    """Wait (cooperatively) then return the label; a write of resource key:<label>.

    Args:
        label: Echoed back; also the resource it writes.
        seconds: How long to wait.
    """
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"wrote {label}"


@tool(access="read", resources=lambda a: [], timeout_s=30)
def stubborn_sleep(seconds: float) -> str:
    """Sleep without looking at the cancel signal (stopped only by the worker's interrupt).

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "slept"


@tool(access="read", resources=lambda a: [], timeout_s=1)
def swallowing_sleep(seconds: float) -> str:
    """Sleep and swallow every Exception (so only the hard time limit stops it).

    Args:
        seconds: How long to sleep.
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except Exception:  # noqa: BLE001 - the point of this tool
            pass
    return "slept"


@tool(access="read", resources=lambda a: [])
def boom(message: str) -> str:
    """Raise a RuntimeError with the message.

    Args:
        message: The error message.
    """
    raise RuntimeError(message)


@tool(access="read", resources=lambda a: [])
def structured(n: int) -> dict:
    """Return structured data.

    Args:
        n: How many items.
    """
    return {"items": list(range(n))}


@tool(access="write", resources=lambda a: [path_resource(a["path"])], timeout_s=10)
def append_line(ctx: ToolContext, path: str, line: str) -> str:
    """Append one line to a workspace file (read-modify-write, to expose interleaving).

    Args:
        path: File path relative to the workspace.
        line: The line to append.
    """
    from toolfleet.tools.workspace import resolve_path

    target = resolve_path(ctx, path)
    before = target.read_text() if target.exists() else ""
    time.sleep(0.01)
    target.write_text(before + line + "\n")
    return f"appended {line}"


@tool(access="read", resources=lambda a: [f"job:{a['job']}"], timeout_s=10, pollable=True, poll_interval_s=0.05)
def job_status(ctx: ToolContext, job: str) -> str:
    """Report a (pretend) job's status; takes 0.1 s, like a real status check.

    Args:
        job: The job id.
    """
    ctx.cancelled.wait(0.1)
    return f"job {job}: running"


@tool(access="write", resources=lambda a: [f"api:{a['endpoint']}"], sensitive=("api_token",), timeout_s=10)
def call_api(endpoint: str, api_token: str, payload: str = "") -> str:
    """Pretend to call an API with a token (a declared sensitive parameter).

    Args:
        endpoint: The endpoint.
        api_token: The secret token.
        payload: What to send.
    """
    return f"called {endpoint} with a token of {len(api_token)} characters"
