"""What a handler gets to know about the call it runs: ids, workspace, deadline, cancel signal."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import RedisError

from ..errors import BrokerUnavailable, CallCancelled, StaleFence, ToolFailure

log = logging.getLogger(__name__)
# check_fence's reason when Redis could not be asked: the execution may well still hold its call
UNCONFIRMED = "could not confirm the fencing token"


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
    - ``fencing_token``: this execution's fencing token (an ``int``, increasing across the
      namespace: a later claim of any call has a larger one), or ``None`` outside a worker. Pass it
      to your own resource so a stale execution's write is refused there too (a database row's
      ``UPDATE ... SET fence = :token WHERE id = :id AND fence < :token``, an object store's
      conditional write); see docs/guarantees.md, "Fencing".
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
    fencing_token: int | None = None
    fence_check: Callable[[], str] | None = field(default=None, repr=False)  # set by the worker
    fenced: str = ""  # why check_fence refused, once it has
    hard_deadline: float = float("inf")  # time.monotonic() at which the worker kills the call
    session: Any = field(default=None, repr=False)

    @property
    def fence_unconfirmed(self) -> bool:
        """``check_fence`` refused because Redis could not be reached to ask, not because another
        execution or an answer took the call (this execution may still hold it)."""
        return self.fenced.startswith(UNCONFIRMED)

    @property
    def remaining_s(self) -> float:
        """Seconds left before the time limit (may be negative)."""
        return self.deadline - time.monotonic()

    def check_cancelled(self) -> None:
        """Raise :class:`~toolfleet.errors.CallCancelled` if the turn was cancelled."""
        if self.cancelled.is_set():
            raise CallCancelled(self.cancel_reason or "the turn was cancelled")

    def check_fence(self) -> None:
        """Call right before an effect (a file's final rename, a payment): returns ``None`` while
        this execution still holds its call, else raises :class:`~toolfleet.errors.StaleFence`
        (and logs it): a newer execution claimed the call, the caller already has its answer, the
        turn was cancelled (cancellable tools), the call's hard time limit passed, or another
        execution holds its idempotency key. One Redis round trip; Redis unreachable refuses too
        (fail closed), saying so: this execution may still hold the call, and its refusal be the
        call's answer. Outside a worker (no ``fence_check``) it never refuses."""
        if self.fence_check is None:
            return
        try:
            why = self.fence_check()
        except (BrokerUnavailable, RedisError, OSError) as exc:  # cannot confirm that it still holds the call
            why = f"{UNCONFIRMED} ({type(exc).__name__}: {exc})"
        if not why:
            return
        if why == "the turn was cancelled":
            self.cancel(self.cancel_reason or why)
            raise CallCancelled(f"{why}; the step was not taken")
        self.fenced = why
        log.warning("call %s (turn %s, fencing token %s): step refused: %s", self.call_id, self.turn_id,
                    self.fencing_token, why)
        if self.fence_unconfirmed:  # fail closed; this execution may still hold the call, this be its answer
            raise StaleFence(f"Redis could not be reached to confirm that this execution still holds the call "
                             f"(fencing token {self.fencing_token}: {why}); its step was refused, not taken",
                             "the call may have done part of its work before that step; check the real state "
                             "before repeating it")
        raise StaleFence(f"this execution no longer holds the call (fencing token {self.fencing_token}): {why}; "
                         "its step was refused",
                         "the caller's answer for this call stands; check the real state before repeating it")

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


def check_fence_before_start(ctx: ToolContext, what: str) -> None:
    """:meth:`ToolContext.check_fence` right before an effect that is the handler's first (a
    command's sandbox, a hosted MCP server's call). Refused because Redis could not be reached
    (fail closed: this execution may still hold the call, and this be its answer), it says that
    nothing ran, ``NOT_EXECUTED``, as a slow claim's refused recheck does; ``StaleFence``'s
    ``OUTCOME_UNKNOWN`` said the call "may have done part of its work" when none of it had run.
    Refused because the turn was cancelled, it is ``CANCELLED`` saying so, not the handler's
    "it was stopped; the call may have done part of its work"."""
    try:
        ctx.check_fence()
    except CallCancelled:
        raise ToolFailure(f"the turn was cancelled before {what} started; it did not run",
                          "nothing happened; ask again if the call is still wanted", code="CANCELLED") from None
    except StaleFence:
        if not ctx.fence_unconfirmed:
            raise  # a stale execution: only a late note, the caller's answer stands
        raise ToolFailure(f"{what} was not started: Redis could not be reached to confirm that this execution "
                          f"still held its call ({ctx.fenced}); it did not run",
                          "nothing happened; ask again once the fleet's Redis answers", code="NOT_EXECUTED") from None
