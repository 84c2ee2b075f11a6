"""The output of a live shell's command (:mod:`.live_shell`): kept, bounded, and searched for the
command's end marker, in time linear in the output.

What is kept: everything up to ``max_bytes``; past it the first half (the head) and the newest
bytes up to ``max_bytes`` (the tail), the middle dropped and counted in :attr:`ShellOutput.dropped`.
Head and tail are held apart, so dropping the oldest bytes of the tail is cheap (a bytearray drops
its front without moving the rest) instead of moving 2 MB at every chunk.

The search: the shell's reader looks for the marker at every chunk that arrives (and every poll),
and looking through the whole output each time was quadratic (4 MB arriving in 1 kB chunks took
9 s). :meth:`ShellOutput.find` goes on from where the last look stopped (the last ``len(mark) - 1``
bytes looked at again: a marker may be cut between two chunks); when the tail's front is dropped,
the bytes around the head's end meet new neighbours, and only those are looked at again. It finds
what ``bytes(view).find(mark)`` would, for the bytes kept at the time it is called.

Not thread-safe: the shell calls it under its lock.
"""

from __future__ import annotations

import socket


class ShellOutput:
    """The output kept since the last command ended (or the shell started)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.dropped = 0  # bytes of output dropped from the middle (the caller resets it per command)
        self._head = bytearray()  # all of it while under max_bytes; the first max_bytes // 2 once past
        self._tail = bytearray()  # past max_bytes: the newest bytes after the head
        self._mark = b""
        self._from = 0  # no marker starts before this position (once _junction is checked)
        self._junction = False  # the bytes around the head's end changed since the last look

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    def add(self, chunk: bytes) -> None:
        """Keep ``chunk``, dropping the middle past ``max_bytes`` (head and newest tail kept)."""
        half = self.max_bytes // 2
        if self._tail:
            self._tail += chunk
        else:
            self._head += chunk
            if len(self._head) <= self.max_bytes:
                return
            self._tail = self._head[half:]  # head and tail part here, for good
            del self._head[half:]
        cut = len(self) - self.max_bytes
        if cut <= 0:
            return
        del self._tail[:cut]
        self.dropped += cut
        if self._from > half:  # positions in the tail moved down by cut; the dropped ones are gone
            self._from = max(self._from - cut, half)
        if self._mark and self._from > half - len(self._mark) + 1:
            self._junction = True

    def clear(self) -> None:
        """Forget the bytes (:attr:`dropped` stays, as the caller counts it per command)."""
        self._head, self._tail = bytearray(), bytearray()
        self._from, self._junction = 0, False

    def find(self, mark: bytes) -> int:
        """The position of the first ``mark`` in the bytes kept, or -1. A new ``mark`` starts anew."""
        if mark != self._mark:
            self._mark, self._from, self._junction = mark, 0, False
        m = len(mark)
        if self._junction:
            self._junction = False
            start = max(len(self._head) - m + 1, 0)
            window = bytes(self._head[start:]) + bytes(self._tail[:m - 1])
            at = window.find(mark)
            if at >= 0:
                self._from = start + at
                return start + at
        at = self._find(mark, self._from)
        self._from = at if at >= 0 else max(len(self) - m + 1, 0)
        return at

    def _find(self, needle: bytes, start: int) -> int:
        """``needle`` at or after ``start`` in head + tail, across their meeting point too."""
        head, m = len(self._head), len(needle)
        if start < head:
            at = self._head.find(needle, start)
            if at >= 0:
                return at
            if self._tail and m > 1:
                cross = max(start, head - m + 1)
                window = bytes(self._head[cross:]) + bytes(self._tail[:m - 1])
                at = window.find(needle)
                if at >= 0:
                    return cross + at
        if not self._tail:
            return -1
        at = self._tail.find(needle, max(start - head, 0))
        return head + at if at >= 0 else -1

    def find_newline(self, start: int) -> int:
        """The first ``\\n`` at or after ``start``, or -1."""
        return self._find(b"\n", start)

    def slice(self, start: int, end: int) -> bytes:
        """The bytes kept from ``start`` to ``end``."""
        head = len(self._head)
        if end <= head:
            return bytes(self._head[start:end])
        if start >= head:
            return bytes(self._tail[start - head:end - head])
        return bytes(self._head[start:]) + bytes(self._tail[:end - head])

    def take(self) -> bytes:
        """All the bytes kept, forgotten."""
        data = self.slice(0, len(self))
        self.clear()
        return data

    def consume(self, end: int) -> None:
        """Forget the bytes before ``end`` (what follows stays, as one head)."""
        rest = self.slice(end, len(self))
        self.clear()
        self._head = bytearray(rest)


def _join(*notes: str) -> str:
    return "\n".join(n for n in notes if n)


def _text(data: bytes, dropped: int) -> str:
    text = data.decode("utf-8", errors="replace")
    if dropped:
        half = len(text) // 2
        text = text[:half] + f"\n[... {dropped} bytes of output dropped ...]\n" + text[half:]
    return text


def _recv(out: socket.socket) -> bytes:
    """The next bytes of the output channel; ``b""`` at its end, or once the worker closed its end."""
    try:
        return out.recv(65536)
    except OSError:  # closed under the drain by close(): the shell is gone
        return b""
