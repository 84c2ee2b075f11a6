"""The fleet as an MCP server (``toolfleet mcp serve``): every ``tools/call`` runs on the fleet.

Built on the official ``mcp`` SDK's low-level :class:`mcp.server.lowlevel.Server` (the tool list is the
fleet's registry, known only at run time, so the decorator-based ``MCPServer`` does not fit). Served over
stdio or streamable HTTP.

- ``tools/list``: one MCP ``Tool`` per fleet tool: its JSON Schema as ``inputSchema``, annotations from the
  spec (``readOnlyHint`` for reads, ``idempotentHint``, ``destructiveHint`` for every write: the fleet cannot
  tell a write only adds, and an idempotent one may overwrite or delete; ``false`` would say "only additive
  updates", which clients may let run without asking).
- ``tools/call``: one fleet turn of one call (an id ``mcp-<hex>``), in the server's workspace; the result's
  ``content`` is the one text block the client reads, ``isError`` when its status is ``error`` (the text
  starts with ``Error [CODE]``), its ``data`` as ``structuredContent`` when it is an object. Calls the
  policy holds for approval wait for ``toolfleet approve`` up to ``timeout_s``. A cancelled request
  (``notifications/cancelled``, a closed connection) cancels the turn. Two MCP calls are two turns:
  conflicting writes of concurrent calls are ordered by the fleet's cross-turn resource locks
  (:mod:`toolfleet.dispatcher.locks`), not by the plan of one batch.
- Sessions: with a fixed ``session_id`` every call is a turn of that session, whoever sent it. Without one,
  each MCP client has its own, so one client never sees another's live shell, stored state or loop history:
  over stdio, the process's one client (``toolfleet mcp serve`` makes it); over streamable HTTP, a
  handshake-era client's ``mcp-<hash of its Mcp-Session-Id>`` (:func:`client_session_id`; the SDK gives each client
  its own id and refuses another client's). A 2026-07-28 request carries no MCP session (the protocol made
  each request stand alone), so its call has no session, as does one over stateless HTTP.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

from ..errors import ToolfleetError
from ..models import ErrorCode, ToolCall, ToolResult


def mcp_tool(spec: Any) -> types.Tool:
    """The MCP ``Tool`` describing a fleet :class:`~toolfleet.ToolSpec`."""
    read = spec.access == "read"
    return types.Tool(
        name=spec.name, description=spec.description or spec.name, input_schema=spec.parameters,
        annotations=types.ToolAnnotations(read_only_hint=read, idempotent_hint=bool(spec.idempotent),
                                          destructive_hint=None if read else True),
    )


def mcp_result(result: ToolResult) -> types.CallToolResult:
    """The MCP ``CallToolResult`` of a fleet result."""
    structured = result.data if isinstance(result.data, dict) else None
    return types.CallToolResult(content=[types.TextContent(type="text", text=result.content)],
                                structured_content=structured, is_error=not result.ok)


async def run_call(dispatcher: Any, name: str, arguments: dict[str, Any] | None, *, workspace: str | None,
                   session_id: str | None, timeout_s: float) -> ToolResult:
    """Run one call on the fleet from async code; the wait is bounded by ``timeout_s`` (then the turn is
    cancelled and its final result, ``CANCELLED``/``NOT_EXECUTED``, returned). Cancelling the awaiting
    task cancels the turn. Never raises for the call's own failure: that is the result."""
    call = ToolCall(id=f"mcp-{uuid.uuid4().hex[:16]}", name=name, arguments=arguments or {})
    try:
        turn = await anyio.to_thread.run_sync(partial(dispatcher.submit, [call], workspace=workspace,
                                                      session_id=session_id))
    except ToolfleetError as exc:
        return ToolResult.failure(call.id, name, ErrorCode.TOOL_UNAVAILABLE, f"the fleet did not take the call: {exc}",
                                  "try again once Redis and the workers answer")
    try:
        return (await anyio.to_thread.run_sync(partial(turn.results, timeout_s), abandon_on_cancel=True))[0]
    except TimeoutError:  # the turn was cancelled: its final result comes within the cancel grace
        try:
            return (await anyio.to_thread.run_sync(partial(turn.results, 30.0)))[0]
        except (TimeoutError, ToolfleetError) as exc:
            return turn.result(call.id) or ToolResult.failure(
                call.id, name, ErrorCode.NOT_EXECUTED, f"no result within {timeout_s} s: {exc}", "")
    except ToolfleetError as exc:
        return turn.result(call.id) or ToolResult.failure(call.id, name, ErrorCode.NOT_EXECUTED, str(exc), "")
    except BaseException:  # the request was cancelled: so is the turn
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(turn.cancel, "the MCP request was cancelled")
            except ToolfleetError:
                pass
        raise


