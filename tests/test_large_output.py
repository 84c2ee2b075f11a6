"""Large outputs: a result over its budget keeps head and tail for the model, the whole output is
stored in Redis, and `read_output` pages through it (real Redis, real workers). What is stored is
bounded for every tool like a command's capture: past MAX_STORED_BYTES only its first and last
halves are (a security tester's grep stored 128 MiB for one call; read_file of a 20 MiB line
stored 20 MiB)."""

from __future__ import annotations

import json
import re
import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet import ToolCall
from toolfleet.tools.output import (
    MAX_CAPTURE_BYTES,
    MAX_STORED_BYTES,
    STORED_SLACK,
    HeadTail,
    fit_output,
    within_stored_bound,
)

WAIT_S = 120
LINES = 262_144  # 8 characters a line: exactly 2 MiB
FULL = "".join(f"{i:07d}\n" for i in range(LINES))
PAGE = 20_000


def test_two_megabyte_command_output_is_cut_stored_and_paged(dispatcher, worker, workspace):
    script = f"import sys; sys.stdout.write(''.join(f'{{i:07d}}\\n' for i in range({LINES})))"
    # the system's python3: the sandbox gives commands a private /tmp, so a venv under /tmp (a
    # checkout there) is not visible inside it
    command = f"python3 -c {shlex.quote(script)}"
    [result] = dispatcher.run([ToolCall(id="big", name="run_command", arguments=json.dumps({"command": command}))],
                              workspace=str(workspace), timeout_s=WAIT_S)
    assert result.ok, result.content
    content = result.content
    assert len(content) <= 20_000  # run_command's budget
    assert content.startswith("0000000\n0000001\n") and content.endswith("0262142\n0262143\n")
    assert f"of {len(FULL)} characters cut" in content
    found = re.search(r'read_output\(ref="(out_[0-9a-f]+)", offset=(\d+), limit=\d+\)', content)
    assert found, content[:2000]
    ref, head = found.group(1), int(found.group(2))
    assert content[:head] == FULL[:head]

    offsets = list(range(head, len(FULL), PAGE))
    pages = [ToolCall(id=f"p{i}", name="read_output", index=i,
                      arguments=json.dumps({"ref": ref, "offset": offset, "limit": PAGE}))
             for i, offset in enumerate(offsets)]
    results = dispatcher.run(pages, workspace=str(workspace), timeout_s=WAIT_S)
    assert all(r.ok for r in results), [r.content for r in results if not r.ok][:1]
    texts = []
    for offset, page in zip(offsets, results, strict=True):
        text, _, footer = page.content.rpartition("\n[characters ")
        assert footer.startswith(f"{offset}-{min(offset + PAGE, len(FULL))} of {len(FULL)}")
        texts.append(text)
    assert results[-1].content.endswith("this is the end]")
    assert FULL[:head] + "".join(texts) == FULL


def test_unknown_reference_is_an_error_result(dispatcher, worker, workspace):
    [result] = dispatcher.run([ToolCall(id="x", name="read_output", arguments='{"ref": "out_0000000000000000"}')],
                              workspace=str(workspace), timeout_s=WAIT_S)
    assert result.code.value == "EXECUTION_ERROR" and "expired" in result.content


def test_fit_output_without_a_store_or_when_the_store_fails():
    text = "x" * 50_000
    plain = fit_output(text, 1000)
    assert len(plain) <= 1000 and "50000 characters" in plain and "read_output" not in plain

    def broken(_: str) -> str:
        raise OSError("redis is down")

    assert fit_output(text, 1000, broken) == plain
    assert fit_output("short", 1000, broken) == "short"
    stored = fit_output(text, 1000, lambda _: "out_1")
    assert len(stored) <= 1000 and 'read_output(ref="out_1"' in stored


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(max_bytes=st.integers(2, 64), chunks=st.lists(st.binary(max_size=40), max_size=25))
def test_head_tail_keeps_the_first_and_last_halves_and_counts_the_rest(max_bytes, chunks):
    kept = HeadTail(max_bytes)
    for chunk in chunks:
        kept.add(chunk)
    data = b"".join(chunks)
    text = kept.text()
    if len(data) <= max_bytes:
        assert kept.dropped == 0 and text == data.decode("utf-8", errors="replace")
        return
    half = max_bytes // 2
    assert kept.dropped == len(data) - max_bytes
    head, tail = bytes(kept._head), b"".join(kept._tail)
    assert head == data[:half] and tail == data[len(data) - (max_bytes - half):]
    assert f"{kept.dropped} bytes of output dropped" in text


