"""The audit trail: an append-only, redacted event stream per turn in Redis.

Key ``<ns>:turn:<turn_id>:audit`` (a Redis stream, expiring with the turn's ledger). Each entry has
``type``, ``call_id`` (empty for turn events) and ``data`` (JSON, with ``at``: unix seconds of the
writer). The stream id's millisecond part is Redis's clock, one clock for every machine, which
``toolfleet trace`` uses for its time axis.

A call's ``started`` and ``finished`` entries are not stored twice: they are the ledger's own
``started`` and ``result`` events in the turn's event stream ``<ns>:turn:<turn_id>:events``
(:mod:`toolfleet.ledger`), which :meth:`AuditLog.read` turns into audit entries (redacted as below, a
result's content reduced to its size) and merges with the audit stream by stream id. So a worker's
claim and result each cost one stream append, not two (docs/scaling.md). Within one millisecond,
the merge puts the audit stream's entries that come before a run (``planned``, ``pending``,
``approved``, ``denied``, ``submitted``) first and those that come after one (``late``,
``cancelled``) last. Read the trail with :meth:`AuditLog.read` (or ``toolfleet trace``); the audit
stream alone lacks the runs.

Types and who writes them:

==============  ============  ================================================================
type            writer        data
==============  ============  ================================================================
``planned``     dispatcher    ``session_id``, ``workspace``, ``calls`` (index, id, tool, arguments,
                              verdict), ``deps`` (call -> calls it waits for)
``pending``     dispatcher    ``tool``, ``reason``: the call waits for a person
``submitted``   dispatcher    ``tool``, ``queue``, ``task_id``: sent to the workers (stored as
                              one entry per group sent, ``calls`` [{``call_id``, ...}], so a
                              group costs one append; :meth:`AuditLog.read` gives one event per call)
``started``     worker        ``worker`` (a second ``started`` means a redelivery; from the event
                              stream)
``finished``    any side      (from the event stream's ``result``) ``tool``, ``status``, ``code``,
                              ``message``, ``worker``, ``queued_ms``,
                              ``run_ms``, ``attempts``, ``content_chars``
``approved``    approver      ``by``, ``remembered`` (a rule, if one was kept)
``denied``      approver or   ``by`` (``policy`` when the policy refused it), ``reason``, ``rule``
                policy
``cancelled``   any process   ``reason``, ``not_executed`` (call ids that never started)
``late``        worker        as ``finished``: the outcome of a stale execution (fenced: a newer
                              one held the call, or the caller already had its answer); a note
                              for the operator, never the call's result
==============  ============  ================================================================

Everything is passed through :func:`toolfleet.tools.redact.redact_value` before it is written
(``started`` and ``finished`` when they are read),
and callers mask a tool's declared sensitive parameters first
(:func:`~toolfleet.tools.redact.redact_arguments`).
A result's content is never written to the audit stream nor given by :meth:`AuditLog.read`, only its
size: the model's text may hold anything.

Writing is best effort: a failed append is logged and never fails the call it describes.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis

from .keys import Keys
from .models import ToolResult
from .tools.redact import redact_text, redact_value

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditEvent:
    """One entry of a turn's audit trail."""

    stream_id: str
    type: str
    call_id: str
    data: dict[str, Any]

    @property
    def at_ms(self) -> int:
        """Redis's clock when the entry was written (milliseconds since the epoch)."""
        return int(self.stream_id.split("-", 1)[0])


