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

    @property
    def remaining_s(self) -> float:
        """Seconds left before the time limit (may be negative)."""
        return self.deadline - time.monotonic()

    def check_cancelled(self) -> None:
        """Raise :class:`~toolfleet.errors.CallCancelled` if the turn was cancelled."""
        if self.cancelled.is_set():
            raise CallCancelled(self.cancel_reason or "the turn was cancelled")

    def resolve_path(self, path: str) -> Path:
        """Absolute, symlink-resolved path of ``path`` (relative to the workspace, or absolute
        inside it). Raises :class:`~toolfleet.errors.PermissionDenied` when it lies outside the
        workspace, :class:`~toolfleet.errors.ToolFailure` when the turn has no workspace. Tools
        that take paths call this before touching the file system."""
        from .workspace import resolve_path

        return resolve_path(self, path)

    def cancel(self, reason: str = "the turn was cancelled") -> None:
        """Set the cancel signal (called by the worker when the turn is cancelled)."""
        self.cancel_reason = reason
        self.cancelled.set()
