"""The CLI's consoles (rich): a terminal's own width, a sane width when piped.

Rich lays out for 80 columns when the output is not a terminal, so a table piped to ``less`` or a
file squeezed its text into narrow columns. Piped, the width is ``$COLUMNS`` when set, else
:data:`PIPED_WIDTH`; no colour and no control codes are written there (rich's default off a tty).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console

PIPED_WIDTH = 120  # columns of piped output when $COLUMNS does not say


def piped_width(environ: dict[str, str] | None = None) -> int:
    """``$COLUMNS`` when it is a number of at least 20, else :data:`PIPED_WIDTH`."""
    value = (environ if environ is not None else os.environ).get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) >= 20 else PIPED_WIDTH


def make_console(stderr: bool = False, file: TextIO | None = None) -> Console:
    """A console for stdout (or stderr): the terminal's width on a terminal, :func:`piped_width` otherwise."""
    stream = file or (sys.stderr if stderr else sys.stdout)
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        tty = False
    return Console(stderr=stderr, file=file, width=None if tty else piped_width())


WHOLE_MAX_CHARS = 40  # ids and names up to this long stay on one line; longer ones fold


def whole_width(values: list[str], console_width: int, others: int) -> int:
    """A ``width`` for a column of ids or names: the longest value (at most
    :data:`WHOLE_MAX_CHARS`), but leaving ``others`` columns of the console to the other columns."""
    longest = max((len(v) for v in values), default=1)
    return max(min(longest, WHOLE_MAX_CHARS, console_width - others), 8)
