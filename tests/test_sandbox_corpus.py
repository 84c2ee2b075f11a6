"""Every command of the policy's corpus (tests/command_corpus.py), run for real in the sandbox
whatever its verdict (the sandbox must hold even for what the policy allows by mistake): zero
writes outside the workspace, zero processes left after the call.

Most cases run through the handler in this process (the same sandbox module and stop path a worker
uses, fast); a handful run through a real worker.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolfleet.errors import ToolFailure
from toolfleet.tools import sandbox
from toolfleet.tools.command import run_command
from toolfleet.tools.context import ToolContext

from .command_corpus import CORPUS, CommandCase
from .conftest import ROOT
from .faults import call

CASE_TIMEOUT_S = 3.0  # a corpus command runs at most this long (most take milliseconds)
HOST_PID_NS = os.readlink("/proc/self/ns/pid")


def _entry(path: Path) -> tuple[Any, ...]:
    st = path.lstat()
    if path.is_symlink():
        return ("link", os.readlink(path), st.st_mtime_ns)
    if path.is_dir():
        return ("dir", st.st_mode, st.st_mtime_ns)
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if st.st_size < 1 << 20 else ""
    return ("file", st.st_mode, st.st_size, st.st_mtime_ns, st.st_nlink, digest)


def snapshot(deep: list[Path], shallow: list[Path]) -> dict[str, Any]:
    """Contents, modes, mtimes and names under ``deep`` (recursively) and of ``shallow`` directories'
    own entries (one level), so any write, new file or deletion there changes it."""
    out: dict[str, Any] = {}
    for root in deep:
        out[str(root)] = _entry(root)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath, name)
                out[str(path)] = _entry(path)
    for root in shallow:
        out[str(root)] = _entry(root)
        for path in root.iterdir():
            if path.name not in (".pytest_cache", "__pycache__", ".ruff_cache"):
                out[str(path)] = ("entry", path.lstat().st_mode, path.lstat().st_mtime_ns)
    return out


def _pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def leftovers(before: set[int], workspace: Path) -> list[str]:
    """Live processes started since ``before`` that belong to a sandbox (another PID namespace) or
    run in the workspace."""
    found = []
    for pid in _pids() - before:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            ns = os.readlink(f"/proc/{pid}/ns/pid")
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # gone, or not ours to read
        if "toolfleet-probe-" in cmdline:
            continue  # a worker's start-up probe of its sandbox (another test's worker), not this command
        if state != "Z" and (ns != HOST_PID_NS or cwd.startswith(str(workspace))):
            found.append(f"{pid} {cmdline}")
    return found


@pytest.fixture
def places(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A fresh workspace (under /tmp, like the suite's), a neighbour directory beside it (under /tmp:
    the sandbox's /tmp is its own), and OUT outside both /tmp and the workspace (visible read-only)."""
    workspace = tmp_path / "workspace"
    neighbour = tmp_path / "neighbour"
    out = Path(tempfile.mkdtemp(prefix="toolfleet-out-", dir="/var/tmp"))
    for directory in (workspace, neighbour, out):
        (directory / "sub").mkdir(parents=True)
        (directory / "victim.txt").write_text("keep me\n")
        (directory / "f").write_text("original\n")
        (directory / "sub" / "g").write_text("nested\n")
    (workspace / "README.md").write_text("# readme\n")
    yield {"workspace": workspace, "neighbour": neighbour, "out": out}
    shutil.rmtree(out, ignore_errors=True)


def watched(places: dict[str, Path]) -> dict[str, Any]:
    home = Path(os.environ.get("HOME", "/root"))
    return snapshot([places["out"], places["neighbour"]], [Path("/etc"), home, ROOT, places["workspace"].parent])


def _workspace_parent_entries(snap: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """The workspace itself may change (its mtime, when a command writes there): leave it out."""
    return {k: v for k, v in snap.items() if k != str(workspace)}


@pytest.mark.parametrize("case", CORPUS, ids=[f"{i:03d}-{c.kind}" for i, c in enumerate(CORPUS)])
def test_corpus_command_stays_in_the_workspace(case: CommandCase, places: dict[str, Path]):
    workspace, out = places["workspace"], places["out"]
    assert sandbox.current().error is None, sandbox.current().error
    command = case.command.replace("{OUT}", str(out))
    before_snap = watched(places)
    before_pids = _pids()
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="run_command", workspace=workspace,
                      deadline=time.monotonic() + CASE_TIMEOUT_S)
    try:
        output = run_command(ctx=ctx, command=command)
    except ToolFailure as exc:
        output = f"[{exc.code}] {exc.output}"
    assert leftovers(before_pids, workspace) == [], (command, output)
    after_snap = watched(places)
    assert _workspace_parent_entries(after_snap, workspace) == _workspace_parent_entries(before_snap, workspace), (
        command, output)


def test_a_handful_through_a_real_worker(dispatcher, worker, places):
    """One case of each of the first kinds, as one batch on a real worker."""
    chosen: dict[str, CommandCase] = {}
    for case in CORPUS:
        chosen.setdefault(case.kind, case)
    cases = list(chosen.values())[:8]
    workspace, out = places["workspace"], places["out"]
    before_snap = watched(places)
    before_pids = _pids()
    calls = [call(f"c{i}", "run_command", command=c.command.replace("{OUT}", str(out)), timeout_s=CASE_TIMEOUT_S)
             for i, c in enumerate(cases)]
    results = dispatcher.run(calls, workspace=str(workspace), timeout_s=120)
    assert len(results) == len(cases)
    assert leftovers(before_pids, workspace) == [], [r.content for r in results]
    assert _workspace_parent_entries(watched(places), workspace) == _workspace_parent_entries(before_snap, workspace)
