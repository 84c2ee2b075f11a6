"""A tiny MCP server written with the official SDK (stdio), hosted by a worker in tests/test_mcp_host.py."""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("tiny")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """The server's process id and the worker it runs under (its parent's process id)."""
    return f"{os.getpid()} {os.getppid()}"


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
