"""What a handler gets to know about the call it runs: ids, workspace, deadline, cancel signal."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CallCancelled


@dataclass
class ToolContext:
    """Passed to handlers that declare a ``ctx: ToolContext`` parameter.

    - ``deadline``: ``time.monotonic()`` value at which the call's time limit ends.
    - ``cancelled``: set when the turn is cancelled; long handlers should check it
      (``ctx.check_cancelled()``) or wait on it instead of sleeping.
    - ``workspace``: the turn's workspace root, or ``None`` for tools that need none.
    - ``attempt``: 1 for the first execution, more when a call was redelivered.
    - ``output_store``: where the worker keeps whole outputs that were cut (``read_output`` reads
      it); ``None`` outside a worker.
    - ``session``: for a tool with stored session state (:mod:`toolfleet.tools.state`), the state
      the worker loaded for this call; a write call's handler changes it in place or assigns a
      new value, and the worker saves it after the handler. ``None`` for other tools.
    """

    call_id: str
    turn_id: str
    tool_name: str
    session_id: str | None = None
    workspace: Path | None = None
    deadline: float = float("inf")
    attempt: int = 1
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    output_store: Any = field(default=None, repr=False)
    session: Any = field(default=None, repr=False)

    @property
    def remaining_s(self) -> float:
        """Seconds left before the time limit (may be negative)."""
        return self.deadline - time.monotonic()

    def check_cancelled(self) -> None:
        """Raise :class:`~toolfleet.errors.CallCancelled` if the turn was cancelled."""
        if self.cancelled.is_set():
            raise CallCancelled(self.cancel_reason or "the turn was cancelled")

    def check_fence(self) -> None:
        """Called by a built-in tool right before its effect happens (e.g. just before the final
        rename of ``write_file``/``edit_file``): returns None while this execution still holds
        the call, raises when its fencing token is stale. A no-op until fencing tokens exist."""
        return None

    def resolve_path(self, path: str) -> Path:
        """Absolute path of ``path`` (relative to the workspace, or absolute inside it), with
        links resolved beneath the workspace. Raises :class:`~toolfleet.errors.PermissionDenied`
        when it leads outside, :class:`~toolfleet.errors.ToolFailure` when the turn has no
        workspace.

        A **check** at one moment only: a link swapped in before a later ``open(result)`` can
        still lead out. To read or write a workspace file, use :meth:`open`."""
        from .workspace import resolve_path

        return resolve_path(self, path)

    def open(self, path: str, mode: str = "r", *, encoding: str | None = None, errors: str | None = None,
             newline: str | None = None) -> Any:
        """Open a workspace file, confined by the kernel (``openat2`` beneath the workspace).

        ``mode``: ``"r"``/``"rb"`` give a file object over the regular file (links inside the
        workspace followed; FIFOs and devices refused); ``"w"``/``"wb"``/``"a"``/``"ab"`` give
        a writer whose ``close()`` (or the normal end of a ``with`` block) replaces the file at
        once with a new one (never writing through a link or into a hard-linked file; parents
        created; ``check_fence()`` called just before), while an exception in the ``with``
        block changes nothing. Text defaults to UTF-8. Raises ToolFailure
        (``PERMISSION_DENIED`` outside the workspace, ``EXECUTION_ERROR`` not found),
        ``ValueError`` for another mode. Source: :mod:`toolfleet.tools.writes`."""
        from .writes import open_in_workspace

        return open_in_workspace(self, path, mode, encoding=encoding, errors=errors, newline=newline)

    def cancel(self, reason: str = "the turn was cancelled") -> None:
        """Set the cancel signal (called by the worker when the turn is cancelled)."""
        self.cancel_reason = reason
        self.cancelled.set()
