"""The file tools never hold more of a file in the worker's memory than MAX_TEXT_FILE_BYTES: a
file past it (a sparse 1 GiB file costs no disk) is refused by read_file and edit_file with a
clear error, write_file replaces it without reading it, and grep skips it (found by a helper:
read_file(limit=1) on a sparse 1 GiB file took the process from 47 MB to 1071 MB)."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from toolfleet import ErrorCode, ToolContext
from toolfleet.errors import ToolFailure
from toolfleet.tools.files import edit_file, grep, read_file, write_file
from toolfleet.tools.workspace import MAX_TEXT_FILE_BYTES

from .faults import call

BIG = 1 << 30  # 1 GiB, sparse


@pytest.fixture
def big(tmp_path: Path) -> Path:
    path = tmp_path / "big.log"
    with open(path, "wb") as out:
        out.write(b"first line\n")
        out.truncate(BIG)
    return path


def _peak_bytes(work) -> tuple[object, int]:
    tracemalloc.start()
    try:
        try:
            outcome: object = work()
        except ToolFailure as exc:
            outcome = exc
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("tool", ["read_file", "edit_file"])
def test_a_file_past_the_bound_is_refused_without_reading_it(big, tmp_path, tool):
    ctx = ToolContext(call_id="c", turn_id="t", tool_name=tool, workspace=tmp_path)
    work = (lambda: read_file(path="big.log", ctx=ctx, limit=1)) if tool == "read_file" else (
        lambda: edit_file(ctx=ctx, path="big.log", old_string="first", new_string="1st"))
    outcome, peak = _peak_bytes(work)
    assert isinstance(outcome, ToolFailure) and outcome.code == "INVALID_ARGUMENT", outcome
    assert "larger than the file tools read or edit whole" in outcome.message and "sed -n" in outcome.hint
    assert peak < 8 * 1024 * 1024, peak
    assert os.path.getsize(big) == BIG


def test_write_file_replaces_a_file_past_the_bound_without_reading_it(big, tmp_path):
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="write_file", workspace=tmp_path)
    outcome, peak = _peak_bytes(lambda: write_file(ctx=ctx, path="big.log", content="small now\n"))
    assert "wrote 10 bytes" in str(outcome) and peak < 8 * 1024 * 1024, (outcome, peak)
    assert big.read_text() == "small now\n"


def test_a_file_at_the_bound_is_read(tmp_path):
    (tmp_path / "edge.txt").write_bytes(b"a\n" * (MAX_TEXT_FILE_BYTES // 2))
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="read_file", workspace=tmp_path)
    assert read_file(path="edge.txt", ctx=ctx, limit=2).startswith("a\na\n")
    assert "skipped" not in grep(ctx=ctx, pattern="b", path=".")


def test_through_a_worker(dispatcher, worker, workspace):
    with open(workspace / "big.log", "wb") as out:
        out.write(b"first line\n")
        out.truncate(BIG)
    [result] = dispatcher.run([call("r", "read_file", path="big.log", limit=1)], workspace=str(workspace),
                              timeout_s=60)
    assert result.code is ErrorCode.INVALID_ARGUMENT and "larger than" in result.content, result


def test_appending_to_a_file_past_the_bound_copies_it_without_holding_it(tmp_path):
    """``ctx.open(path, "a")`` (custom tools appending to a log): the old content is copied by the
    kernel in chunks, not read whole (a reviewer's case: the bound refused appends to big files)."""
    size = 3 * MAX_TEXT_FILE_BYTES
    big = tmp_path / "big.log"
    with open(big, "wb") as out:
        out.write(b"first line\n")
        out.truncate(size)
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="append", workspace=tmp_path)

    def append() -> object:
        with ctx.open("big.log", "a") as out:
            out.write("appended\n")
        return out.result

    outcome, peak = _peak_bytes(append)
    assert isinstance(outcome, dict) and outcome["bytes"] == size + len("appended\n"), outcome
    assert peak < 8 * 1024 * 1024, peak
    with open(big, "rb") as handle:
        assert handle.read(11) == b"first line\n"
        handle.seek(size)
        assert handle.read() == b"appended\n"
    small = tmp_path / "small.txt"
    small.write_text("a\n")
    with ctx.open("small.txt", "a") as out:
        out.write("b\n")
    assert small.read_text() == "a\nb\n"
