"""The lines of a text file, streamed: ``read_file`` and ``grep`` hold a block of the file at a
time, never the whole of it decoded and split (a 20 MiB file of 2-byte lines split whole is ten
million str objects, about 770 MiB of the worker's memory).

Lines are those of ``str.splitlines`` over the file decoded as UTF-8 (invalid bytes replaced), as
the tools always counted them: a line ends at ``\\n``, ``\\r\\n``, ``\\r``, ``\\v``, ``\\f``,
``\\x1c``-``\\x1e``, U+0085, U+2028 or U+2029. A block is about :data:`BLOCK_BYTES` read on to the
next ``\\n``, so no line break and no UTF-8 sequence is cut between blocks, and decoding block by
block gives the text decoding the whole file gives."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from typing import BinaryIO

BLOCK_BYTES = 64 * 1024
SPLIT_WHOLE_CHARS = 256 * 1024  # a longer block (a long line) is split lazily, line by line
BINARY_SNIFF_BYTES = 8192
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE = re.compile(f"([^{_BREAKS}]*)(?:\r\n|[{_BREAKS}])?")
_BREAK_BYTES = tuple(ch.encode() for ch in _BREAKS)  # U+0085 etc. as their UTF-8 sequences


def is_binary(data: bytes | bytearray, start: int = 0) -> bool:
    """Whether a file whose bytes from ``start`` on begin with ``data`` is binary: a NUL in its
    first 8 KiB."""
    return start < BINARY_SNIFF_BYTES and b"\0" in data[: BINARY_SNIFF_BYTES - start]


def blocks(handle: BinaryIO, max_bytes: int) -> Iterator[bytes | bytearray]:
    """The content of ``handle`` from where it is, in blocks each ending with ``\n`` (but the
    last), at most ``max_bytes`` in all. A line longer than a block is a block of its own, read
    into one buffer a block at a time (not read whole, then copied once more)."""
    left = max_bytes
    while left > 0:
        block = handle.read(min(BLOCK_BYTES, left))
        if not block:
            return
        left -= len(block)
        if block.endswith(b"\n") or not left:
            yield block
            continue
        end = block.rfind(b"\n") + 1
        if end:
            yield block[:end]
        line = bytearray(block[end:])
        del block
        while left > 0 and not line.endswith(b"\n"):
            more = handle.readline(min(BLOCK_BYTES, left))
            if not more:
                break
            left -= len(more)
            line += more
        yield line


def lines_in(block: bytes | bytearray) -> int:
    """How many lines ``block`` (a whole number of lines, or the file's end) holds, without
    decoding it: its line breaks, plus one for a last line without one."""
    if not block:
        return 0
    breaks = sum(block.count(b) for b in _BREAK_BYTES) - block.count(b"\r\n")
    return breaks + (not block.endswith(_BREAK_BYTES))


def split(text: str, keepends: bool = False) -> Iterable[str]:
    """``text.splitlines(keepends)``, lazily for a long text (one line at a time: a 20 MiB line of
    form feeds must not become 20 million strings at once)."""
    if len(text) <= SPLIT_WHOLE_CHARS:
        return text.splitlines(keepends)
    return _lazy(text, 0 if keepends else 1)


def spans(text: str) -> Iterator[tuple[str, int]]:
    """The lines of a long ``text`` (:func:`split`, without their breaks), one at a time, as
    ``(source, end)``: the line is ``source[:end]``. ``source`` is the line itself, or the text for
    its first line (a long line is a block of its own: it is not copied; ``regex.search(source, 0,
    end)`` searches it as if it were the whole string)."""
    match = _LINE.match(text)
    assert match is not None
    yield text, match.end(1)
    for line in _lazy(text, 1, match.end()):
        yield line, len(line)


def _lazy(text: str, group: int, pos: int = 0) -> Iterator[str]:
    end = len(text)
    while pos < end:
        match = _LINE.match(text, pos)
        assert match is not None  # the pattern matches at any position
        yield match.group(group)
        pos = match.end()


def window(pieces: Iterable[str], start: int, stop: int) -> Iterable[str]:
    """``pieces[start:stop]`` of a list or of a lazy iterator."""
    if isinstance(pieces, list):
        return pieces[start:stop]
    return itertools.islice(pieces, start, stop)


def decode(block: bytes | bytearray) -> str:
    return block.decode("utf-8", errors="replace")
