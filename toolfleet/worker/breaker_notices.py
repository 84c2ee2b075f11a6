"""What a pool process hears of its tools' circuit breakers: when each last counted a failure.

A call that worked ends its tool's run of consecutive failures (:mod:`toolfleet.breaker`). To spare
a Redis read per call, a worker's claim reads the tool's failure counter with the turn's flags
(:attr:`toolfleet.ledger.Claim.failures_seen`), and the breaker's observe script publishes the
tool's name on :attr:`toolfleet.keys.Keys.breaker_failed_channel` each time it counts a failure.
The pool process's listener (:class:`~toolfleet.worker.cancel_watch.CancelWatcher`, one pub/sub
connection for both) records it here, so a call that worked resets the count when failures were
counted before it began (its claim saw them) or while it ran (heard here). While the listener is
not subscribed (starting, reconnecting), every tool counts as possibly failed: the reset is then
done, as it costs only one read in the record script.
"""

from __future__ import annotations

import time

from .. import forksafe


class FailureNotices:
    """Per process; thread-safe. Times are ``time.monotonic()`` seconds."""

    def __init__(self) -> None:
        self._lock = forksafe.lock()
        self._failed_at: dict[str, float] = {}
        self._listening_since: float | None = None  # None: not subscribed now

    def listening(self) -> None:
        """The listener is subscribed (from now on it hears every failure published)."""
        with self._lock:
            self._listening_since = time.monotonic()

    def deaf(self) -> None:
        """The listener lost its subscription (it reconnects)."""
        with self._lock:
            self._listening_since = None

    def heard(self, tool: str) -> None:
        """A breaker counted a failure of ``tool``."""
        with self._lock:
            self._failed_at[tool] = time.monotonic()

    def failed_since(self, tool: str, since: float) -> bool:
        """True when a failure of ``tool`` may have been counted at or after ``since``: one was
        heard, or the listener was not subscribed all the time since."""
        with self._lock:
            if self._listening_since is None or self._listening_since > since:
                return True
            return self._failed_at.get(tool, float("-inf")) >= since
