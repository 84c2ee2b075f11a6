"""Fitting a tool's output into its budget for the model (docs/design.md, "Adapter (out)")."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)
EMPTY_OUTPUT = "(no output)"
MARKER_SLACK = 40  # room for the digits the marker's numbers may grow by


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
