"""MCP both ways, offline: an MCP client (the official SDK's) talks to ``toolfleet mcp serve`` over stdio;
each call runs on the fleet, including the tools of an MCP server that a worker hosts.

    toolfleet up -d                                                      # the local stack
    toolfleet worker --mcp "tiny=python examples/mcp_tiny_server.py" &   # a worker hosting an MCP server
    python examples/mcp_client_example.py
    toolfleet down; kill %1

Any MCP client works the same way: point it at ``toolfleet mcp serve -w DIR`` (stdio) or at
``toolfleet mcp serve --transport http --port 8765`` (``http://127.0.0.1:8765/mcp``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters


async def main() -> None:
    workspace = Path(tempfile.mkdtemp()) / "workspace"
    shutil.copytree(Path(__file__).parent / "cases" / "workspace", workspace)
    serve = StdioServerParameters(command=sys.executable,
                                  args=["-m", "toolfleet", "mcp", "serve", "--workspace", str(workspace)],
                                  env=dict(os.environ))  # the SDK passes only a safe subset by default
    async with Client(serve) as client:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        print("tools:", ", ".join(tools))
        result = await client.call_tool("list_dir", {"path": "src"})
        print("\nlist_dir src ->", result.content[0].text)
        if "tiny__add" in tools:  # served by the worker that hosts examples/mcp_tiny_server.py
            for name, arguments in (("tiny__add", {"a": 2, "b": 40}), ("tiny__whoami", {})):
                result = await client.call_tool(name, arguments)
                print(f"{name} -> {result.content[0].text}")
        else:
            print("(no worker hosts tiny: start one with --mcp to call tiny__add through the fleet)")


if __name__ == "__main__":
    anyio.run(main)