def test_a_command_printing_without_end_is_kept_within_the_capture_bound(dispatcher, worker, workspace):
    """64 MiB printed: the worker keeps (and stores for read_output) at most MAX_CAPTURE_BYTES of it,
    head and tail, and says how much it dropped (a helper's 200 MB run filled the pool process's
    memory, 1.1 GB, and put all of it in Redis for a day)."""
    command = "head -c 67108864 /dev/zero | tr '\\0' a; echo; echo THE-END"
    [result] = dispatcher.run([ToolCall(id="big", name="run_command", arguments=json.dumps({"command": command}))],
                              workspace=str(workspace), timeout_s=WAIT_S)
    assert result.ok, result.content
    assert result.content.rstrip().endswith("THE-END")
    ref = re.search(r'read_output\(ref="(out_[0-9a-f]+)"', result.content).group(1)
    [page] = dispatcher.run([ToolCall(id="p", name="read_output", arguments=json.dumps(
        {"ref": ref, "offset": MAX_CAPTURE_BYTES // 2 - 100, "limit": 400}))], workspace=str(workspace),
        timeout_s=WAIT_S)
    assert page.ok and "bytes of output dropped here" in page.content, page.content
    total = int(re.search(r"of (\d+) characters", result.content).group(1))
    assert MAX_CAPTURE_BYTES < total < MAX_CAPTURE_BYTES + 1000  # what was stored: the bound and the note


def test_what_is_stored_is_bounded_head_and_tail_for_any_text():
    ascii_text = "".join(f"{i:07d}\n" for i in range(1_310_720))  # 10 MiB
    kept, dropped = within_stored_bound(ascii_text)
    half = MAX_STORED_BYTES // 2
    assert dropped == len(ascii_text) - MAX_STORED_BYTES and len(kept.encode()) <= MAX_STORED_BYTES + STORED_SLACK
    assert kept.startswith(ascii_text[:half]) and kept.endswith(ascii_text[-half:])
    assert f"[... {dropped} bytes of output dropped here: the worker keeps the first {half} and the last {half} " \
           "bytes of a tool's output; ask for less per call" in kept
    wide = "🙂" * (MAX_STORED_BYTES // 4 + 1000)  # fewer characters than the bound, more bytes
    kept, dropped = within_stored_bound(wide)
    assert dropped == 4000 and len(kept.encode()) <= MAX_STORED_BYTES + STORED_SLACK
    for fits in ("🙂" * (MAX_STORED_BYTES // 4), "a" * (MAX_STORED_BYTES + STORED_SLACK), "é" * 1000):
        assert within_stored_bound(fits) == (fits, 0)
    kept = HeadTail()
    kept.add(b"b" * (3 * MAX_CAPTURE_BYTES))
    capture = kept.text()  # a command's output, already cut: not cut twice
    assert within_stored_bound(capture) == (capture, 0)


def test_fit_output_stores_and_counts_the_bounded_text():
    text = "".join(f"{i:07d}\n" for i in range(1_310_720))
    saved: list[str] = []
    shown = fit_output(text, 20_000, lambda t: saved.append(t) or "out_1")
    [stored] = saved
    assert stored == within_stored_bound(text)[0] and len(shown) <= 20_000
    assert shown.startswith(text[:1000]) and shown.endswith(text[-1000:])
    found = re.search(r"cut from the middle \(characters (\d+)-(\d+)\)\. Of its (\d+) characters, the first and "
                      r"last 2 MiB are stored \((\d+) bytes dropped between them\) as \"out_1\": read on with "
                      r'read_output\(ref="out_1", offset=(\d+)', shown)
    assert found, shown[13_000:14_000]
    head, end, whole, dropped, offset = map(int, found.groups())
    assert (whole, dropped, offset) == (len(text), len(text) - MAX_STORED_BYTES, head) and end < len(stored)
    plain = fit_output(text, 20_000)
    assert "(of its 10485760 characters, the first and last 2 MiB were kept)" in plain and len(plain) <= 20_000


def test_a_long_line_read_is_stored_within_the_bound(dispatcher, worker, workspace):
    (workspace / "one.txt").write_bytes(b"x" * (20 * 2**20 - 1) + b"\n")
    [result] = dispatcher.run([ToolCall(id="r", name="read_file", arguments=json.dumps({"path": "one.txt"}))],
                              workspace=str(workspace), timeout_s=WAIT_S)
    assert result.ok and result.content.startswith("xxxx"), result.content[:200]
    total = int(re.search(r"of (\d+) characters cut", result.content).group(1))
    assert total <= MAX_STORED_BYTES + STORED_SLACK  # it was 20 MiB, stored whole for each call
    assert f"Of its {20 * 2**20} characters, the first and last 2 MiB are stored" in result.content
