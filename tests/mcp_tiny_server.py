"""A tiny MCP server written with the official SDK (stdio), hosted by a worker in tests/test_mcp_host.py.
Its arguments are ignored: the tests put a marker there to find its processes in /proc."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("tiny")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


STARTED = uuid.uuid4().hex  # one per server process: a restarted server answers another


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """This server process's own id (its pid is 2 or so in the PID namespace the worker gives it)."""
    return STARTED


@server.tool()
def spawn(seconds: str) -> str:
    """Start ``sleep seconds`` in a session of its own (out of the server's process group) and return."""
    subprocess.Popen(["sleep", seconds], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return "spawned"


@server.tool()
def note(path: str, text: str, seconds: float = 0.0) -> str:
    """Append a line to a file after waiting (a write: no readOnlyHint)."""
    time.sleep(seconds)
    with open(path, "a") as handle:
        handle.write(text + "\n")
    return f"noted {text}"


@server.tool()
def crash() -> str:
    """Exit the server process at once (to show the worker starts it again)."""
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail(message: str) -> str:
    """Raise, so the MCP result is an error."""
    raise ValueError(message)


if __name__ == "__main__":
    server.run()
