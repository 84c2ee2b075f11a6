"""Live sessions: the rescue of calls stranded in the queue of a holder that died.

A session's calls go to its holder's own queue (``<namespace>.w.<worker>``, :mod:`.affinity`). When
that worker is gone (its ``live_worker`` key lapsed), nobody consumes the queue any more: another
live worker's :class:`~.affinity.SessionHost` drains it in its housekeeping (every
``heartbeat_s / 2``, at most 1 s) and answers each call ``SESSION_LOST`` in the ledger (only if no
worker began it), dropping the session's holder key so the call after it starts a new shell. A
message that is not a genuine call (unsigned, tampered, expired: :mod:`.authenticity`) settles
nothing: it is dropped and reported.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from ..models import ErrorCode, ToolResult
from .affinity import log, worker_queue
from .authenticity import message_problem, report_drop
from .holder_keys import _delete_if, lost_reply

if TYPE_CHECKING:
    from .affinity import SessionHost

PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")  # kombu's Redis priority queues


def rescue_lost_calls(host: SessionHost) -> None:
    """Answer ``SESSION_LOST`` to calls waiting in the queue of a holder that died."""
    for name in host.redis.smembers(host.keys.live_workers):
        worker = _s(name)
        if worker == host.worker or host.redis.exists(host.keys.live_worker(worker)):
            continue
        q = worker_queue(host.keys, worker)
        for suffix in PRIORITY_SUFFIXES:
            while (raw := host.redis.lpop(q + suffix)) is not None:
                _answer_lost(host, raw, worker)
        host.redis.srem(host.keys.live_workers, worker)


def _answer_lost(host: SessionHost, raw: bytes, worker: str) -> None:
    try:
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        from .app import TASK_NAME  # app.py imports affinity.py, which imports this module

        envelope = json.loads(body)[1]["envelope"]
        headers = message.get("headers") or {}
        routing = ((message.get("properties") or {}).get("delivery_info") or {}).get("routing_key")
        problem = message_problem(host.runtime, task=headers.get("task"), task_id=headers.get("id"),
                                  queue=routing, timelimit=headers.get("timelimit"),
                                  kwargs={"envelope": envelope})
        if problem or headers.get("task") != TASK_NAME:  # a forged message settles nothing
            report_drop(host.runtime, problem or "malformed", task_id=headers.get("id"),
                        kwargs={"envelope": envelope}, where=f"in the queue of the lost worker {worker}")
            return
        reply = lost_reply(worker)
        result = ToolResult.failure(envelope["call_id"], envelope["name"], ErrorCode.SESSION_LOST,
                                    reply["message"], reply["hint"])
        host.runtime.ledger.record_result(envelope["turn_id"], result, unless_started=True)
        if envelope.get("session_id"):  # the call after this one starts a new shell
            _delete_if(host.redis, host.keys.live_holder(envelope["session_id"]), worker)
    except Exception as exc:  # noqa: BLE001 - not a call message: dropped, said
        log.warning("live sessions: dropped a message of %s's queue that is not a call (%s)", worker, exc)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")
