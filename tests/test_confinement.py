"""Workspace confinement of the file tools, tried as an attacker would, through real workers
(issue 10, items 2 and 3): static escapes, links and hard links made earlier in the same batch by
``run_command``, grep and list_dir over links out, a directory swapped with a link to an outside
folder thousands of times while reads and writes run, and plan resources and cross-turn locks
that name files, not spellings."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from toolfleet import ErrorCode, PermissionDenied, ToolContext, ToolFailure
from toolfleet.dispatcher.locks import ResourceLocks, lock_names
from toolfleet.tools.files import edit_file, read_file, write_file
from toolfleet.tools.resources import paths, resolve

from .faults import call

WAIT_S = 120
CANARY = "CANARY-OUTSIDE-7f3e"
RENAME_EXCHANGE = 2


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the workspace with files an attacker wants to read or change."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text(CANARY + "\n")
    (out / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def by_id(results) -> dict:
    return {r.call_id: r for r in results}


# ---- static paths and links planted before the batch -------------------------------------------

def test_static_escapes_are_refused(worker, dispatcher, workspace, outside):
    before = snapshot(outside)
    (workspace / "notes.txt").symlink_to(outside / "passwd")
    (workspace / "out_dir").symlink_to(outside)
    (workspace / "out_rel").symlink_to("../outside")
    calls = [
        call("dotdot", "read_file", path="../outside/secret.txt"),
        call("abs", "read_file", path=str(outside / "secret.txt")),
        call("file_link", "read_file", path="notes.txt"),
        call("dir_link", "read_file", path="out_dir/secret.txt"),
        call("rel_link", "read_file", path="out_rel/secret.txt"),
        call("w_dotdot", "write_file", path="docs/../../outside/new.txt", content="x"),
        call("w_abs", "write_file", path=str(outside / "new.txt"), content="x"),
        call("w_link", "write_file", path="notes.txt", content="x"),
        call("w_dir_link", "write_file", path="out_dir/new.txt", content="x"),
        call("w_deep", "write_file", path="out_rel/a/b/new.txt", content="x"),
        call("e_link", "edit_file", path="out_dir/secret.txt", old_string="CANARY", new_string="PWNED"),
        call("ls_link", "list_dir", path="out_dir"),
        call("grep_link", "grep", pattern="root", path="out_rel"),
        call("abs_inside", "read_file", path=str(workspace / "README.md")),
    ]
    results = by_id(dispatcher.run(calls, workspace=str(workspace), timeout_s=WAIT_S))
    for cid, result in results.items():
        if cid == "abs_inside":
            assert result.ok and "inventory-service" in result.content
            continue
        assert result.code is ErrorCode.PERMISSION_DENIED, (cid, result)
        assert CANARY not in result.content and "root:x" not in result.content
    assert snapshot(outside) == before


def test_grep_and_list_dir_never_follow_a_link_out(worker, dispatcher, workspace, outside):
    (workspace / "notes.txt").symlink_to(outside / "passwd")  # the case, with a passwd of our own
    (workspace / "etc_passwd").symlink_to("/etc/passwd")  # and the real one
    (workspace / "docs" / "more").symlink_to("../../outside")
    (workspace / "docs" / "inner").symlink_to("../src")  # inside: shown as a link, not searched twice
    results = dispatcher.run([
        call("g", "grep", pattern="root|CANARY", path="."),
        call("g_docs", "grep", pattern=".", path="docs"),
        call("ls", "list_dir", path="."),
        call("ls_docs", "list_dir", path="docs"),
    ], workspace=str(workspace), timeout_s=WAIT_S)
    for result in results:
        assert result.ok, result
        assert "root:x" not in result.content and CANARY not in result.content
    g, g_docs, ls, ls_docs = (r.content for r in results)
    assert "notes.txt" in g and "etc_passwd" in g and "not followed" in g  # says what it skipped
    assert "docs/more" in g_docs
    assert "notes.txt -> " in ls and "not followed" in ls
    assert "inner -> ../src" in ls_docs.splitlines()


def test_grep_matches_a_file_cut_mid_utf8_and_names_binaries(worker, dispatcher, workspace):
    (workspace / "notes").mkdir()
    cut = "начал приходить **картинка".encode()[:33]  # ends inside a two-byte letter
    (workspace / "notes" / "cut.md").write_bytes(cut)
    (workspace / "notes" / "blob.bin").write_bytes(b"\x00\x01" + "начал".encode())
    result = dispatcher.run([call("g", "grep", pattern="начал", path="notes")],
                            workspace=str(workspace), timeout_s=WAIT_S)[0]
    assert result.ok, result
    assert "notes/cut.md:1:начал приходить" in result.content
    assert "binary" in result.content and "notes/blob.bin" in result.content


# ---- links made earlier in the same batch ------------------------------------------------------

def test_symlinks_made_earlier_in_the_batch_lead_nowhere(worker, dispatcher, workspace, outside):
    before = snapshot(outside)
    calls = [
        call("ln", "run_command", command=f"ln -s {outside} lk && ln -s ../outside rk && "
                                          f"ln -s {outside}/secret.txt fk && mkdir -p d && ln -s {outside} d/in"),
        call("w1", "write_file", path="lk/new.txt", content="pwned"),
        call("w2", "write_file", path="rk/secret.txt", content="pwned"),
        call("w3", "write_file", path="fk", content="pwned"),
        call("w4", "write_file", path="d/in/x/y.txt", content="pwned"),
        call("e1", "edit_file", path="lk/secret.txt", old_string="CANARY", new_string="PWNED"),
        call("r1", "read_file", path="rk/secret.txt"),
        call("r2", "read_file", path="fk"),
        call("g", "grep", pattern="CANARY", path="."),
        call("ls", "list_dir", path="lk"),
    ]
    results = by_id(dispatcher.run(calls, workspace=str(workspace), timeout_s=WAIT_S))
    assert results["ln"].ok, results["ln"]
    for cid in ("w1", "w2", "w3", "w4", "e1", "r1", "r2", "ls"):
        assert results[cid].code is ErrorCode.PERMISSION_DENIED, (cid, results[cid])
    assert results["g"].ok and CANARY not in results["g"].content
    assert snapshot(outside) == before
    assert (workspace / "lk").is_symlink() and (workspace / "fk").is_symlink()  # the links are left as they were


def test_hard_links_made_earlier_in_the_batch_do_not_reach_the_outside_file(worker, dispatcher, workspace,
                                                                            outside):
    before = snapshot(outside)
    calls = [
        call("ln", "run_command", command=f"ln {outside}/secret.txt hl && ln {outside}/passwd hl2"),
        call("w", "write_file", path="hl", content="written\n"),
        call("e", "edit_file", path="hl2", old_string="root:x", new_string="PWNED:x"),
    ]
    results = by_id(dispatcher.run(calls, workspace=str(workspace), timeout_s=WAIT_S))
    assert snapshot(outside) == before  # the outside files are unchanged, whatever happened
    if results["ln"].ok:  # no sandbox here to stop the link: the writes replaced the workspace entries
        assert results["w"].ok and "other hard link" in results["w"].content
        assert (workspace / "hl").read_text() == "written\n"
        assert results["e"].ok and (workspace / "hl2").read_text().startswith("PWNED:x")
        assert (workspace / "hl").stat().st_nlink == 1
    else:  # a sandbox refused the link across mounts: nothing to write through
        assert not (workspace / "hl2").exists() or (workspace / "hl2").stat().st_nlink == 1


# ---- the race: a directory swapped with a link to the outside ----------------------------------

SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop, bound_s = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), sys.argv[3], float(sys.argv[4])
n, end = 0, time.monotonic() + bound_s
print("ready", flush=True)
while not os.path.exists(stop) and time.monotonic() < end:
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    n += 1
if n % 2:
    libc.renameat2(-100, a, -100, b, 2)
    n += 1
print(n, flush=True)
"""


