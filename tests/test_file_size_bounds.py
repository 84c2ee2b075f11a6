"""The file tools never hold more of a file in the worker's memory than MAX_TEXT_FILE_BYTES: a
file past it (a sparse 1 GiB file costs no disk) is refused by read_file and edit_file with a
clear error, write_file replaces it without reading it, and grep skips it (found by a helper:
read_file(limit=1) on a sparse 1 GiB file took the process from 47 MB to 1071 MB).

A file under the bound is streamed by read_file and grep, a block at a time (tools/text_lines.py),
so what they hold stays within a few times the bound whatever its lines, and grep's output is
bounded: a matching line is cut to MAX_GREP_LINE_CHARS around its match, all matches to
MAX_GREP_OUTPUT_CHARS (found by a security tester: read_file(limit=1) of a 20 MiB file of short
lines took the pool process +771 MiB, split whole into ten million strings; grep over 16 hard links
of one 8 MiB matching line kept every line whole: +776 MiB and 128 MiB stored in Redis)."""

from __future__ import annotations

import json
import os
import re
import tempfile
import tracemalloc
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet import ErrorCode, ToolContext
from toolfleet.errors import ToolFailure
from toolfleet.keys import Keys
from toolfleet.tools import grep_walk, text_lines
from toolfleet.tools.files import (
    MAX_LIST_ENTRIES,
    edit_file,
    grep,
    list_dir,
    read_file,
    write_file,
)
from toolfleet.tools.grep_walk import MAX_GREP_LINE_CHARS, MAX_GREP_MATCHES, MAX_GREP_OUTPUT_CHARS
from toolfleet.tools.workspace import MAX_TEXT_FILE_BYTES

from .faults import call

BIG = 1 << 30  # 1 GiB, sparse
MiB = 1 << 20


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


def _old_read_file(data: bytes, offset: int, limit: int) -> str:
    """read_file as it was, splitting the whole file: the reference the streamed one must equal."""
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    chunk = lines[offset - 1 : offset - 1 + limit]
    text = "".join(chunk)
    last = offset - 1 + len(chunk)
    if last < len(lines):
        text += f"\n[lines {offset}-{last} of {len(lines)}; read on with offset={last + 1}]"
    return text


def _old_grep(data: bytes, pattern: str) -> str:
    found = [f"f:{n}:{line}" for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1)
             if re.search(pattern, line)][:MAX_GREP_MATCHES]
    if len(found) == MAX_GREP_MATCHES:
        found.append(f"[stopped at {MAX_GREP_MATCHES} matches; narrow the pattern or path]")
    return "\n".join(found) or f"no match for {pattern!r} in f"


# every line break str.splitlines knows, CRLF, broken and whole UTF-8 sequences
_TEXT_PIECES = st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e",
                                b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9", b"\xe2", b"\x80", b"\xc2", b"\xff",
                                "é".encode(), b"\xf0\x9f\x99\x82", b"\xf0\x9f"])


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(data=st.lists(_TEXT_PIECES, max_size=120).map(b"".join), offset=st.integers(1, 40),
       limit=st.integers(1, 40), block=st.sampled_from([1, 7, 64, 65536]), whole=st.sampled_from([0, 5, 1 << 18]))
def test_streamed_read_file_and_grep_give_what_the_whole_file_gave(data, offset, limit, block, whole):
    """Small blocks and lazy splitting (monkeypatched) against the old whole-file reading."""
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_lines, "BLOCK_BYTES", block)
        patch.setattr(text_lines, "SPLIT_WHOLE_CHARS", whole)
        Path(root, "f").write_bytes(data)
        ctx = ToolContext(call_id="c", turn_id="t", tool_name="read_file", workspace=Path(root))
        assert read_file(path="f", ctx=ctx, offset=offset, limit=limit) == _old_read_file(data, offset, limit)
        assert text_lines.lines_in(data) == len(data.decode("utf-8", errors="replace").splitlines())
        for pattern in ("a", "^$", "c$", "\ufffd", "é|🙂", "a(?!b)", "c\\Z", "(?<=a)b", "^b"):
            assert grep(ctx=ctx, pattern=pattern, path="f") == _old_grep(data, pattern), pattern


