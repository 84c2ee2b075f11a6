"""A tiny MCP server written with the official SDK (stdio). Host it on a worker:

    toolfleet worker --mcp "tiny=python examples/mcp_tiny_server.py"

and its tools are fleet tools ``tiny__add`` and ``tiny__whoami``, run only on that worker.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("tiny")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """This server's process id and its parent's, as this process sees them: inside the sandbox
    (a PID namespace of its own) they read 2 and 1, not the host's ids."""
    return f"pid {os.getpid()}, parent {os.getppid()}"


if __name__ == "__main__":
    server.run()