class AuditLog:
    """Appends to and reads the audit trails of one namespace."""

    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s

    @staticmethod
    def data(**data: Any) -> str:
        """The ``data`` field of an event: ``data`` redacted, stamped with ``at`` (unix seconds), as
        JSON."""
        return AuditLog.plain(**redact_value(data))

    @staticmethod
    def plain(**data: Any) -> str:
        """As :meth:`data`, without redaction: only for values toolfleet itself made (tool, queue
        and worker names, ids, codes, timings), never for what a model or a tool wrote."""
        data["at"] = time.time()
        return json.dumps(data, default=str)

    def append(self, turn_id: str, type: str, call_id: str = "", **data: Any) -> None:
        """Append one event; ``data`` is redacted, then stamped with ``at`` (unix seconds)."""
        self.append_many(turn_id, [(type, call_id, data)])

    def append_many(self, turn_id: str, events: list[tuple[str, str, dict[str, Any]]], *, redact: bool = True) -> None:
        """Append ``(type, call_id, data)`` events in order, in one round trip. ``redact=False``
        only for data toolfleet itself made (see :meth:`plain`)."""
        if not events:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            self._add(pipe, turn_id, events, redact)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("audit: could not append %d event(s) of turn %s (%s)", len(events), turn_id, exc)

    def _add(self, pipe: Any, turn_id: str, events: list[tuple[str, str, dict[str, Any]]], redact: bool) -> int:
        """Queue the commands that append ``events`` on ``pipe``; returns how many (their replies)."""
        key = self.keys.turn_audit(turn_id)
        encode = self.data if redact else self.plain
        for type, call_id, data in events:
            pipe.xadd(key, {"type": type, "call_id": call_id, "data": encode(**data)})
        pipe.expire(key, self.ttl_s)
        return len(events) + 1

    def append_submitted(self, turn_id: str, calls: list[tuple[str, dict[str, Any]]], pipe: Any = None) -> int:
        """Append one ``submitted`` entry for the ``(call_id, data)`` of a group sent together
        (``data`` made by toolfleet: not redacted), through :meth:`append_many`; with ``pipe`` (a
        pipeline on this log's Redis), only queue its commands there, for the caller to execute.
        Returns how many commands were queued on ``pipe`` (0 without one)."""
        if not calls:
            return 0
        events = [("submitted", "", {"calls": [{"call_id": call_id, **fields} for call_id, fields in calls]})]
        if pipe is not None:
            return self._add(pipe, turn_id, events, redact=False)
        self.append_many(turn_id, events, redact=False)
        return 0

    @classmethod
    def finished_data(cls, result: ToolResult) -> str:
        """The ``data`` of a ``finished`` (or ``late``) event of ``result``, as JSON."""
        return cls.plain(**finished_fields(result))

    def read(self, turn_id: str) -> list[AuditEvent]:
        """Every event of the turn, oldest first (empty for an unknown or expired turn): the audit
        stream's entries and the ``started`` / ``finished`` entries read from the event stream, in
        one round trip, merged by stream id (module docstring)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xrange(self.keys.turn_audit(turn_id))
        pipe.xrange(self.keys.turn_events(turn_id))
        audit_entries, ledger_entries = pipe.execute()
        audit: list[tuple[tuple[int, int], AuditEvent]] = []
        for stream_id, fields in audit_entries:
            try:
                event = AuditEvent(stream_id=_s(stream_id), type=_s(fields.get(b"type", b"")),
                                   call_id=_s(fields.get(b"call_id", b"")),
                                   data=json.loads(_s(fields.get(b"data", b"{}")) or "{}"))
            except ValueError as exc:  # not toolfleet's writing
                log.warning("audit: skipped a malformed entry %s of turn %s (%s)", _s(stream_id), turn_id, exc)
                continue
            rank = _AFTER_RUNS if event.type in ("late", "cancelled") else _BEFORE_RUNS
            audit += [(_order(each.stream_id, rank), each) for each in _expanded(event)]
        runs = [(_order(event.stream_id, _RUNS), event) for event in
                (_from_ledger(_s(stream_id), fields) for stream_id, fields in ledger_entries) if event is not None]
        return _merged(audit, runs)


_BEFORE_RUNS, _RUNS, _AFTER_RUNS = 0, 1, 2


def _order(stream_id: str, rank: int) -> tuple[int, int]:
    """Merge key of an entry: Redis's millisecond, then its rank within that millisecond."""
    ms, _, _seq = stream_id.partition("-")
    return int(ms), rank


def _merged(audit: list[tuple[tuple[int, int], AuditEvent]],
            runs: list[tuple[tuple[int, int], AuditEvent]]) -> list[AuditEvent]:
    """The two streams' entries as one list: each stream keeps its own order, and at each step the
    entry with the lower (millisecond, rank) goes first (the audit stream's on a tie)."""
    out: list[AuditEvent] = []
    i = j = 0
    while i < len(audit) or j < len(runs):
        if j >= len(runs) or (i < len(audit) and audit[i][0] <= runs[j][0]):
            out.append(audit[i][1])
            i += 1
        else:
            out.append(runs[j][1])
            j += 1
    return out


def _expanded(event: AuditEvent) -> list[AuditEvent]:
    """A group's ``submitted`` entry (:meth:`AuditLog.append_submitted`) as one event per call; any
    other entry as itself."""
    group = event.data.get("calls") if event.type == "submitted" and not event.call_id else None
    if not isinstance(group, list):
        return [event]
    return [AuditEvent(event.stream_id, "submitted", str(entry.get("call_id", "")),
                       {**{k: v for k, v in entry.items() if k != "call_id"}, "at": event.data.get("at")})
            for entry in group if isinstance(entry, dict)]


def _from_ledger(stream_id: str, fields: dict[bytes, bytes]) -> AuditEvent | None:
    """The audit entry of a ledger event: ``started`` (the worker, and when it began by its clock)
    and ``result`` (as ``finished``: :func:`finished_fields`); None for the ledger's other events.
    A malformed event (not toolfleet's) is skipped."""
    kind, call_id = fields.get(b"type", b""), _s(fields.get(b"call_id", b""))
    try:
        if kind == b"started":
            started = json.loads(fields.get(b"data", b"{}"))
            data = {"worker": started.get("worker"), "at": started.get("started_at")}  # made by toolfleet
            return AuditEvent(stream_id, "started", call_id, data)
        if kind == b"result":
            result = ToolResult.model_validate_json(fields.get(b"data", b"{}"))
            at = int(stream_id.split("-")[0]) / 1000  # Redis's clock when it was recorded
            return AuditEvent(stream_id, "finished", call_id, {**finished_fields(result), "at": at})
    except (ValueError, AttributeError) as exc:
        log.warning("audit: skipped a malformed %s event %s (%s)", _s(kind), stream_id, exc)
    return None


def finished_fields(result: ToolResult) -> dict[str, Any]:
    """What the audit trail says of ``result``: its tool, status, error code and message (redacted),
    who ran it, its times and attempts, and its content's size (never the content)."""
    error = result.error
    return {
        "tool": redact_text(result.name),  # a model may name a tool that does not exist
        "status": result.status,
        "code": error.code.value if error else None,
        "message": redact_text(error.message) if error else None,  # written by a tool
        "worker": result.worker,
        "queued_ms": result.queued_ms,
        "run_ms": result.run_ms,
        "attempts": result.attempts,
        "content_chars": len(result.content),
    }


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