def test_read_file_of_short_lines_streams_them(tmp_path):
    (tmp_path / "lines.txt").write_bytes(b"a\n" * (MAX_TEXT_FILE_BYTES // 2))  # ten million lines, at the bound
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="read_file", workspace=tmp_path)
    for offset in (1, MAX_TEXT_FILE_BYTES // 2):
        text, peak = _peak_bytes(lambda o=offset: read_file(path="lines.txt", ctx=ctx, offset=o, limit=2))
        assert text.startswith("a\n") and f"of {MAX_TEXT_FILE_BYTES // 2}" in text or text == "a\n", text
        assert peak < 4 * MiB, peak  # it was ~770 MiB: ten million str objects


@pytest.mark.parametrize(("first", "bound"), [(b"x", 3), ("🙂".encode(), 7)])
def test_one_long_line_is_held_a_few_times_at_most(tmp_path, first, bound):
    """One line of 20 MiB is read into one buffer (not read, then copied) and searched where it
    is decoded (not copied out of it). One astral character makes its str 4 bytes a character."""
    (tmp_path / "one.txt").write_bytes(first + b"x" * (MAX_TEXT_FILE_BYTES - len(first) - 1) + b"\n")
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="read_file", workspace=tmp_path)
    text, peak = _peak_bytes(lambda: read_file(path="one.txt", ctx=ctx, limit=1))
    assert text.endswith("xx\n") and peak < bound * MAX_TEXT_FILE_BYTES, peak // MiB
    found, peak = _peak_bytes(lambda: grep(ctx=ctx, pattern="x$", path="one.txt"))
    assert found.startswith("one.txt:1:") and peak < bound * MAX_TEXT_FILE_BYTES, peak // MiB


def test_grep_cuts_a_long_line_around_its_match(tmp_path):
    line = "x" * 1_000_000 + "needle" + "y" * 3_000_000
    (tmp_path / "long.txt").write_text(f"short needle\n{line}\n")
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="grep", workspace=tmp_path)
    first, second = grep(ctx=ctx, pattern="needle").split("\n")
    assert first == "long.txt:1:short needle"
    cut = re.fullmatch(r"long\.txt:2:\[\.\.\. (\d+) characters of the line cut \.\.\.\]"
                       r"(x*needley*)\[\.\.\. (\d+) characters of the line cut \.\.\.\]", second)
    assert cut, second[:300]
    before, kept, after = int(cut.group(1)), cut.group(2), int(cut.group(3))
    assert len(kept) == MAX_GREP_LINE_CHARS and before + len(kept) + after == len(line)
    assert line[before : before + len(kept)] == kept and kept.index("needle") == MAX_GREP_LINE_CHARS // 4


def test_grep_stops_at_its_output_budget_and_says_how_to_narrow(tmp_path):
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text(("needle " + "z" * 1500 + "\n") * 3)
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="grep", workspace=tmp_path)
    out = grep(ctx=ctx, pattern="needle")
    *lines, stopped = out.split("\n")
    assert len(out) <= MAX_GREP_OUTPUT_CHARS + 200 and 0 < len(lines) < 120
    assert stopped == (f"[stopped after {len(lines)} matches: grep's output reached its {MAX_GREP_OUTPUT_CHARS}"
                       "-character limit; narrow the pattern, path or glob]")


def test_grep_over_hard_links_of_a_long_line_holds_a_few_times_the_file(tmp_path):
    (tmp_path / "hl").mkdir()
    (tmp_path / "one.txt").write_bytes(b"needle " + b"x" * (8 * MiB) + b"\n")
    for i in range(16):
        os.link(tmp_path / "one.txt", tmp_path / "hl" / f"copy{i:02d}.txt")
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="grep", workspace=tmp_path)
    out, peak = _peak_bytes(lambda: grep(ctx=ctx, pattern="needle", path="hl"))
    assert len(out.split("\n")) == 16 and len(out) < 16 * (MAX_GREP_LINE_CHARS + 100), len(out)
    assert peak < 5 * 8 * MiB, peak  # one line at a time, a few copies of it; it was 16 whole lines joined


