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
MAX_STORED_BYTES = MAX_CAPTURE_BYTES  # of any tool's output, stored in Redis for read_output (head and tail)
STORED_SLACK = 1024  # over MAX_STORED_BYTES: room for HeadTail's note, so a command's output is not cut twice
_ENCODE_STEP = 1 << 20  # characters encoded at a time when a long text is cut


class HeadTail:
    """What a process printed, kept within ``max_bytes`` however much it prints: the first and the
    last ``max_bytes // 2`` bytes, the middle dropped and said in :meth:`text` (a ``yes`` running
    for its whole time limit must not fill the worker's memory, nor Redis, where a long output is
    stored for ``read_output``). Thread-safe: one thread adds, another reads. ``what`` and ``advice``
    word the note where the middle was cut."""

    def __init__(self, max_bytes: int = MAX_CAPTURE_BYTES, what: str = "a command's output",
                 advice: str = "send a narrower command") -> None:
        self.max_bytes = max_bytes
        self.what = what
        self.advice = advice
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
                  f"last {len(tail)} bytes of {self.what}; {self.advice} ...]\n"
                + tail.decode("utf-8", errors="replace"))


def within_stored_bound(text: str, max_bytes: int = MAX_STORED_BYTES) -> tuple[str, int]:
    """``(text, 0)`` if its UTF-8 holds at most ``max_bytes`` (plus :data:`STORED_SLACK`), else
    ``(its first and last max_bytes // 2 bytes around a note, the bytes dropped)``, cut by a
    :class:`HeadTail` as a command's output is: what any tool's output puts in Redis is bounded
    like run_command's."""
    if len(text) * 4 <= max_bytes or (
            len(text) <= max_bytes + STORED_SLACK
            and (text.isascii() or len(text.encode("utf-8", errors="replace")) <= max_bytes + STORED_SLACK)):
        return text, 0
    kept = HeadTail(max_bytes, what="a tool's output",
                    advice="ask for less per call (a narrower path, pattern or command, or offset and limit)")
    for start in range(0, len(text), _ENCODE_STEP):
        kept.add(text[start : start + _ENCODE_STEP].encode("utf-8", errors="replace"))
    return kept.text(), kept.dropped


def fit_output(text: str, max_chars: int, store: Callable[[str], str] | None = None) -> str:
    """``text`` if it fits in ``max_chars``, else its head and tail around a marker that says how
    long it was, how much was cut and how to read the rest. With ``store`` (saves the text,
    returns a reference), the marker names the reference and the ``read_output`` call that reads
    on from the head; if the store fails, the marker says to narrow the command instead. A text
    over :data:`MAX_STORED_BYTES` is first cut to its first and last halves of that
    (:func:`within_stored_bound`), and that is what is stored and what the marker counts. Empty
    text becomes a short placeholder, because an empty tool result is refused by some providers
    and confuses models."""
    if not text.strip():
        return EMPTY_OUTPUT
    if len(text) <= max_chars:
        return text
    whole = len(text)
    text, dropped = within_stored_bound(text)
    ref = None
    if store is not None:
        try:
            ref = store(text)
        except Exception as exc:  # the model still gets head and tail
            log.warning("could not store a long output (%s); returning head and tail only", exc)
    if ref:
        stored = (f'The whole output is stored as "{ref}"' if not dropped else
                  f'Of its {whole} characters, the first and last {MAX_STORED_BYTES // 2 // 2**20} MiB are stored '
                  f'({dropped} bytes dropped between them) as "{ref}"')
        marker = (
            "\n[... {cut} of {total} characters cut from the middle (characters {head}-{end}). "
            f'{stored}: read on with read_output(ref="{ref}", '
            "offset={head}, limit=10000), or use a narrower command ...]\n"
        )
    else:
        kept = "" if not dropped else (f" (of its {whole} characters, the first and last "
                                       f"{MAX_STORED_BYTES // 2 // 2**20} MiB were kept)")
        marker = (
            "\n[... {cut} of {total} characters cut from the middle (characters {head}-{end})" + kept + "; "
            "read the rest in parts, e.g. read_file with offset/limit or a narrower command ...]\n"
        )
    room = max(max_chars - len(marker) - MARKER_SLACK, 0)
    head = room * 2 // 3
    tail = room - head
    cut = len(text) - head - tail
    shown = marker.format(cut=cut, total=len(text), head=head, end=head + cut)
    return text[:head] + shown + (text[-tail:] if tail else "")
