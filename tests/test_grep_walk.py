"""``grep``'s walk (toolfleet/tools/files.py), as a breaker found it: a file it cannot open (a lease
a background process holds on it: ``EAGAIN``) is said, not left out silently; the names held at once
by the folders it is inside are bounded in all (``MAX_GREP_HELD_ENTRIES``), not only per folder
(32 nested folders of 50,000 long names took the pool process from 72 to 696 MiB)."""

from __future__ import annotations

import fcntl
import os
import signal
import tracemalloc

import pytest

from toolfleet import ToolContext
from toolfleet.tools import grep_walk
from toolfleet.tools.files import grep


def ctx_for(workspace) -> ToolContext:
    return ToolContext(call_id="c", turn_id="t", tool_name="x", workspace=workspace)


@pytest.fixture
def leased(tmp_path):
    """``b.txt`` (a match) under a write lease this process holds, as a live shell's background job can:
    an open with ``O_NONBLOCK`` gets ``EAGAIN``."""
    (tmp_path / "a.txt").write_text("needle here\n")
    (tmp_path / "b.txt").write_text("needle there\n")
    before = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the lease-break notice
    fd = os.open(tmp_path / "b.txt", os.O_WRONLY)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    try:
        yield tmp_path
    finally:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        os.close(fd)
        signal.signal(signal.SIGIO, before)


def test_a_file_grep_cannot_open_is_said(leased):
    out = grep(pattern="needle", path=".", ctx=ctx_for(leased))
    assert "a.txt:1:needle here" in out
    assert "[1 not searched (unreadable): b.txt]" in out


def test_a_file_removed_after_it_was_listed_is_not_said(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("needle\n")
    (tmp_path / "gone.txt").write_text("needle\n")
    real = grep_walk.read_dir

    def listed_then_removed(dir_fd, limit):
        out = real(dir_fd, limit)
        (tmp_path / "gone.txt").unlink(missing_ok=True)
        return out

    monkeypatch.setattr(grep_walk, "read_dir", listed_then_removed)
    assert grep(pattern="needle", path=".", ctx=ctx_for(tmp_path)) == "a.txt:1:needle"


def _nested(root, levels: int, per_level: int) -> None:
    here = root
    for level in range(levels):
        for i in range(per_level):
            (here / f"f{i:03d}.txt").write_text(f"needle {level} {i}\n")
        here = here / "deeper"
        here.mkdir()


def test_the_names_held_across_nested_folders_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(grep_walk, "MAX_GREP_DIR_ENTRIES", 40)
    monkeypatch.setattr(grep_walk, "MAX_GREP_HELD_ENTRIES", 70)
    _nested(tmp_path, 3, 30)  # each folder: 30 files and 'deeper' (31 names)
    limits = []
    real = grep_walk.read_dir
    monkeypatch.setattr(grep_walk, "read_dir", lambda fd, limit: (limits.append(limit), real(fd, limit))[1])
    out = grep(pattern="needle", path=".", ctx=ctx_for(tmp_path))
    assert limits[:3] == [40, 39, 8]  # 31 + 31 held above: the third folder gets 8 names
    assert limits[3:] in ([], [0])  # the empty folder below it, if it was among the 8
    third = [line for line in out.splitlines() if line.startswith("deeper/deeper/f")]
    assert len(third) in (7, 8) and out.count("needle 0 ") == out.count("needle 1 ") == 30
    assert "grep holds 70 names at once across the folders it is inside" in out
    assert "deeper/deeper/ (23 of 31)" in out


def test_a_deep_tree_of_long_names_holds_a_bounded_amount(tmp_path, monkeypatch):
    """Measured with tracemalloc at a scale a test can make: 6 nested folders of 3,000 names of
    200 characters, the bound set to 4,000 names; what grep held at its peak stays within what 4,000
    such names cost, not 18,000."""
    monkeypatch.setattr(grep_walk, "MAX_GREP_HELD_ENTRIES", 4_000)
    here = tmp_path
    for _ in range(6):
        for i in range(3_000):
            (here / f"{i:05d}{'x' * 195}").touch()
        here = here / "d"
        here.mkdir()
    tracemalloc.start()
    try:
        grep(pattern="needle", path=".", ctx=ctx_for(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    per_name = 200 + 150  # the name's text, its tuple and a DirEntry while a folder is read
    assert peak < 4_000 * per_name + 3_000 * per_name + 2**20, peak
