"""The approval side of a :class:`~toolfleet.dispatcher.turn.Turn`: its held calls, answering
them, and waiting until only people are waited for.

A mixin, so the turn's driver (turn.py) keeps one role: it calls :meth:`_on_approved` when an
``approved`` event arrives and leaves every call in ``_held`` unsubmitted. The state it reads
(``_lock``, ``_changed``, ``_held``, ``_calls``, ``_planner``, ...) is the turn's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ToolfleetError

if TYPE_CHECKING:
    from ..policy.rules import Rule
    from .approvals import Approvals, PendingCall


class TurnApprovals:
    """Held calls of a turn: :attr:`pending`, :meth:`approve`, :meth:`deny`, :meth:`wait_settled`."""

    @property
    def pending(self) -> list[PendingCall]:
        """The calls waiting for a person's approval, in model order (empty when none)."""
        with self._lock:
            return [self._held[c.id] for c in self._calls if c.id in self._held]

    def approve(self, call_id: str, *, by: str | None = None, remember: str | bool = False) -> Rule | None:
        """Run the held call ``call_id`` in its place in the plan (when the calls it waits for have
        results). ``remember="git *"`` (a command pattern) or ``True`` (the whole tool) keeps the
        approval as a rule for this workspace; the rule is returned. Raises
        :class:`~toolfleet.errors.NotPending` if the call is not waiting for approval."""
        rule = self._approvals().approve(self.turn_id, call_id, by=by, remember=remember)
        self._on_approved(call_id)  # at once, not only when the driver reads the event
        return rule

    def deny(
        self, call_id: str, reason: str = "a person denied it", *, by: str | None = None,
        remember: str | bool = False,
    ) -> Rule | None:
        """Refuse the held call ``call_id``: its result is ``PERMISSION_DENIED`` with ``reason``.
        Raises :class:`~toolfleet.errors.NotPending` if the call is not waiting for approval."""
        rule = self._approvals().deny(self.turn_id, call_id, reason, by=by, remember=remember)
        with self._lock:  # no longer waits for a person: it waits for its result event
            self._held.pop(call_id, None)
        return rule

    def wait_settled(self, timeout_s: float | None = None) -> list[PendingCall]:
        """Block until the turn is closed and every call has its result or waits on a person (held,
        or after a held call in the plan); return the pending calls. Raises ``TimeoutError`` if
        ``timeout_s`` passes first."""
        with self._changed:
            if not self._changed.wait_for(self._settled, timeout_s):
                raise TimeoutError(f"turn {self.turn_id} not settled after {timeout_s} s")
        return self.pending

    def _settled(self) -> bool:  # under self._lock
        if self._done.is_set():
            return True
        if not self._closed:
            return False
        blocked = set(self._held)
        for call_id, deps in self._planner.deps.items():  # model order: a call's deps come before it
            if call_id not in self._finished and deps & blocked:
                blocked.add(call_id)
        return all(c.id in self._results or c.id in blocked for c in self._calls)

    def _approvals(self) -> Approvals:
        if self._guard is None:
            raise ToolfleetError("this turn was created without a policy guard")
        return self._guard.approvals

    def _on_approved(self, call_id: str) -> None:
        with self._lock:
            if self._held.pop(call_id, None) is None:
                return
            ready = (
                self._cancelled_at is None
                and call_id not in self._scheduled
                and call_id not in self._finished
                and self._ready(call_id)
            )
            if ready:
                self._scheduled.add(call_id)
            self._changed.notify_all()
        if ready:
            self._submit(call_id)
