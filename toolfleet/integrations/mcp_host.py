"""Workers host MCP servers: ``toolfleet worker --mcp NAME=COMMAND`` serves that server's tools as fleet tools.

At start the worker runs ``COMMAND`` (a stdio MCP server, split like a shell would, never run by a shell),
lists its tools with the official ``mcp`` client and registers each as the fleet tool ``NAME__tool`` (the
namespacing MCP clients commonly use) built with :func:`~toolfleet.tools.tool_from_schema` from the tool's
JSON Schema input. Access: a ``read`` when the MCP tool's annotations say ``readOnlyHint``, else a ``write``
on everything (the safe default of docs/design.md, "Plan"); a write is idempotent only with ``idempotentHint``,
otherwise journaled (a redelivered call is never run twice). Each tool's queue is its own name, so its calls
reach only workers that host the server (a worker consumes only the queues of the tools it serves).

The server process lives on the worker: each pool process starts its own copy on its first call and keeps
it (a stdio session on a background event loop). Before each call it is pinged (bound
:data:`PING_TIMEOUT_S`); a server that died is started again, so the call runs on a fresh copy. A server
that dies *during* a call makes that call an ``EXECUTION_ERROR`` saying so (not re-run: its effect is
unknown); the next call restarts it.

A call that is cancelled (its turn), or reaches its time limit, while the server runs it stops the server:
its process group gets SIGTERM, SIGKILL :data:`TERM_GRACE_S` later, and the answer (``CANCELLED``,
``TIMEOUT``) is given only once the group is gone (an MCP server may act outside the sandbox, and a
server's sync tool runs on when only the request is cancelled). A group still there
:data:`KILL_WAIT_S` after the SIGKILL makes the call ``OUTCOME_UNKNOWN``. The next call starts the server
again. On Linux a server is started with ``PR_SET_PDEATHSIG`` (SIGKILL): it dies with the pool process
that hosts it, however that ends (a warm shutdown, SIGKILL, a crash), also when a call still blocks it
and it would not exit on the end of its input; and in a PID namespace of its own (:mod:`.server_processes`),
so every process it started dies with it too (without bubblewrap, the server process only: said at start).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import CallCancelled, ConfigurationError, ToolFailure
from ..tools import sandbox
from ..tools.context import ToolContext, check_fence_before_start
from ..tools.registry import Registry
from ..tools.spec import GROUP_SEPARATOR as SEPARATOR
from ..tools.spec import ToolSpec, tool_from_schema
from .server_processes import confined, dying_with, group_alive

START_TIMEOUT_S = 30.0  # start + initialize + list tools of one server, at worker start
PING_TIMEOUT_S = 5.0  # liveness check before each call
TERM_GRACE_S = 0.1  # an interrupted call's server: between SIGTERM and SIGKILL of its process group (s)
KILL_WAIT_S = 2.0  # after the SIGKILL: how long the group may take to be gone before the call is OUTCOME_UNKNOWN
POLL_S = 0.02  # how often a call's wait looks at its cancel signal (s)
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")


def parse_option(text: str) -> tuple[str, list[str]]:
    """``NAME=COMMAND`` -> ``(NAME, argv)``. Raises :class:`ConfigurationError` for a missing ``=``,
    a name that is not 1-40 of ``[a-zA-Z0-9_-]`` or holds ``__``, or an empty or unparsable command."""
    name, sep, command = text.partition("=")
    name = name.strip()
    if not sep or not _NAME.match(name) or SEPARATOR in name:
        raise ConfigurationError(f"--mcp {text!r}: expected NAME=COMMAND with NAME of [a-zA-Z0-9_-] (no '__')")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigurationError(f"--mcp {name}: cannot split the command: {exc}") from exc
    if not argv:
        raise ConfigurationError(f"--mcp {name}: the command is empty")
    return name, argv


class _ServerLoop(asyncio.SelectorEventLoop):
    """The event loop of a :class:`HostedServer`: it keeps the transports of the processes it
    starts (the server's, started by the SDK's stdio client), and starts each so that it dies
    with this process (:func:`.server_processes.dying_with`)."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[Any] = []  # subprocess transports, oldest first

    async def subprocess_exec(self, protocol_factory: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("preexec_fn") is None:
            kwargs["preexec_fn"] = dying_with(os.getpid())
        transport, protocol = await super().subprocess_exec(protocol_factory, *args, **kwargs)
        self.processes = [t for t in self.processes if t.get_returncode() is None] + [transport]
        return transport, protocol


def _bwrap_binary() -> str:
    """The bubblewrap the worker's sandbox uses (``TOOLFLEET_BWRAP``), else ``bwrap``."""
    config = sandbox.current().config
    return config.bwrap if config.mode == "bwrap" else "bwrap"


class HostedServer:
    """One MCP server process over stdio, driven from any thread through a private event loop."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self.name, self.argv, self.env = name, argv, dict(env or {})
        self.command, self.unconfined = confined(argv, _bwrap_binary())  # unconfined: why no PID namespace
        self.starts = 0
        self._loop = _ServerLoop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"mcp-{name}")
        self._thread.start()
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._session_task: asyncio.Future | None = None
        self._lock = asyncio.Lock()

    def run(self, coro: Any, timeout_s: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except BaseException:  # a time limit or signal in the calling thread: stop the coroutine too
            future.cancel()
            raise

    def call(self, tool: str, arguments: Mapping[str, Any], timeout_s: float, ctx: ToolContext | None = None) -> Any:
        """Call the MCP tool ``tool`` and return its MCP result, waiting at most ``timeout_s`` seconds.

        Interrupted while the server runs it (``ctx`` cancelled, a signal's exception in this thread:
        the soft time limit, the cancel watcher's :class:`~toolfleet.errors.CallCancelled`; or
        ``timeout_s`` over), the server process is stopped (:meth:`stop_processes`) before this
        answers: :class:`~toolfleet.errors.CallCancelled` for a cancel, the signal's exception as it
        came, :class:`ToolFailure` ``TIMEOUT`` for ``timeout_s``; the next call starts the server
        again. When the process cannot be confirmed gone, :class:`ToolFailure` ``OUTCOME_UNKNOWN``
        (for a shutdown's ``SystemExit``/``KeyboardInterrupt``: that exception). Raises
        :class:`ToolFailure` ``EXECUTION_ERROR`` when the session fails during the call."""
        future = asyncio.run_coroutine_threadsafe(self.call_tool(tool, arguments), self._loop)
        deadline = time.monotonic() + timeout_s
        interrupted: BaseException | None = None
        try:
            while interrupted is None:
                try:
                    return future.result(POLL_S)
                except concurrent.futures.TimeoutError:
                    if future.done():
                        raise  # the call's own outcome
                if ctx is not None and ctx.cancelled.is_set():
                    interrupted = CallCancelled(ctx.cancel_reason or "the turn was cancelled")
                elif time.monotonic() >= deadline:
                    interrupted = ToolFailure(f"MCP server {self.name}: no answer within {timeout_s:g} s",
                                              "ask for less work per call", code="TIMEOUT")
        except BaseException as exc:
            if future.done() and not future.cancelled():
                raise
            interrupted = exc
        future.cancel()
        if not self.stop_processes():
            if not isinstance(interrupted, CallCancelled | Exception):
                raise interrupted
            raise ToolFailure(
                f"MCP server {self.name}: the call was interrupted ({type(interrupted).__name__}: {interrupted}) "
                f"while the server ran it, and its process did not end within {KILL_WAIT_S:g} s of SIGKILL; "
                "whether the call took effect, or still will, is unknown",
                "check the real state before repeating it", code="OUTCOME_UNKNOWN") from None
        asyncio.run_coroutine_threadsafe(self._reset(), self._loop)  # the next call starts it again
        if isinstance(interrupted, CallCancelled):
            raise CallCancelled(f"{interrupted}; the MCP server {self.name} was stopped (its process ended) and "
                                "is started again for the next call", output=interrupted.output) from None
        raise interrupted

    def stop_processes(self) -> bool:
        """Stop this server's processes still running (each one's process group): SIGTERM, then
        SIGKILL :data:`TERM_GRACE_S` later. Returns whether every group is gone (waited for up to
        :data:`KILL_WAIT_S` after the SIGKILL). Safe from any thread."""
        groups = [t.get_pid() for t in list(self._loop.processes) if t.get_returncode() is None]
        for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
            for pgid in groups:
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            until = time.monotonic() + wait_s
            while (groups := [g for g in groups if group_alive(g)]) and time.monotonic() < until:
                time.sleep(0.01)
            if not groups:
                return True
        return False

    async def _reset(self) -> None:
        async with self._lock:
            await self._close()

    async def _open(self) -> None:
        from mcp import Client, StdioServerParameters

        ready: asyncio.Future = self._loop.create_future()
        self._stop = asyncio.Event()
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env or None)

        async def hold() -> None:  # the Client's context must be entered and left in one task
            try:
                async with Client(params, mode="legacy") as client:  # the handshake era: ping works
                    self._client = client
                    ready.set_result(None)
                    await self._stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
            finally:
                self._client = None

        self._session_task = asyncio.ensure_future(hold())
        self.starts += 1
        try:
            await asyncio.wait_for(ready, START_TIMEOUT_S)
        except BaseException:
            await self._abort_start()
            raise

    async def _abort_start(self) -> None:
        """A start that failed or did not answer within :data:`START_TIMEOUT_S`: end its session and
        stop its process (one hanging before ``initialize`` would otherwise stay, one more per call)."""
        task, self._session_task, self._client = self._session_task, None, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=5.0)
        await asyncio.to_thread(self.stop_processes)

    async def _close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._session_task is not None:
            try:
                await asyncio.wait_for(self._session_task, 5.0)
            except BaseException:
                self._session_task.cancel()
        self._session_task = self._client = None

    async def _alive_client(self) -> Any:
        async with self._lock:
            if self._client is not None:
                try:
                    await asyncio.wait_for(self._client.send_ping(), PING_TIMEOUT_S)
                    return self._client
                except BaseException:  # died between calls: start it again
                    await self._close()
            await self._open()
            return self._client

    async def list_tools(self) -> list[Any]:
        client = await self._alive_client()
        return list((await client.list_tools()).tools)

    async def call_tool(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        try:
            client = await self._alive_client()
        except Exception as exc:  # it never reached the server: said so, not a bare TimeoutError
            why = str(exc) or f"no answer within {START_TIMEOUT_S:g} s"
            raise ToolFailure(f"MCP server {self.name} could not be started: {type(exc).__name__}: {why}; the call "
                              "did not reach it", "try again later; the server is started again for the next call"
                              ) from None
        try:
            return await client.call_tool(tool, dict(arguments))
        except Exception as exc:  # the session is in doubt (closed, broken, a protocol error): start afresh
            await self._close()
            raise ToolFailure(f"MCP server {self.name}: {type(exc).__name__}: {exc}; it is started again for "
                              "the next call", "the call's effect is unknown; check before repeating it") from None

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.run(self._close(), 10.0)
        except BaseException:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)


_hosted: dict[str, HostedServer] = {}  # per process: a pool process's own copies
_hosted_pid = os.getpid()
_hosted_lock = threading.Lock()


def hosted(name: str, argv: list[str]) -> HostedServer:
    """This process's :class:`HostedServer` for ``name`` (created on first use; a forked child never
    reuses its parent's)."""
    global _hosted_pid
    with _hosted_lock:
        if _hosted_pid != os.getpid():
            _hosted.clear()
            _hosted_pid = os.getpid()
        if name not in _hosted:
            _hosted[name] = HostedServer(name, argv)
        return _hosted[name]


@atexit.register
def _close_all() -> None:
    if _hosted_pid == os.getpid():
        for server in list(_hosted.values()):
            server.close()


def _content(result: Any) -> Any:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    others = [block.type for block in result.content if getattr(block, "type", None) != "text"]
    text = "\n".join(texts + ([f"[{len(others)} non-text block(s): {', '.join(others)}]"] if others else []))
    if result.is_error:
        if not texts and result.structured_content is not None:  # its only account of what went wrong
            text = "\n".join(filter(None, [json.dumps(result.structured_content, default=str), text]))
        raise ToolFailure(text or "the MCP tool reported an error", "")
    if result.structured_content is not None and not texts:
        return result.structured_content
    return text


def spec_for(server: str, argv: list[str], tool: Any, timeout_s: float = 60.0) -> ToolSpec:
    """The fleet tool ``server__tool`` for one MCP ``Tool``. Raises :class:`ConfigurationError` for a
    name providers refuse or an input schema that is not JSON Schema."""
    annotations = tool.annotations
    read = bool(annotations and annotations.read_only_hint)
    idempotent = read or bool(annotations and getattr(annotations, "idempotent_hint", None))
    mcp_name = tool.name

    def handler(_toolfleet_ctx: ToolContext, **arguments: Any) -> Any:
        host = hosted(server, argv)
        if not read:  # right before the effect: a stale execution (frozen, answered) sends the server nothing
            check_fence_before_start(_toolfleet_ctx, "the call to the MCP server")
        return _content(host.call(mcp_name, arguments, timeout_s + PING_TIMEOUT_S + START_TIMEOUT_S, _toolfleet_ctx))

    return tool_from_schema(f"{server}{SEPARATOR}{mcp_name}", tool.input_schema or {"type": "object"},
                            description=tool.description or "", handler=handler,
                            access="read" if read else "write", timeout_s=timeout_s, idempotent=idempotent,
                            risk="low" if read else "medium")


def load_server_tools(name: str, argv: list[str]) -> tuple[list[ToolSpec], list[str]]:
    """Start the server once, list its tools, stop it. Returns ``(specs, warnings)`` (a tool that cannot
    be a fleet tool is skipped with a warning). Raises :class:`ConfigurationError` when the server
    cannot be started or listed within :data:`START_TIMEOUT_S`."""
    if shutil.which(argv[0]) is None:  # said plainly: under bwrap it came back as an ExceptionGroup
        raise ConfigurationError(f"--mcp {name}: cannot start {shlex.join(argv)!r}: the command {argv[0]!r} was "
                                 "not found (not on PATH, or not an executable file)")
    server = HostedServer(name, argv)
    try:
        tools = server.run(server.list_tools(), START_TIMEOUT_S + 5)
    except BaseException as exc:
        raise ConfigurationError(f"--mcp {name}: cannot start {shlex.join(argv)!r} and list its tools: "
                                 f"{type(exc).__name__}: {exc}") from None
    finally:
        server.close()
    specs, warnings = [], []
    if server.unconfined:
        warnings.append(f"--mcp {name}: no PID namespace for the server ({server.unconfined}): processes it "
                        "starts may outlive a pool process that is killed")
    for tool in tools:
        try:
            specs.append(spec_for(name, argv, tool))
        except ConfigurationError as exc:
            warnings.append(f"--mcp {name}: tool {tool.name!r} skipped: {exc}")
    return specs, warnings


def add_hosted_servers(registry: Registry, options: Iterable[str], warn: Any = None) -> list[ToolSpec]:
    """Register the tools of every ``NAME=COMMAND`` in ``options`` on ``registry``. Raises
    :class:`ConfigurationError` (see :func:`parse_option`, :func:`load_server_tools`, duplicate names)."""
    added = []
    for text in options:
        name, argv = parse_option(text)
        specs, warnings = load_server_tools(name, argv)
        for message in warnings:
            (warn or (lambda m: print(m, file=sys.stderr)))(message)
        added += [registry.add(spec) for spec in specs]
    return added


def from_description(entry: Mapping[str, Any]) -> ToolSpec:
    """A dispatcher-side spec (no handler) from a worker catalog's tool description: the full
    published spec (:func:`toolfleet.tools.published.spec_from_description`: schema, access, the
    resources rule where it is declarative, else touching everything, limits)."""
    from ..tools.published import spec_from_description

    return spec_from_description(entry)


def with_live_tools(registry: Registry, settings: Any) -> Registry:
    """``registry`` plus the tools the live workers of ``settings.namespace`` publish that it lacks (the
    hosted MCP servers' ``NAME__tool``s): what a dispatcher needs to validate and plan their calls.
    Raises :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer."""
    from ..redis_client import connect
    from ..worker.catalog import live_catalog

    for entry in live_catalog(settings, connect(settings.ledger)):
        for description in entry["tools"]:
            if description["name"] not in registry:
                try:
                    registry.add(from_description(description))
                except ConfigurationError:
                    continue
    return registry
