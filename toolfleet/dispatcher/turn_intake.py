"""The intake of a :class:`~toolfleet.dispatcher.turn.Turn`: taking calls, in model order, until
:meth:`~TurnIntake.close`.

Each call taken is validated (:func:`~.wire.checked_call`; one with a bad, missing or repeated id
refuses the whole batch: :func:`check_ids`), registered in the ledger (``add_calls``: refused when
the turn was cancelled), screened by the guard when there is one (refused, held for a person, or
let through; the audit's ``planned`` entry), planned against the calls taken before it, and handed
to the driver to send when it waits for nothing unfinished. A call whose intake fails part-way gets
a local ``TOOL_UNAVAILABLE`` result, so the turn still ends with one result per call.

A mixin, as :mod:`.turn_approvals` and :mod:`.turn_driver` are: the state it writes (``_calls``,
``_names``, ``_runnable``, ``_planner``, ``_held``, ``_scheduled``, ...) is the turn's own, made in
``Turn.__init__``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import redis

from ..errors import BatchRejected, BrokerUnavailable, ToolfleetError
from ..ledger import not_executed
from ..models import ToolCall, ToolResult
from ..tools.resources import resolve
from ..tools.spec import ToolSpec
from ..tools.state import session_resources
from .plan import PlanItem
from .turn_driver import _WAKE
from .wire import call_id_problem, checked_call, clean_call, tool_calls

if TYPE_CHECKING:
    from .turn import Turn


@dataclass(frozen=True)
class Runnable:
    spec: ToolSpec
    arguments: dict[str, Any]
    shown: Any = None  # the arguments redacted (Guard.record), for the message's kwargsrepr


class TurnIntake:
    """Calls taken by a turn: :meth:`add_call`, :meth:`add_calls`, :meth:`close`."""

    def add_call(self, call: ToolCall) -> None:
        """Take one more call; see :meth:`add_calls`."""
        self.add_calls([call])

    def add_calls(
        self,
        calls: Sequence[ToolCall | Mapping[str, Any]],
        *,
        failed: Mapping[str, ToolResult] | None = None,
        raise_errors: bool = False,
    ) -> None:
        """Take more calls, which come after every call taken so far in model order.

        Each is validated (an invalid one gets its error result at once), planned against the
        earlier calls, registered in the ledger and, when it waits for nothing unfinished,
        submitted before this returns. On a cancelled turn the calls get ``NOT_EXECUTED``, as soon
        as the turn is cancelled here (before Redis has the cancel) and whatever ``failed`` says.
        ``failed`` maps call ids to error results decided by the caller (a stream cut short):
        those are recorded instead of checking the call, under the call's own id and name.

        Raises :class:`BatchRejected` (none of ``calls`` taken) if a call has no id or an id
        already used in this turn; :class:`ToolfleetError` if the turn is closed;
        :class:`BrokerUnavailable` if Redis does not answer (and, with ``raise_errors``, if the
        broker refuses a call; otherwise that call gets a ``TOOL_UNAVAILABLE`` result).
        """
        calls = [clean_call(call) for call in tool_calls(calls)]
        failed = failed or {}
        check_ids(calls)
        checked = [_answer_of(call, failed.get(call.id)) or checked_call(self._registry, call) for call in calls]
        with self._intake:
            with self._lock:
                if self._closed:
                    raise ToolfleetError(f"turn {self.turn_id} is closed; it takes no more calls")
                check_ids(calls, taken=self._names)
                for call in calls:
                    self._calls.append(call)
                    self._names[call.id] = call.name
            try:
                self._take(calls, checked, raise_errors)
            except BaseException as exc:
                self._intake_failed(calls, exc)
                if isinstance(exc, redis.RedisError):
                    raise BrokerUnavailable(self._settings.redis_url, str(exc)) from exc
                raise

    def _intake_failed(self, calls: Sequence[ToolCall], exc: BaseException) -> None:
        """Taking ``calls`` failed part-way: each of them not sent and without a result gets a
        final one here (a local ``TOOL_UNAVAILABLE``: Redis may be what failed; ``NOT_EXECUTED``
        once the turn is cancelled), so the turn still ends with one result per call instead of
        waiting for calls that will never run."""
        with self._lock:
            lost = [c for c in calls if c.id not in self._results and c.id not in self._submitted]
        self._settle_locally([self._never_sent(
            call.id, call.name,
            f"the call could not be taken ({type(exc).__name__}: {exc}); it was not sent and did not run",
            "retry when the broker answers") for call in lost])

    def _take(self, calls: list[ToolCall], checked: list[Any], raise_errors: bool) -> None:
        """Register, screen, plan and submit ``calls`` (see :meth:`add_calls`). On a turn cancelled
        here, none of that, and no wait for Redis (the asyncio API's abort must not block): they are
        never sent, and the driver registers them in the ledger as ``NOT_EXECUTED``
        (:meth:`_record_unrecorded`), whence their results come as every result does."""
        if self._error is not None:  # the driver gave up (Redis gone): nothing more is sent or registered
            self._registered = {}
            self._settle_locally([self._never_sent(
                c.id, c.name, f"the turn's driver had ended ({self._error}); the call was not sent and did not run",
                "retry when Redis is back") for c in calls])
            return
        if self.cancelled:
            self._registered = {}
            with self._lock:
                self._unrecorded.update({c.id: c.name for c in calls})
            return
        try:
            names = {c.id: c.name for c in calls}
            if names and names == self._registered:
                refused: set[str] = set()
            else:
                refused = self._ledger.add_calls(self.turn_id, names)
            self._registered = {}
            screened = None
            if self._guard is not None:
                screened = self._guard.screen(self.turn_id, calls, checked, workspace=self._workspace,
                                              session_id=self._session_id)
                checked = [screened.refused.get(c.id, outcome) for c, outcome in zip(calls, checked, strict=True)]
            to_send, failures, planned = [], [], {}
            # cancelled here, maybe not yet in Redis (cancel_soon, a cancel Redis did not take): its
            cancelled = self.cancelled  # calls get the cancel's answer too
            for call, outcome in zip(calls, checked, strict=True):
                if call.id in refused:
                    continue  # cancelled before it was taken: NOT_EXECUTED is recorded
                if isinstance(outcome, ToolResult):
                    failures.append(not_executed(call.id, call.name) if cancelled else outcome)
                    continue
                spec, arguments = outcome
                item = PlanItem(call.id, spec.access_for(arguments),  # session state: tools/state.py
                                resolve(spec.resources, arguments, self._workspace)
                                | session_resources(spec, self._session_id))
                if item.access == "write":
                    self._sender.lock.note_writes(item.resources)
                with self._lock:
                    self._runnable[call.id] = Runnable(spec, arguments)
                    planned[call.id] = self._planner.add(item)
                    if screened is not None and call.id in screened.held:
                        self._held[call.id] = screened.held[call.id]
                    elif self._cancelled_at is None and self._ready(call.id):
                        self._scheduled.add(call.id)
                        to_send.append(call.id)
            if screened is not None:  # the audit's `planned` comes before any result or submission
                shown = self._guard.record(self.turn_id, calls, checked, screened, planned,
                                           workspace=self._workspace, session_id=self._session_id)
                with self._lock:  # redacted once: the kwargsrepr of each message reuses it
                    self._runnable.update({c: replace(self._runnable[c], shown=a) for c, a in shown.items()
                                           if c in self._runnable})
            for failure in failures:
                self._ledger.record_result(self.turn_id, failure)
            self._sender.lock.take()
        except redis.RedisError as exc:
            raise BrokerUnavailable(self._settings.redis_url, str(exc)) from exc
        self._submit_ranked(to_send, raise_errors=raise_errors)

    def close(self) -> Turn:
        """No more calls: the turn is done once every call taken has its result. Idempotent."""
        with self._intake, self._lock:
            self._closed = True
            if len(self._results) == len(self._calls):
                self._done.set()
            self._changed.notify_all()
        self._completed.put(_WAKE)
        return self


def _answer_of(call: ToolCall, result: ToolResult | None) -> ToolResult | None:
    """``result`` as ``call``'s answer: paired by the call's id and name, whatever the caller put
    in it (a result under another id would leave this call without one and the turn waiting)."""
    if result is None or (result.call_id, result.name) == (call.id, call.name):
        return result
    return result.model_copy(update={"call_id": call.id, "name": call.name})


def check_ids(calls: Iterable[ToolCall], taken: Iterable[str] = ()) -> None:
    """Raise :class:`BatchRejected` if a call has no id, or an id repeats (among ``calls`` or with
    ``taken``): results could not be paired with their calls by id."""
    calls = list(calls)
    bad = [(c.id, problem) for c in calls if c.id and (problem := call_id_problem(c.id))]
    if bad:
        raise BatchRejected(
            f"{bad[0][1]}: results could not be paired with it, so the batch was refused and nothing ran",
            reason="bad_call_id",
            call_ids=tuple(cid.encode("utf-8", "backslashreplace").decode() for cid, _ in bad),
        )
    missing = [c.index for c in calls if not c.id]
    if missing:
        raise BatchRejected(
            f"call(s) at position {missing} have no call id, so their results could not be paired; nothing ran",
            reason="missing_call_id",
        )
    counts = Counter(c.id for c in calls)
    taken = set(taken)
    dupes = tuple(cid for cid, n in counts.items() if n > 1 or cid in taken)
    if dupes:
        raise BatchRejected(
            f"duplicate call id(s) {', '.join(dupes)}: results could not be paired by id, so the batch "
            "was refused and nothing ran",
            reason="duplicate_call_id",
            call_ids=dupes,
        )
