"""``toolfleet mcp serve`` (the fleet as an MCP server) and the ``--mcp NAME=COMMAND`` option of
``toolfleet worker`` (MCP servers hosted by workers). Both need the ``mcp`` extra.

Imported by :mod:`.cli` at its end; importing it registers ``mcp`` on the CLI's ``app``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .cli import NamespaceOpt, PolicyOpt, RedisOpt, ToolsOpt, _fail, _policy, _settings, app, err
from .errors import ConfigurationError, ToolfleetError

mcp_app = typer.Typer(help="MCP: the fleet as an MCP server (workers host MCP servers with `worker --mcp`).",
                      no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")


def _need_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigurationError("the MCP integration needs the `mcp` package: pip install 'toolfleet[mcp]'") from None


def host_servers(registry: Any, options: list[str]) -> None:
    """``worker --mcp``: add each hosted server's tools to ``registry``. Raises :class:`ConfigurationError`."""
    _need_mcp()
    from .integrations.mcp_host import add_hosted_servers

    added = add_hosted_servers(registry, options, lambda m: err.print(m, style="bold yellow", markup=False))
    err.print(f"hosting {len(options)} MCP server(s): {', '.join(s.name for s in added) or 'no tools'}",
              markup=False)


@mcp_app.command("serve")
def serve(
    redis_url: RedisOpt = None,
    namespace: NamespaceOpt = None,
    tools: ToolsOpt = None,
    policy: PolicyOpt = None,
    workspace: Annotated[Optional[Path], typer.Option(
        "--workspace", "-w", help="Directory the tools work in, as the workers see it.")] = None,
    session: Annotated[Optional[str], typer.Option(
        "--session", help="Session id of every call, whoever sends it (live shell, stored state, loop detection). "
        "Default: each MCP client its own (stdio: this process's; HTTP: mcp-<a hash of its Mcp-Session-Id>).")] = None,
    transport: Annotated[str, typer.Option("--transport", help='"stdio" (default) or "http" (streamable HTTP).'
                                           )] = "stdio",
    host: Annotated[str, typer.Option("--host", help="HTTP: address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="HTTP: port.")] = 8765,
    path: Annotated[str, typer.Option("--path", help="HTTP: endpoint path.")] = "/mcp",
    timeout_s: Annotated[float, typer.Option("--timeout", help="Longest wait for one call's result, seconds "
                                             "(then the call is cancelled).")] = 600.0,
) -> None:
    """Serve the fleet's tools to MCP clients; each tools/call runs on the fleet's workers.

    The tools are the built-in ones plus --tools modules, plus the tools the live workers publish
    that those lack (the NAME__tool of hosted MCP servers)."""
    import anyio

    from .dispatcher.client import Dispatcher
    from .tools.registry import default_registry

    if transport not in ("stdio", "http"):
        _fail(ConfigurationError(f"--transport must be stdio or http, not {transport!r}"))
    try:
        _need_mcp()
        from .integrations.mcp_host import with_live_tools
        from .integrations.mcp_server import build_server, serve_http, serve_stdio

        settings = _settings(redis_url, namespace)
        registry = with_live_tools(default_registry(tools or []), settings)
        dispatcher = Dispatcher(settings, registry, _policy(policy))
    except ToolfleetError as exc:
        _fail(exc)
    own_session = session is None and transport == "stdio"  # one client per process: a session of its own
    if own_session:
        session = f"mcp-{uuid.uuid4().hex}"
    server = build_server(dispatcher, workspace=str(workspace) if workspace else None, session_id=session,
                          timeout_s=timeout_s, refresh=lambda: with_live_tools(registry, settings))
    try:
        if transport == "stdio":
            anyio.run(serve_stdio, server)
        else:
            err.print(f"MCP (streamable HTTP) at http://{host}:{port}{path}", markup=False)
            if host not in ("127.0.0.1", "localhost", "::1"):
                err.print("warning: no authentication: whoever reaches this address can run the fleet's tools; "
                          "put it behind an authenticating proxy", style="bold yellow", markup=False)
            if session is not None:
                err.print(f"warning: every HTTP client shares session {session} (its live shell, stored state and "
                          "loop history); without --session each client has its own", style="bold yellow",
                          markup=False)
            serve_http(server, host, port, path)
    except KeyboardInterrupt:
        pass
    finally:
        if own_session:  # its live shell and stored states end with the client (best effort: else their TTL)
            try:
                dispatcher.close_session(session)
            except ToolfleetError:
                pass
        dispatcher.close()
