"""Fitting a tool's output into its budget for the model (DESIGN.md, "Adapter (out)")."""

from __future__ import annotations

EMPTY_OUTPUT = "(no output)"


def fit_output(text: str, max_chars: int) -> str:
    """``text`` if it fits in ``max_chars``, else its head and tail around a marker that says how
    much was cut and how to read the rest. Empty text becomes a short placeholder, because an empty
    tool result is refused by some providers and confuses models."""
    if not text.strip():
        return EMPTY_OUTPUT
    if len(text) <= max_chars:
        return text
    marker = (
        f"\n[... {{cut}} of {len(text)} characters cut from the middle; "
        "read the rest in parts, e.g. read_file with offset/limit or a narrower command ...]\n"
    )
    room = max(max_chars - len(marker) - 8, 0)
    head = room * 2 // 3
    tail = room - head
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut=cut) + (text[-tail:] if tail else "")
