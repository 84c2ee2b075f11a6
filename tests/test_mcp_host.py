"""``toolfleet worker --mcp NAME=COMMAND``: a tiny MCP server written with the SDK, hosted by a worker, its
tools called through the fleet as ``NAME__tool``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

pytest.importorskip("mcp")

from toolfleet import Dispatcher, ErrorCode, ToolCall  # noqa: E402
from toolfleet.errors import ConfigurationError  # noqa: E402
from toolfleet.integrations.mcp_host import parse_option, with_live_tools  # noqa: E402

from .conftest import ROOT, make_registry  # noqa: E402
from .leftovers import marker, processes_with, wait_gone  # noqa: E402

TINY = f"tiny={sys.executable} {ROOT / 'tests' / 'mcp_tiny_server.py'}"


def tiny(mark: str) -> str:
    """The --mcp option of the tiny server with ``mark`` on its command line (found in /proc)."""
    return f"{TINY} {mark}"


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def server_processes(mark: str) -> list[tuple[int, str]]:
    """The processes of the server marked ``mark`` (not the worker, whose command line holds it too)."""
    return [(pid, line) for pid, line in processes_with(mark) if "--mcp" not in line]


def hosting_process(mark: str) -> int:
    """The process that started the server marked ``mark`` (the parent of its outermost process)."""
    tree = {pid for pid, _ in server_processes(mark)}
    [outer] = [pid for pid in tree if _ppid(pid) not in tree]
    return _ppid(outer)


def call(cid: str, name: str, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments))


def test_a_hosted_mcp_server_serves_namespaced_tools_only_from_its_worker(settings, start_worker, tmp_path):
    plain = start_worker(concurrency=1, name="plain")  # serves the test tools, not tiny's
    mark = marker()
    host = start_worker(concurrency=1, name="host", args=["--mcp", tiny(mark)])
    with Dispatcher(settings, with_live_tools(make_registry(), settings)) as dispatcher:
        spec = dispatcher.registry.get("tiny__add")
        assert spec is not None and spec.access == "read" and spec.queue == "tiny__add"
        assert dispatcher.registry.get("tiny__note").access == "write"  # no readOnlyHint: a write on everything
        target = tmp_path / "notes.txt"
        results = dispatcher.run([
            call("add", "tiny__add", a=2, b=3),
            call("slow", "tiny__note", path=str(target), text="first", seconds=0.5),
            call("fast", "tiny__note", path=str(target), text="second"),  # waits for the write before it
            call("who", "tiny__whoami"),
            call("bad", "tiny__add", a="x", b=1),
            call("fails", "tiny__fail", message="nope"),
        ], timeout_s=90)
        by_id = {r.call_id: r for r in results}
        assert by_id["add"].ok and by_id["add"].content == "5"
        assert target.read_text() == "first\nsecond\n"  # model order, though the first was slower
        first = by_id["who"].content
        parent = hosting_process(mark)
        assert parent in host.children()  # the server process lives under the hosting worker's pool process
        assert any("bwrap" in line and "--unshare-pid" in line for _, line in server_processes(mark))
        assert by_id["bad"].code == ErrorCode.INVALID_ARGUMENT  # validated against the MCP tool's schema
        assert by_id["fails"].code == ErrorCode.EXECUTION_ERROR and "fail" in by_id["fails"].content
        ran = [r for r in results if r.call_id != "bad"]
        assert {r.worker for r in ran} == {host.name}  # never the worker that does not host it
        assert plain.name not in {r.worker for r in results}

        # the server dies: that call is an error, the next one runs on a fresh copy under the same process
        [crashed] = dispatcher.run([call("crash", "tiny__crash")], timeout_s=90)
        assert crashed.code == ErrorCode.EXECUTION_ERROR and "started again" in crashed.content
        [again] = dispatcher.run([call("who2", "tiny__whoami")], timeout_s=90)
        assert again.ok, again.content
        assert again.content != first and hosting_process(mark) == parent


def test_mcp_serve_offers_the_hosted_tools_it_learns_from_the_live_workers(settings, start_worker):
    import anyio
    from mcp import Client

    from toolfleet.integrations.mcp_server import build_server

    with Dispatcher(settings, make_registry()) as dispatcher:  # knows nothing of tiny yet
        server = build_server(dispatcher, refresh=lambda: with_live_tools(dispatcher.registry, settings))

        async def main() -> None:
            with anyio.fail_after(120):
                async with Client(server) as client:  # the SDK's client, in-process
                    assert "tiny__add" not in {t.name for t in (await client.list_tools()).tools}
                    await anyio.to_thread.run_sync(lambda: start_worker(concurrency=1, name="host",
                                                                        args=["--mcp", TINY]))
                    tools = {t.name: t for t in (await client.list_tools()).tools}
                    assert tools["tiny__add"].annotations.read_only_hint is True
                    result = await client.call_tool("tiny__add", {"a": 20, "b": 22})
                    assert not result.is_error and result.content[0].text == "42"

        anyio.run(main)


def test_a_bad_mcp_option_is_a_clear_error():
    assert parse_option("fs=npx -y server 'a b'") == ("fs", ["npx", "-y", "server", "a b"])
    for bad in ("noequals", "a__b=cmd", "x=", "bad name=cmd", "q=unterminated 'quote"):
        with pytest.raises(ConfigurationError):
            parse_option(bad)


def test_a_worker_whose_mcp_server_cannot_start_says_why(settings):
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url, "--namespace",
         settings.namespace, "--mcp", "gone=/nonexistent/mcp-server"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "--mcp gone" in proc.stderr and "cannot start" in proc.stderr
    assert "not found" in proc.stderr and "ExceptionGroup" not in proc.stderr  # said plainly


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _wait_no_server(mark: str, within_s: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + within_s
    while (left := server_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_cancelled_hosted_call_stops_its_server_and_a_server_dies_with_its_pool_process(settings, start_worker,
                                                                                          tmp_path):
    """A sync MCP tool runs on in its server when only the request is cancelled: the cancel stops the
    server before CANCELLED is answered, so its late write never lands; and a server blocked in a call
    (it would not exit on the end of its input) dies with the pool process that hosts it."""
    mark = marker()
    host = start_worker(concurrency=1, name="host", args=["--mcp", tiny(mark)])
    with Dispatcher(settings, with_live_tools(make_registry(), settings)) as dispatcher:
        [who] = dispatcher.run([call("who", "tiny__whoami")], timeout_s=90)
        parent = hosting_process(mark)
        target = tmp_path / "late.txt"
        turn = dispatcher.submit([call("slow", "tiny__note", path=str(target), text="late", seconds=4)])
        time.sleep(1.5)
        turn.cancel("the test cancels it")
        [cancelled] = turn.results(30)
        assert cancelled.code == ErrorCode.CANCELLED, cancelled.content
        assert server_processes(mark) == [], "CANCELLED was answered while the server still ran the call"
        time.sleep(4)
        assert not target.exists()  # the server's work did not go on after CANCELLED
        assert "MCP server tiny was stopped" in cancelled.content
        [again] = dispatcher.run([call("who2", "tiny__whoami")], timeout_s=90)  # started again
        assert again.ok and again.content != who.content and hosting_process(mark) == parent

        # processes the server started, one out of its process group and session, die with it too
        escaped = marker()
        [spawned] = dispatcher.run([call("spawn", "tiny__spawn", seconds=escaped)], timeout_s=90)
        assert spawned.ok and processes_with(escaped), spawned.content
        blocked = dispatcher.submit([call("stuck", "tiny__note", path=str(target), text="never", seconds=600)])
        time.sleep(1.5)
        os.kill(parent, signal.SIGKILL)  # the pool process dies at once: no exit hook runs
        try:
            left = _wait_no_server(mark, 10) + wait_gone(escaped, 5)
            assert left == [], f"processes of the MCP server outlived its pool process {parent}: {left}"
        finally:
            blocked.cancel("the test is over")
            for pid, _ in server_processes(mark) + processes_with(escaped):
                os.kill(pid, signal.SIGKILL)  # the test's own leftovers (the old code leaks them)
    assert host.proc.poll() is None


def test_a_hosted_call_past_its_bound_stops_the_server_and_an_unconfirmed_stop_is_outcome_unknown(tmp_path,
                                                                                                 monkeypatch):
    from toolfleet.errors import ToolFailure
    from toolfleet.integrations import mcp_host

    server = mcp_host.HostedServer("tiny", [sys.executable, str(ROOT / "tests" / "mcp_tiny_server.py")])
    try:
        assert server.call("add", {"a": 1, "b": 2}, 30).content[0].text == "3"
        [first] = [t.get_pid() for t in server._loop.processes if t.get_returncode() is None]
        target = tmp_path / "late.txt"
        with pytest.raises(ToolFailure) as timed_out:
            server.call("note", {"path": str(target), "text": "late", "seconds": 3}, 1.0)
        assert timed_out.value.code == "TIMEOUT"
        assert _gone(first)
        time.sleep(3)
        assert not target.exists()
        assert server.call("add", {"a": 2, "b": 2}, 30).content[0].text == "4" and server.starts == 2

        monkeypatch.setattr(mcp_host, "group_alive", lambda pgid: True)  # a stop that cannot be confirmed
        monkeypatch.setattr(mcp_host, "KILL_WAIT_S", 0.2)
        with pytest.raises(ToolFailure) as unknown:
            server.call("note", {"path": str(target), "text": "late", "seconds": 3}, 1.0)
        assert unknown.value.code == "OUTCOME_UNKNOWN" and "unknown" in unknown.value.message
    finally:
        server.close()


def test_a_group_of_zombies_is_gone_and_no_bubblewrap_falls_back_with_a_reason():
    """A stop is confirmed once only zombies are left in the server's group: an orphan's zombie waits
    for whichever process reaps orphans (this machine's init took seconds, so every stop of a server
    in a PID namespace was OUTCOME_UNKNOWN). Without bubblewrap the command runs as given, and why."""
    import subprocess

    from toolfleet.integrations.server_processes import confined, group_alive

    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not _gone(child.pid) and time.monotonic() < deadline:  # a zombie: not reaped yet
            time.sleep(0.01)
        assert _gone(child.pid) and os.path.exists(f"/proc/{child.pid}")
        assert not group_alive(child.pid)
    finally:
        child.wait()
    assert not group_alive(child.pid)
    argv, why = confined(["server", "--flag"], "no-such-bwrap-binary")
    assert argv == ["server", "--flag"] and "not found" in why
    wrapped, none = confined(["server"])
    assert none is None and wrapped[-2:] == ["--", "server"] and "--unshare-pid" in wrapped
