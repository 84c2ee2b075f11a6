"""Fitting a tool's output into its budget for the model (docs/design.md, "Adapter (out)")."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)
EMPTY_OUTPUT = "(no output)"
MARKER_SLACK = 40  # room for the digits the marker's numbers may grow by
MAX_CAPTURE_BYTES = 4 * 1024 * 1024  # of a command's output, kept in the worker (head and tail halves)


class HeadTail:
    """What a process printed, kept within ``max_bytes`` however much it prints: the first and the
    last ``max_bytes // 2`` bytes, the middle dropped and said in :meth:`text` (a ``yes`` running
    for its whole time limit must not fill the worker's memory, nor Redis, where a long output is
    stored for ``read_output``). Thread-safe: one thread adds, another reads."""

    def __init__(self, max_bytes: int = MAX_CAPTURE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.dropped = 0  # bytes cut from the middle
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        """Keep ``chunk`` (the next bytes printed): the head fills first, then the tail keeps the
        newest bytes; what leaves the tail is counted in :attr:`dropped`."""
        half = self.max_bytes // 2
        with self._lock:
            if len(self._head) < half:
                take = half - len(self._head)
                self._head += chunk[:take]
                chunk = chunk[take:]
            if not chunk:
                return
            self._tail.append(chunk)
            self._tail_bytes += len(chunk)
            while self._tail_bytes > self.max_bytes - half:  # drop the oldest bytes of the tail
                first, over = self._tail[0], self._tail_bytes - (self.max_bytes - half)
                if len(first) <= over:
                    self._tail.popleft()
                    cut = len(first)
                else:
                    self._tail[0] = first[over:]
                    cut = over
                self._tail_bytes -= cut
                self.dropped += cut

    def text(self) -> str:
        """The output as text (UTF-8, invalid bytes replaced), with a line where the middle was cut."""
        with self._lock:
            head, tail, dropped = bytes(self._head), b"".join(self._tail), self.dropped
        if not dropped:
            return (head + tail).decode("utf-8", errors="replace")
        return (head.decode("utf-8", errors="replace")
                + f"\n[... {dropped} bytes of output dropped here: the worker keeps the first {len(head)} and the "
                  f"last {len(tail)} bytes of a command's output; send a narrower command ...]\n"
                + tail.decode("utf-8", errors="replace"))


def fit_output(text: str, max_chars: int, store: Callable[[str], str] | None = None) -> str:
    """``text`` if it fits in ``max_chars``, else its head and tail around a marker that says how
    long it was, how much was cut and how to read the rest. With ``store`` (saves the whole text,
    returns a reference), the marker names the reference and the ``read_output`` call that reads
    on from the head; if the store fails, the marker says to narrow the command instead. Empty
    text becomes a short placeholder, because an empty tool result is refused by some providers
    and confuses models."""
    if not text.strip():
        return EMPTY_OUTPUT
    if len(text) <= max_chars:
        return text
    ref = None
    if store is not None:
        try:
            ref = store(text)
        except Exception as exc:  # the model still gets head and tail
            log.warning("could not store a long output (%s); returning head and tail only", exc)
    if ref:
        marker = (
            "\n[... {cut} of {total} characters cut from the middle (characters {head}-{end}). "
            f'The whole output is stored as "{ref}": read on with read_output(ref="{ref}", '
            "offset={head}, limit=10000), or use a narrower command ...]\n"
        )
    else:
        marker = (
            "\n[... {cut} of {total} characters cut from the middle (characters {head}-{end}); "
            "read the rest in parts, e.g. read_file with offset/limit or a narrower command ...]\n"
        )
    room = max(max_chars - len(marker) - MARKER_SLACK, 0)
    head = room * 2 // 3
    tail = room - head
    cut = len(text) - head - tail
    shown = marker.format(cut=cut, total=len(text), head=head, end=head + cut)
    return text[:head] + shown + (text[-tail:] if tail else "")
