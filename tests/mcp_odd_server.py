"""An MCP server with odd tools (tests/test_mcp_host_odd_servers.py). argv[1]: a flag file; when it exists at start,
the server hangs before answering initialize."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import BaseModel

if len(sys.argv) > 1 and os.path.exists(sys.argv[1]):
    time.sleep(3600)

server = MCPServer("odd")


class Point(BaseModel):
    x: int
    y: int


@server.tool()
def norm(p: Point, scale: int | None = None) -> str:
    """A pydantic model parameter ($defs/$ref) and an optional one."""
    return str((abs(p.x) + abs(p.y)) * (scale or 1))


@server.tool()
def big(n: int) -> str:
    return "x" * n


@server.tool()
def picture() -> CallToolResult:
    return CallToolResult(content=[ImageContent(type="image", data="aGVsbG8=", mime_type="image/png")])


@server.tool()
def structured_error() -> CallToolResult:
    return CallToolResult(content=[], structured_content={"reason": "quota"}, is_error=True)


@server.tool()
def mixed() -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text="a"), TextContent(type="text", text="b")],
                          structured_content={"k": 1})


@server.tool()
def hang() -> str:
    time.sleep(3600)
    return "never"


@server.tool()
def die() -> str:
    os._exit(5)


if __name__ == "__main__":
    server.run()