def test_a_folder_of_many_names_is_listed_within_a_bound(tmp_path):
    """list_dir keeps at most MAX_LIST_ENTRIES entries of a folder and counts the rest (a folder of
    300,000 names made by run_command cost list_dir 78 MiB, and all were listed)."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(100_000):
        os.close(os.open(many / f"f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="list_dir", workspace=tmp_path)
    out, peak = _peak_bytes(lambda: list_dir(ctx=ctx, path="many"))
    *lines, note = out.split("\n")
    assert len(lines) == MAX_LIST_ENTRIES and lines == sorted(lines) and all(n.startswith("f") for n in lines)
    assert note.startswith(f"[{MAX_LIST_ENTRIES} of 100000 entries shown: the first the file system gave, sorted;")
    assert peak < 8 * MiB, peak // MiB


def test_grep_searches_a_bounded_number_of_entries_per_folder_and_counts_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(grep_walk, "MAX_GREP_DIR_ENTRIES", 3)
    (tmp_path / "d").mkdir()
    (tmp_path / "links").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"f{i}.txt").write_text("needle\n")
    for i in range(8):
        os.symlink("../d/f0.txt", tmp_path / "links" / f"link{i}")
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="grep", workspace=tmp_path)
    lines = grep(ctx=ctx, pattern="needle").split("\n")
    assert len([line for line in lines if line.startswith("d/f")]) == 3, lines
    assert "[7 not searched (past the first 3 entries of a folder): d/ (2 of 5), links/ (5 of 8)]" in lines, lines
    monkeypatch.setattr(grep_walk, "MAX_GREP_DIR_ENTRIES", 100)
    lines = grep(ctx=ctx, pattern="needle").split("\n")  # only the first names of a kind are kept
    assert lines[-1] == ("[8 not searched (symbolic links, not followed): links/link0, links/link1, links/link2, "
                         "links/link3, links/link4, and 3 more]"), lines


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024


def test_read_file_of_short_lines_through_a_worker(start_worker, dispatcher, workspace):
    worker = start_worker(concurrency=1)
    [warm] = dispatcher.run([call("w", "read_file", path="README.md", limit=1)], workspace=str(workspace),
                            timeout_s=60)
    [pool] = worker.children()
    before = _peak_rss(pool)
    (workspace / "lines.txt").write_bytes(b"a\n" * (MAX_TEXT_FILE_BYTES // 2))  # exactly at the bound
    [result] = dispatcher.run([call("r", "read_file", path="lines.txt", limit=1)], workspace=str(workspace),
                              timeout_s=120)
    assert result.ok and result.content.startswith("a\n\n[lines 1-1 of 10485760;"), result.content
    grew = _peak_rss(pool) - before
    assert grew < 2 * MAX_TEXT_FILE_BYTES, f"peak RSS +{grew // MiB} MiB"  # it was +771 MiB


def test_grep_over_hard_links_through_a_worker(start_worker, dispatcher, workspace, settings):
    worker = start_worker(concurrency=1)
    setup = ("python3 -c \"open('one.txt','w').write('needle ' + 'x' * (8 << 20) + '\\n')\" && mkdir -p hl && "
             "for i in $(seq 1 16); do ln one.txt hl/copy$i.txt; done && echo made")
    [made] = dispatcher.run([call("mk", "run_command", command=setup)], workspace=str(workspace), timeout_s=60)
    assert made.ok and "made" in made.content, made.content
    [pool] = worker.children()
    before = _peak_rss(pool)
    [result] = dispatcher.run([call("g", "grep", pattern="needle", path="hl")], workspace=str(workspace),
                              timeout_s=120)
    grew = _peak_rss(pool) - before
    assert result.ok, result.content
    stored = 0
    ref = re.search(r'read_output\(ref="(out_[0-9a-f]+)"', result.content)
    if ref:
        client = redis.Redis.from_url(settings.redis_url)
        stored = json.loads(client.lindex(Keys(settings.namespace).output(ref.group(1)), 0))["chars"]
        client.delete(Keys(settings.namespace).output(ref.group(1)))
    assert stored < 16 * (MAX_GREP_LINE_CHARS + 100), f"{stored} characters stored in Redis"  # it was 128 MiB
    assert grew < 3 * MAX_TEXT_FILE_BYTES, f"peak RSS +{grew // MiB} MiB"  # it was +776 MiB
