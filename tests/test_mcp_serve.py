"""``toolfleet mcp serve``: the official ``mcp`` client against the fleet as an MCP server (stdio and
streamable HTTP); each call runs on a real worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

from .conftest import ROOT, TEST_TOOLS  # noqa: E402


def serve_argv(settings, workspace, *extra: str) -> list[str]:
    return [sys.executable, "-m", "toolfleet", "mcp", "serve", "--redis-url", settings.redis_url,
            "--namespace", settings.namespace, "--tools", TEST_TOOLS, "--workspace", str(workspace), *extra]


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


async def exercise(client: Client, workspace) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert {"read_file", "write_file", "wait_read", "wait_write"} <= tools.keys()
    assert tools["wait_read"].annotations.read_only_hint is True
    assert tools["write_file"].annotations.read_only_hint is False
    assert tools["wait_read"].input_schema["required"] == ["label"]

    result = await client.call_tool("wait_read", {"label": "a"})
    assert not result.is_error and text(result) == "read a"
    result = await client.call_tool("write_file", {"path": "made-by-mcp.txt", "content": "hello\n"})
    assert not result.is_error, text(result)
    assert (workspace / "made-by-mcp.txt").read_text() == "hello\n"  # ran on the worker, in the workspace
    result = await client.call_tool("read_file", {"path": "made-by-mcp.txt"})
    assert not result.is_error and "hello" in text(result)

    result = await client.call_tool("wait_read", {"nope": 1})
    assert result.is_error and text(result).startswith("Error [INVALID_ARGUMENT]")
    result = await client.call_tool("no_such_tool", {})
    assert result.is_error and text(result).startswith("Error [UNKNOWN_TOOL]")
    result = await client.call_tool("structured", {"n": 3})
    assert not result.is_error and isinstance(result.structured_content, dict)


def test_an_mcp_client_over_stdio_runs_calls_on_the_fleet(settings, worker, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    params = StdioServerParameters(command=sys.executable, args=serve_argv(settings, workspace)[1:], env=env(),
                                   cwd=str(ROOT))

    async def main() -> None:
        with anyio.fail_after(120):
            async with Client(params) as client:
                await exercise(client, workspace)

    anyio.run(main)


def test_cancelling_an_mcp_request_cancels_the_fleet_call(settings, start_worker, tmp_path):
    start_worker(concurrency=1)  # one process: the next call would wait behind a call that was not stopped
    params = StdioServerParameters(command=sys.executable, args=serve_argv(settings, tmp_path)[1:], env=env(),
                                   cwd=str(ROOT))

    async def main() -> float:
        with anyio.fail_after(120):
            async with Client(params) as client:
                started = time.monotonic()
                with anyio.move_on_after(1.5):  # the client gives up: the SDK sends notifications/cancelled
                    await client.call_tool("count_until_cancelled", {"seconds": 30})
                # the worker is free again at once: the next call is not queued behind a 30 s call
                result = await client.call_tool("wait_read", {"label": "after"})
                assert text(result) == "read after"
                return time.monotonic() - started

    assert anyio.run(main) < 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_mcp_client_over_streamable_http_runs_calls_on_the_fleet(settings, worker, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    port = _free_port()
    proc = subprocess.Popen(serve_argv(settings, workspace, "--transport", "http", "--port", str(port)),
                            env=env(), cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the server is up once its port accepts a connection
            assert proc.poll() is None, "mcp serve exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "mcp serve did not listen within 60 s"
                time.sleep(0.1)

        async def main() -> None:
            with anyio.fail_after(120):
                async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                    await exercise(client, workspace)

        anyio.run(main)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve_http(settings, workspace, *extra: str) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen(serve_argv(settings, workspace, "--tools", "tests.tools_for_sessions", "--transport",
                                       "http", "--port", str(port), *extra),
                            env=env(), cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:  # the server is up once its port accepts a connection
        assert proc.poll() is None, f"mcp serve exited: {proc.stderr.read()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            assert time.monotonic() < deadline, "mcp serve did not listen within 60 s"
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=20)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


async def _sessions_seen(url, clients: int, mode: str = "auto") -> list[list[str | None]]:
    """For each of ``clients`` MCP clients in turn, the session ids two ``whoami`` calls ran in."""
    seen = []
    for n in range(clients):
        async with Client(url, mode=mode) as client:
            calls = [await client.call_tool("whoami", {"greeting": f"c{n}-{i}"}) for i in range(2)]
            assert not any(r.is_error for r in calls), [text(r) for r in calls]
            seen.append([r.structured_content["session"] for r in calls])
    return seen


async def _stateful_call(url, mode: str):
    async with Client(url, mode=mode) as client:
        return await client.call_tool("bump", {"label": "x"})


def test_each_mcp_http_client_has_a_session_of_its_own(settings, start_worker, tmp_path):
    """Two HTTP clients of one server never share a session (a live shell, stored state, loop history):
    a handshake-era client's calls run in ``mcp-<hash of its Mcp-Session-Id>``; a 2026-07-28 client has no MCP
    session (each request stands alone), so its calls have none. With ``--session S`` every call is S's,
    and the server says at start that its clients share it."""
    start_worker(args=["--tools", "tests.tools_for_sessions"])
    proc, port = _serve_http(settings, tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        legacy = anyio.run(_sessions_seen, url, 2, "legacy")
        modern = anyio.run(_sessions_seen, url, 1, "2026-07-28")
        stateful = anyio.run(_stateful_call, url, "2026-07-28")
    finally:
        _stop(proc)
    # a tool that runs only in a session, called with none: refused here, with what an MCP user can do
    assert stateful.is_error and text(stateful).startswith("Error [INVALID_ARGUMENT]")
    assert "--session" in text(stateful) and 'mode="legacy"' in text(stateful)
    (a1, a2), (b1, b2) = legacy
    assert a1 == a2 and b1 == b2, legacy  # one client: one session across its calls
    assert a1.startswith("mcp-") and b1.startswith("mcp-") and a1 != b1, legacy
    assert modern == [[None, None]]

    proc, port = _serve_http(settings, tmp_path, "--session", "shared-s")
    try:
        seen = anyio.run(_sessions_seen, f"http://127.0.0.1:{port}/mcp", 2)
    finally:
        log = _stop(proc)
    assert seen == [["shared-s"] * 2] * 2
    assert "every HTTP client shares session shared-s" in log


def test_an_mcp_stdio_server_gives_its_client_one_session(settings, start_worker, tmp_path):
    start_worker(args=["--tools", "tests.tools_for_sessions"])
    argv = serve_argv(settings, tmp_path, "--tools", "tests.tools_for_sessions")
    params = StdioServerParameters(command=sys.executable, args=argv[1:], env=env(), cwd=str(ROOT))
    seen = anyio.run(_sessions_seen, params, 1)
    assert seen[0][0] == seen[0][1] and seen[0][0].startswith("mcp-"), seen


def test_a_client_session_id_never_shows_the_mcp_session_id_itself():
    """The toolfleet session id shows in Flower, logs and ``toolfleet sessions``; the Mcp-Session-Id
    header is what lets a request speak for its client: only a hash of it is shown."""
    from types import SimpleNamespace

    from toolfleet.integrations.mcp_server import client_session_id

    header = "0f3c9a7e5b1d4c2a8e6f0b9d7c5a3e1f"
    sid = client_session_id(SimpleNamespace(request=SimpleNamespace(headers={"mcp-session-id": header})))
    other = client_session_id(SimpleNamespace(request=SimpleNamespace(headers={"mcp-session-id": header[::-1]})))
    assert sid is not None and sid.startswith("mcp-") and header not in sid and header[:8] not in sid
    assert other != sid and client_session_id(SimpleNamespace(request=None)) is None


def test_an_idempotent_write_is_not_announced_as_only_additive():
    """MCP's ``destructiveHint: false`` says a tool "performs only additive updates", and clients let
    such tools run without asking (auto-approval policies). Idempotent is another question (a delete
    or an overwrite is idempotent and destroys what was there): an idempotent write was served with
    ``destructiveHint: false``. The fleet cannot tell a write only adds, so every write says it may
    destroy; a read says nothing of it (meaningful only for writes)."""
    from toolfleet import tool
    from toolfleet.integrations.mcp_server import mcp_tool

    @tool(access="write", resources=lambda a: [f"file:{a['path']}"], idempotent=True)
    def remove_file(path: str) -> str:
        """Delete a file (deleting it again changes nothing).

        Args:
            path: The file.
        """
        return path

    @tool(access="write", resources=lambda a: [])
    def append_note(text: str) -> str:
        """Append a note.

        Args:
            text: The note.
        """
        return text

    @tool(access="read", resources=lambda a: [])
    def look(path: str) -> str:
        """Read a file.

        Args:
            path: The file.
        """
        return path

    removing = mcp_tool(remove_file).annotations
    assert removing.read_only_hint is False and removing.idempotent_hint is True
    assert removing.destructive_hint is True
    assert mcp_tool(append_note).annotations.destructive_hint is True
    looking = mcp_tool(look).annotations
    assert looking.read_only_hint is True and looking.destructive_hint is None
