"""The audit trail: an append-only, redacted event stream per turn in Redis.

Key ``<ns>:turn:<turn_id>:audit`` (a Redis stream, expiring with the turn's ledger). Each entry has
``type``, ``call_id`` (empty for turn events) and ``data`` (JSON, with ``at``: unix seconds of the
writer). The stream id's millisecond part is Redis's clock, one clock for every machine, which
``toolfleet trace`` uses for its time axis.

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
``started``     worker        ``worker`` (a second ``started`` means a redelivery)
``finished``    any side      ``tool``, ``status``, ``code``, ``message``, ``worker``, ``queued_ms``,
                              ``run_ms``, ``attempts``, ``content_chars``
``approved``    approver      ``by``, ``remembered`` (a rule, if one was kept)
``denied``      approver or   ``by`` (``policy`` when the policy refused it), ``reason``, ``rule``
                policy
``cancelled``   any process   ``reason``, ``not_executed`` (call ids that never started)
``late``        worker        as ``finished``: the outcome of a stale execution (fenced: a newer
                              one held the call, or the caller already had its answer); a note
                              for the operator, never the call's result
==============  ============  ================================================================

Everything is passed through :func:`toolfleet.tools.redact.redact_value` before it is written,
and callers mask a tool's declared sensitive parameters first
(:func:`~toolfleet.tools.redact.redact_arguments`).
A result's content is never written here, only its size: the model's text may hold anything.

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
        JSON. (The ledger's scripts append ``started`` and ``finished`` with it atomically.)"""
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
        key = self.keys.turn_audit(turn_id)
        encode = self.data if redact else self.plain
        try:
            pipe = self.redis.pipeline(transaction=False)
            for type, call_id, data in events:
                pipe.xadd(key, {"type": type, "call_id": call_id, "data": encode(**data)})
            pipe.expire(key, self.ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("audit: could not append %d event(s) of turn %s (%s)", len(events), turn_id, exc)

    def append_submitted(self, turn_id: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
        """Append one ``submitted`` entry for the ``(call_id, data)`` of a group sent together
        (``data`` made by toolfleet: not redacted), through :meth:`append_many`."""
        if calls:
            group = [{"call_id": call_id, **fields} for call_id, fields in calls]
            self.append_many(turn_id, [("submitted", "", {"calls": group})], redact=False)

    @classmethod
    def finished_data(cls, result: ToolResult) -> str:
        """The ``data`` of the ``finished`` event of ``result``."""
        error = result.error
        return cls.plain(
            tool=redact_text(result.name),  # a model may name a tool that does not exist
            status=result.status,
            code=error.code.value if error else None,
            message=redact_text(error.message) if error else None,  # written by a tool
            worker=result.worker,
            queued_ms=result.queued_ms,
            run_ms=result.run_ms,
            attempts=result.attempts,
            content_chars=len(result.content),
        )

    def read(self, turn_id: str) -> list[AuditEvent]:
        """Every event of the turn, oldest first (empty for an unknown or expired turn)."""
        events: list[AuditEvent] = []
        for stream_id, fields in self.redis.xrange(self.keys.turn_audit(turn_id)):
            event = AuditEvent(stream_id=_s(stream_id), type=_s(fields.get(b"type", b"")),
                               call_id=_s(fields.get(b"call_id", b"")),
                               data=json.loads(_s(fields.get(b"data", b"{}")) or "{}"))
            group = event.data.get("calls") if event.type == "submitted" and not event.call_id else None
            if not isinstance(group, list):
                events.append(event)
                continue
            for entry in group:  # a group's entry (append_submitted): one event per call
                if isinstance(entry, dict):
                    data = {k: v for k, v in entry.items() if k != "call_id"}
                    events.append(AuditEvent(event.stream_id, "submitted", str(entry.get("call_id", "")),
                                             {**data, "at": event.data.get("at")}))
        return events


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
