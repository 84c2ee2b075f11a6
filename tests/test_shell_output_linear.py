"""A live shell's output is kept and searched for the end marker in time linear in the output
(toolfleet/worker/shell_output.py), with what the shell kept and found before: no sandbox needed.

The reference is the buffer as it was in live_shell.py: one bytearray, the middle deleted past the
limit, the marker searched from the start at every look."""

from __future__ import annotations

import threading
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.worker import live_shell
from toolfleet.worker.live_shell import Shell
from toolfleet.worker.shell_output import ShellOutput


class OneBuffer:
    """live_shell.py's buffer as it was."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.buf, self.dropped = max_bytes, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > self.max_bytes:
            half = self.max_bytes // 2
            cut = len(self.buf) - self.max_bytes
            del self.buf[half:half + cut]
            self.dropped += cut

    def look(self, mark: bytes) -> tuple[bytes, int, int] | int:
        """What _wait_mark did with the buffer: (text, status, dropped) and the line consumed, or
        where it stopped (-1: no marker, -2: no newline after it yet)."""
        at = self.buf.find(mark, 0)
        if at < 0:
            return -1
        end = self.buf.find(b"\n", at)
        if end < 0:
            return -2
        try:
            status = int(self.buf[at + len(mark):end].strip() or b"0")
        except ValueError:
            return -3  # raised, the buffer as it was
        text = bytes(self.buf[:max(at - 1, 0)])
        del self.buf[:end + 1]
        return text, status, self.dropped


def look(out: ShellOutput, mark: bytes) -> tuple[bytes, int, int] | int:
    at = out.find(mark)
    if at < 0:
        return -1
    end = out.find_newline(at)
    if end < 0:
        return -2
    try:
        status = int(out.slice(at + len(mark), end).strip() or b"0")
    except ValueError:
        return -3
    text = out.slice(0, max(at - 1, 0))
    out.consume(end + 1)
    return text, status, out.dropped


pieces = [b"a", b"b", b"x", b"\n", b" 3", b"ab", b"ba", b"aab"]
chunks = st.lists(st.sampled_from(pieces), min_size=1, max_size=4).map(b"".join)
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), chunks),
    st.tuples(st.just("look"), st.sampled_from([b"ab", b"aba", b"abab", b"b", b"xab"])),
    st.tuples(st.just("take"), st.just(b"")),
    st.tuples(st.just("new command"), st.just(b"")),
), max_size=60)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=2, max_value=24), ops)
def test_keeps_and_finds_what_one_buffer_did(max_bytes, steps):
    new, old = ShellOutput(max_bytes), OneBuffer(max_bytes)
    for op, arg in steps:
        if op == "add":
            new.add(arg)
            old.add(arg)
        elif op == "look":
            assert look(new, arg) == old.look(arg)
        elif op == "take":
            assert new.take() == bytes(old.buf)
            old.buf.clear()
        else:  # run() starts a command: the count of dropped bytes starts anew, the bytes stay
            new.dropped = old.dropped = 0
        assert len(new) == len(old.buf) and new.slice(0, len(new)) == bytes(old.buf)
        assert new.dropped == old.dropped


def test_a_marker_formed_where_the_head_meets_a_new_tail_is_found():
    """Dropping the tail's front gives the head's last bytes new neighbours: looked at again."""
    new, old = ShellOutput(8), OneBuffer(8)
    for chunk, mark in ((b"xxab", None), (b"xxxxx", b"abab"), (b"abxx", b"abab"), (b" 5\n", b"abab")):
        new.add(chunk)
        old.add(chunk)
        if mark:
            assert look(new, mark) == old.look(mark)
    assert new.take() == bytes(old.buf)


def standin() -> Shell:
    shell = Shell.__new__(Shell)  # no sandbox: only what _wait_mark reads
    shell._cond = threading.Condition()
    shell._out = ShellOutput(live_shell.MAX_OUTPUT_BYTES)
    return shell


def test_a_look_per_chunk_costs_the_chunk():
    """4 MB arriving in 1 kB chunks, looked at after each chunk as the waiting command does, took
    9 s (8 MB: 24 s): every look searched all the output. 16 MB now, within a lax bound."""
    shell = standin()
    mark = b"__toolfleet_end_0123456789abcdef01234567__"
    chunk = b"a" * 1023 + b"\n"
    started = time.perf_counter()
    for _ in range(16 * 1024):
        with shell._cond:
            shell._out.add(chunk)
        assert shell._wait_mark(mark, 0, 0.0) is None
    with shell._cond:
        shell._out.add(b"\n" + mark[:10])
    assert shell._wait_mark(mark, 0, 0.0) is None  # a marker cut between two chunks
    with shell._cond:
        shell._out.add(mark[10:] + b" 7\n")
    text, status = shell._wait_mark(mark, 0, 0.0)
    assert time.perf_counter() - started < 8.0
    assert status == 7 and len(text.encode()) > live_shell.MAX_OUTPUT_BYTES - 2048  # head and tail, and the cut said
    assert "bytes of output dropped" in text and len(shell._out) == 0
