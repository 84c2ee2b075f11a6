"""The agent side's entry point: ``Dispatcher.submit`` turns a batch into a running :class:`Turn`.

Path (DESIGN.md): adapter in -> check ids -> validate (name, then arguments) -> plan -> open the
turn in the ledger -> record the error results of bad calls -> submit what waits for nothing.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..errors import BatchRejected
from ..ledger import Ledger
from ..models import ToolCall, ToolResult
from ..settings import Settings
from ..tools.registry import Registry, default_registry
from ..tools.resources import resolve
from ..tools.validation import check_arguments, parse_arguments, unknown_tool
from ..worker.app import create_app
from .adapters import Adapter, detect, get_adapter
from .plan import PlanItem, make_plan
from .submit import Submitter
from .turn import Runnable, Turn


class Dispatcher:
    """Runs batches of tool calls on the workers of ``settings.namespace``.

    ``registry`` must describe the same tools the workers serve (default: the built-in workspace
    tools). Raises :class:`~toolfleet.errors.BrokerUnavailable` at construction if Redis does not
    answer.
    """

    def __init__(self, settings: Settings | None = None, registry: Registry | None = None) -> None:
        self.settings = settings or Settings()
        self.registry = registry if registry is not None else default_registry()
        self.ledger = Ledger(self.settings)
        self.app = create_app(self.settings, self.registry)
        self.submitter = Submitter(self.app, self.settings)

    def submit(
        self,
        calls: Sequence[ToolCall],
        *,
        workspace: str | None = None,
        session_id: str | None = None,
        turn_id: str | None = None,
        adapter: Adapter | None = None,
    ) -> Turn:
        """Start running ``calls`` (model order) and return the turn's handle at once.

        ``workspace`` is the directory the file tools and commands work in (as the workers see
        it). Raises :class:`BatchRejected` (nothing runs) if two calls share an id or a call has
        none, :class:`BrokerUnavailable` if Redis does not answer.
        """
        _check_ids(calls)
        turn_id = turn_id or uuid.uuid4().hex
        failures: list[ToolResult] = []
        runnable: dict[str, Runnable] = {}
        items: list[PlanItem] = []
        for call in calls:
            spec = self.registry.get(call.name)
            if spec is None:
                failures.append(unknown_tool(call, self.registry.names()))
                continue
            arguments = parse_arguments(call)
            if isinstance(arguments, ToolResult):
                failures.append(arguments)
                continue
            problem = check_arguments(spec, call.id, arguments)
            if problem is not None:
                failures.append(problem)
                continue
            runnable[call.id] = Runnable(spec, arguments)
            items.append(PlanItem(call.id, spec.access, resolve(spec.resources, arguments)))
        plan = make_plan(items)
        self.ledger.open_turn(turn_id, {c.id: c.name for c in calls})
        for failure in failures:
            self.ledger.record_result(turn_id, failure)
        turn = Turn(
            turn_id=turn_id,
            calls=calls,
            plan=plan,
            runnable=runnable,
            ledger=self.ledger,
            submitter=self.submitter,
            settings=self.settings,
            workspace=workspace,
            session_id=session_id,
            adapter=adapter,
        )
        try:
            return turn.start()
        except BaseException:
            self.ledger.cancel(turn_id, "submission failed")
            raise

    def submit_response(self, payload: Any, *, format: str | None = None, **options: Any) -> Turn:
        """Parse a provider response (``format`` or detected from its shape) and submit its calls.
        ``turn.messages()`` then gives the tool-result messages in the same provider's shape."""
        adapter = get_adapter(format) if format else detect(payload)
        return self.submit(adapter.parse(payload), adapter=adapter, **options)

    def run(self, calls: Sequence[ToolCall], *, timeout_s: float | None = None, **options: Any) -> list[ToolResult]:
        """Submit and wait: every call's result, in model order."""
        return self.submit(calls, **options).results(timeout_s)

    def cancel(self, turn_id: str, reason: str = "cancelled by caller") -> int:
        """Cancel a turn by id, from any process. Returns how many calls will never start.
        Raises :class:`~toolfleet.errors.TurnNotFound` for an unknown turn."""
        return self.ledger.cancel(turn_id, reason)

    def close(self) -> None:
        self.app.close()
        self.ledger.redis.close()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_ids(calls: Sequence[ToolCall]) -> None:
    missing = [c.index for c in calls if not c.id]
    if missing:
        raise BatchRejected(
            f"call(s) at position {missing} have no call id, so their results could not be paired; nothing ran",
            reason="missing_call_id",
        )
    counts = Counter(c.id for c in calls)
    dupes = tuple(cid for cid, n in counts.items() if n > 1)
    if dupes:
        raise BatchRejected(
            f"duplicate call id(s) {', '.join(dupes)}: results could not be paired by id, so the batch "
            "was refused and nothing ran",
            reason="duplicate_call_id",
            call_ids=dupes,
        )
