"""Every Redis key and queue name toolfleet uses, in one place.

All live under the settings' ``namespace`` (default ``toolfleet``).
"""

from __future__ import annotations


class Keys:
    """Key builder for one namespace."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    # --- per turn (the ledger) ---
    def turn_calls(self, turn_id: str) -> str:
        """Hash call_id -> tool name: the calls of the turn (set at submit)."""
        return f"{self.ns}:turn:{turn_id}:calls"

    def turn_started(self, turn_id: str) -> str:
        """Hash call_id -> JSON {worker, started_at}: the calls whose handler began."""
        return f"{self.ns}:turn:{turn_id}:started"

    def turn_results(self, turn_id: str) -> str:
        """Hash call_id -> ToolResult JSON: the first (and only) result recorded per call."""
        return f"{self.ns}:turn:{turn_id}:results"

    def turn_cancelled(self, turn_id: str) -> str:
        """String: set when the turn is cancelled (value: reason)."""
        return f"{self.ns}:turn:{turn_id}:cancelled"

    def turn_events(self, turn_id: str) -> str:
        """Stream of the turn's events (started, result, cancel), read by the dispatcher."""
        return f"{self.ns}:turn:{turn_id}:events"

    def cancel_channel(self, turn_id: str) -> str:
        """Pub/sub channel workers listen on to stop a turn's running calls."""
        return f"{self.ns}:cancel:{turn_id}"

    @property
    def cancel_pattern(self) -> str:
        return f"{self.ns}:cancel:*"

    # --- fleet ---
    def catalog(self, worker: str) -> str:
        """String (JSON, with a time to live): the tools one live worker serves."""
        return f"{self.ns}:catalog:{worker}"

    @property
    def catalog_pattern(self) -> str:
        return f"{self.ns}:catalog:*"

    @property
    def workers_ready(self) -> str:
        """List: a worker pushes its name here once it consumes (tests and `up` join on it)."""
        return f"{self.ns}:workers:ready"

    def queue(self, tool_queue: str) -> str:
        """Celery queue name of a tool's queue."""
        return f"{self.ns}.{tool_queue}"