class Swapper:
    """A separate process that swaps ``ws/d`` (a folder) and ``ws/d_link`` (a link to the outside)
    with renameat2(RENAME_EXCHANGE) as fast as it can, until stopped (at most ``bound_s``)."""

    def __init__(self, workspace: Path, bound_s: float = 240) -> None:
        self.stop_file = workspace.parent / "stop-swapping"
        self.proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(workspace / "d"), str(workspace / "d_link"),
                                      str(self.stop_file), str(bound_s)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> int:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, out
        return int(out.strip())


@pytest.fixture
def race_workspace(workspace: Path, outside: Path) -> Path:
    libc = ctypes.CDLL(None, use_errno=True)
    probe_a, probe_b = workspace / "probe_a", workspace / "probe_b"
    probe_a.mkdir()
    probe_b.symlink_to("probe_a")
    if libc.renameat2(-100, bytes(probe_a), -100, bytes(probe_b), RENAME_EXCHANGE) != 0:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported on this file system")
    probe_a.unlink()
    probe_b.rmdir()
    (workspace / "d").mkdir()
    (workspace / "d" / "secret.txt").write_text("inside\n")  # same name as the outside file
    (workspace / "d_link").symlink_to(outside)
    return workspace


@pytest.mark.parametrize("mode", ["openat2", "walk"])
def test_swapping_a_folder_and_a_link_out_never_lets_a_read_or_write_escape(race_workspace, outside, mode,
                                                                             monkeypatch):
    """>= 2,000 reads and >= 2,000 writes in-process (two threads) while another process swaps
    the folder ``d`` with a link to the outside folder: zero reads return the outside canary,
    zero writes land outside; both outcomes (inside / refused) occur, so the race was live."""
    if mode == "walk":
        monkeypatch.setenv("TOOLFLEET_BENEATH", "walk")
    ws = race_workspace
    before = snapshot(outside)
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="x", workspace=ws)
    n = 2000
    tally = {"read_ok": 0, "read_refused": 0, "read_canary": 0, "write_ok": 0, "write_refused": 0, "other": []}
    lock = threading.Lock()

    def reads() -> None:
        for _ in range(n):
            try:
                text = read_file(path="d/secret.txt", ctx=ctx)
                key = "read_canary" if CANARY in text else "read_ok"
            except PermissionDenied:
                key = "read_refused"
            except ToolFailure as exc:
                key = None
                tally["other"].append(exc.message)
            if key:
                with lock:
                    tally[key] += 1

    def writes() -> None:
        for i in range(n):
            path = ("d/secret.txt", f"d/w{i % 50}.txt", f"d/sub{i % 7}/w.txt")[i % 3]
            try:
                (edit_file if i % 10 == 0 and path == "d/secret.txt" else write_file)(
                    ctx=ctx, path=path, **({"old_string": "inside", "new_string": "inside"} if i % 10 == 0
                                           and path == "d/secret.txt" else {"content": "inside\n"}))
                key = "write_ok"
            except PermissionDenied:
                key = "write_refused"
            except ToolFailure as exc:
                key = None
                tally["other"].append(exc.message)
            if key:
                with lock:
                    tally[key] += 1

    swapper = Swapper(ws)
    try:
        threads = [threading.Thread(target=reads), threading.Thread(target=writes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        swaps = swapper.stop()
    assert tally["read_canary"] == 0
    assert snapshot(outside) == before  # nothing written, created or changed outside
    assert tally["read_ok"] + tally["read_refused"] + tally["write_ok"] + tally["write_refused"] + len(
        tally["other"]) == 2 * n
    assert tally["read_ok"] > 0 and tally["read_refused"] > 0 and tally["write_ok"] > 0 and tally["write_refused"] > 0
    print(f"\nrace ({mode}): {swaps} swaps; reads {tally['read_ok']} inside, {tally['read_refused']} refused, "
          f"0 outside; writes {tally['write_ok']} inside, {tally['write_refused']} refused, 0 outside; "
          f"{len(tally['other'])} other errors ({sorted(set(tally['other']))[:3]})")


def test_swapping_race_through_a_real_worker(start_worker, dispatcher, race_workspace, outside):
    start_worker(concurrency=2)
    ws = race_workspace
    before = snapshot(outside)
    calls = []
    for i in range(150):
        calls.append(call(f"r{i}", "read_file", path="d/secret.txt"))
        calls.append(call(f"w{i}", "write_file", path=f"d/w{i}.txt", content="inside\n"))
        calls.append(call(f"g{i}", "grep", pattern="CANARY|inside", path="d"))
    swapper = Swapper(ws)
    try:
        results = dispatcher.run(calls, workspace=str(ws), timeout_s=300)
    finally:
        swaps = swapper.stop()
    assert snapshot(outside) == before
    codes: dict[str, int] = {}
    for result in results:
        assert CANARY not in result.content, result
        key = f"{result.name}:{result.code.value if result.code else 'ok'}"
        codes[key] = codes.get(key, 0) + 1
        assert result.ok or result.code in (ErrorCode.PERMISSION_DENIED, ErrorCode.EXECUTION_ERROR), result
    print(f"\nrace through a worker: {swaps} swaps, {json.dumps(codes, sort_keys=True)}")


# ---- plan resources and locks name files, not spellings ----------------------------------------

def test_two_spellings_of_one_file_are_ordered_20_of_20(worker, dispatcher, workspace):
    (workspace / "sub").mkdir()
    (workspace / "alias").symlink_to("sub")
    (workspace / "sub" / "x.txt").write_text("old\n")
    seen = []
    for i in range(20):
        first, second = ("alias/x.txt", "sub/x.txt") if i % 2 == 0 else ("sub/x.txt", "alias/x.txt")
        turn = dispatcher.submit([call("w", "write_file", path=first, content=f"v{i}\n"),
                                  call("r", "read_file", path=second)], workspace=str(workspace))
        write, read = turn.results(WAIT_S)
        assert write.ok and read.ok, (write, read)
        seen.append(read.content == f"v{i}\n")
    assert sum(seen) == 20, seen


def test_links_made_by_an_earlier_command_in_the_batch_still_order_the_spellings(worker, dispatcher, workspace):
    """The plan canonicalises before ``run_command`` makes the link; writes after a write on
    everything are widened to the whole workspace, so the read still sees the write."""
    (workspace / "sub").mkdir()
    (workspace / "sub" / "x.txt").write_text("old\n")
    results = dispatcher.run([call("ln", "run_command", command="ln -s sub alias"),
                              call("w", "write_file", path="alias/x.txt", content="new\n"),
                              call("r", "read_file", path="sub/x.txt")], workspace=str(workspace), timeout_s=WAIT_S)
    assert [r.ok for r in results] == [True, True, True], results
    assert results[2].content == "new\n"


def test_lock_names_are_canonical_across_spellings(settings, workspace):
    from toolfleet.redis_client import connect

    (workspace / "sub").mkdir()
    (workspace / "alias").symlink_to("sub")
    ws_link = workspace.parent / "ws_link"
    ws_link.symlink_to(workspace)
    locks = ResourceLocks(settings, connect(settings.redis_url))

    def names(ws: Path, path: str) -> frozenset[str]:
        return lock_names(str(ws), resolve(paths("path"), {"path": path}, str(ws)))

    assert locks.acquire("A", names(workspace, "alias/x.txt")) is None
    assert locks.acquire("B", names(workspace, "sub/x.txt")) == "A"
    assert locks.acquire("B", names(ws_link, "sub/./x.txt")) == "A"  # the workspace spelled another way
    assert locks.acquire("B", names(workspace, "sub/y.txt")) is None
    locks.release("A")
    locks.release("B")


def test_turns_writing_one_file_by_two_spellings_do_not_interleave(settings, start_worker, workspace):
    from redis import Redis

    from .test_locks import finish, spawn_turn

    start_worker(concurrency=4)
    (workspace / "sub").mkdir()
    (workspace / "alias").symlink_to("sub")
    go = f"{settings.namespace}:test:go"
    writes = 15
    procs = {tag: spawn_turn(settings, workspace, [call(f"{tag}{i}", "append_line", path=path, line=f"{tag} {i}")
                                                   for i in range(writes)], go)
             for tag, path in (("A", "alias/history.txt"), ("B", "sub/history.txt"))}
    Redis.from_url(settings.redis_url).rpush(go, "go", "go")
    runs = {tag: finish(proc) for tag, proc in procs.items()}
    for run in runs.values():
        assert all(r["status"] == "ok" for r in run["results"]), run["results"]
    lines = (workspace / "sub" / "history.txt").read_text().splitlines()
    first = lines[0].split()[0]
    second = "B" if first == "A" else "A"
    assert lines == [f"{first} {i}" for i in range(writes)] + [f"{second} {i}" for i in range(writes)]


def test_custom_tools_open_safely_through_ctx_open(workspace, outside):
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="x", workspace=workspace)
    (workspace / "out").symlink_to(outside)
    with ctx.open("notes/new.md", "w") as handle:
        handle.write("hello\n")
    with ctx.open("notes/new.md", "a") as handle:
        handle.write("again\n")
    assert ctx.open("notes/new.md").read() == "hello\nagain\n"
    with pytest.raises(RuntimeError), ctx.open("notes/new.md", "w") as handle:
        handle.write("half")
        raise RuntimeError("the tool failed midway")
    assert (workspace / "notes/new.md").read_text() == "hello\nagain\n"  # unchanged
    for mode in ("r", "w"):
        with pytest.raises(PermissionDenied):
            ctx.open("out/secret.txt", mode).close()
    assert ctx.resolve_path("notes/../notes/new.md") == workspace.resolve() / "notes" / "new.md"
    with pytest.raises(PermissionDenied):
        ctx.resolve_path("out/secret.txt")
    assert snapshot(outside) == {"passwd": b"root:x:0:0:root:/root:/bin/bash\n", "secret.txt": (CANARY + "\n").encode()}
    assert not list(workspace.glob("notes/.*.tmp"))  # no temporary file left behind
