"""Tools for tests/test_late_commands.py: ``run_command``'s pool process stops itself (SIGSTOP)
inside the handler, right before the command's sandbox starts: a GC pause, a VM stall between the
handler's start and its effect. Only in a worker started with ``TOOLFLEET_TEST_LATE_CMD_DIR`` set
(a folder: the handler leaves ``starting-<call id>`` there before it stops)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from toolfleet.tools import command
from toolfleet.tools.spec import tool

_bounded = command._bounded


def _stop_then_bound(argv, ctx, box):  # type: ignore[no-untyped-def]
    folder = os.environ.get("TOOLFLEET_TEST_LATE_CMD_DIR")
    if folder:
        (Path(folder) / f"starting-{ctx.call_id}").touch()
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the test's SIGCONT
    return _bounded(argv, ctx, box)


command._bounded = _stop_then_bound


@tool(access="read", timeout_s=30)
def late_cmd_echo(text: str) -> str:
    """Return ``text`` (a call to join on: the pool took it after the one before).

    Args:
        text: echoed back.
    """
    return text