def client_session_id(ctx: Any) -> str | None:
    """``mcp-<hash>`` for the MCP session of the client whose request ``ctx`` carries (the
    ``Mcp-Session-Id`` header of streamable HTTP, MCP spec "Session Management"), or ``None`` (stdio,
    stateless HTTP). A hash, never the header itself: a session id is seen in Flower, logs and
    ``toolfleet sessions``, and the header is what lets a request speak for that client."""
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    value = headers.get("mcp-session-id") if headers is not None else None
    return f"mcp-{hashlib.sha256(value.encode()).hexdigest()[:32]}" if value else None


def needs_session(spec: Any) -> bool:
    """Whether a call of ``spec`` (a :class:`~toolfleet.ToolSpec` or ``None``) runs only in a session:
    a live tool (the ``shell``) or one with stored state."""
    from ..worker.affinity import LIVE_TOOLS

    return spec is not None and (spec.name in LIVE_TOOLS or getattr(spec, "state", None) is not None)


def build_server(dispatcher: Any, *, workspace: str | None = None, session_id: str | None = None,
                 timeout_s: float = 600.0, name: str = "toolfleet", refresh: Callable[[], Any] | None = None
                 ) -> Server:
    """An MCP server whose tools are ``dispatcher.registry``'s, each call run on the fleet
    (:func:`run_call`). ``workspace`` as in :meth:`~toolfleet.Dispatcher.open_turn`; ``session_id`` the
    session of every call, or ``None``: each MCP client's own (:func:`client_session_id`).
    ``refresh`` (run in a thread) adds tools to the registry before each ``tools/list`` and before a call
    of a name it lacks, e.g. :func:`~toolfleet.integrations.mcp_host.with_live_tools`; its
    :class:`~toolfleet.errors.ToolfleetError` is ignored (the tools known so far are served)."""

    async def _refresh() -> None:
        if refresh is not None:
            try:
                await anyio.to_thread.run_sync(refresh)
            except ToolfleetError:
                pass

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        await _refresh()
        return types.ListToolsResult(tools=[mcp_tool(spec) for spec in list(dispatcher.registry)])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in dispatcher.registry:
            await _refresh()
        arguments = params.arguments if isinstance(params.arguments, dict) else None
        session = session_id or client_session_id(ctx)
        if session is None and needs_session(dispatcher.registry.get(params.name)):
            return mcp_result(ToolResult.failure(
                "mcp", params.name, ErrorCode.INVALID_ARGUMENT,
                f"the tool {params.name} keeps state per session, and this MCP request has none (the 2026-07-28 "
                "protocol has no MCP session); it did not run",
                "start `toolfleet mcp serve` with --session ID, or connect with a handshake-era client (the "
                "Python SDK's Client(url, mode=\"legacy\")): each such client has a session of its own"))
        result = await run_call(dispatcher, params.name, arguments, workspace=workspace, session_id=session,
                                timeout_s=timeout_s)
        return mcp_result(result)

    from .. import __version__

    return Server(name, version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(server: Server) -> None:
    """Serve one client over this process's stdin/stdout until it closes."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(server: Server, host: str, port: int, path: str = "/mcp") -> None:
    """Serve streamable HTTP at ``http://host:port/path`` until interrupted (uvicorn). For a local host
    the SDK's DNS-rebinding protection is on."""
    import uvicorn

    app = server.streamable_http_app(streamable_http_path=path, host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
