"""Finding processes a call left behind, by a unique marker in their command line (/proc)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def marker() -> str:
    """A unique number of seconds, e.g. ``1234.000123457``: ``sleep <marker>`` sleeps about 20 min and
    its command line names it, so no other process matches."""
    return f"1234.{uuid.uuid4().int % 10**9:09d}"


def processes_with(word: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live, non-zombie process whose command line holds ``word``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if word in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def wait_gone(word: str, timeout_s: float = 2.0) -> list[tuple[int, str]]:
    """:func:`processes_with` once they are gone or ``timeout_s`` passed (a process sent SIGKILL
    still shows in /proc for a moment while it exits); returns what is left."""
    import time

    deadline = time.monotonic() + timeout_s
    left = processes_with(word)
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = processes_with(word)
    return left
