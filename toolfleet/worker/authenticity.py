"""The worker's signature check of a call message, before anything else (issue 18; docs/signing.md).

Run in the worker's main process when Celery is about to hand the message to a pool process (the
``revoked`` hook of :class:`toolfleet.worker.app`'s request, which ``execute_using_pool`` calls),
again at the top of the task body, and by any code that acts on a message it did not run (the live
sessions' rescue of a dead holder's queue). A message that does not verify is dropped: acknowledged
and not requeued (a ``task-rejected`` event: Flower shows REJECTED), nothing written to the ledger
or the journal (so a forged message cannot settle, block or release a real call either), no handler
run; the drop is logged (task id, claimed tool / turn / call ids, key id, reason, never argument
values) and counted in the Redis hash ``<ns>:security:dropped`` (field per reason, and ``total``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..signing import MALFORMED, verify
from .values import safe_text

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)
NO_KEY = "no_key"  # a worker without a key that was not told to run unsigned: drops everything
SHOWN_CHARS = 80


_keys_of: tuple[object, Any] | None = None  # (settings, its fleet keys): derived once per settings object


def _fleet_keys(settings: Any) -> Any:
    """``settings.fleet_keys``, derived (SHA-256 key ids) once per settings object instead of per message."""
    global _keys_of
    cached = _keys_of
    if cached is None or cached[0] is not settings:
        cached = _keys_of = (settings, settings.fleet_keys)
    return cached[1]


def message_problem(runtime: Runtime, *, task: str, task_id: Any, queue: Any, timelimit: Any,
                    kwargs: Any) -> str | None:
    """``None`` if the call message may run here; else why not (a :data:`toolfleet.signing.REASONS`
    value or :data:`NO_KEY`). ``timelimit`` is Celery's header ``(hard, soft)``; ``queue`` the
    routing key it was delivered from. With ``insecure_no_signing`` every message may run."""
    settings = runtime.settings
    keys = _fleet_keys(settings)
    if keys is None:
        return None if settings.insecure_no_signing else NO_KEY
    hard, soft = (list(timelimit) + [None, None])[:2] if isinstance(timelimit, (list, tuple)) else (None, None)
    envelope = kwargs.get("envelope") if isinstance(kwargs, dict) else None
    try:
        return verify(keys, task=task, task_id=task_id, queue=queue, limits=[soft, hard], envelope=envelope,
                      skew_s=settings.clock_skew_margin_s)
    except Exception as exc:  # noqa: BLE001 - whatever a forged message holds, it is dropped, never a crash
        log.error("the signature check failed on a message (%s); dropped as malformed", type(exc).__name__)
        return MALFORMED


def _shown(value: Any) -> str:
    text = safe_text(value if isinstance(value, str) else repr(value))
    return repr(text[:SHOWN_CHARS] + ("..." if len(text) > SHOWN_CHARS else ""))


def report_drop(runtime: Runtime, reason: str, *, task_id: Any, kwargs: Any, where: str) -> None:
    """Log and count one dropped message (best effort: a Redis failure is logged, never raised)."""
    envelope = kwargs.get("envelope") if isinstance(kwargs, dict) else None
    envelope = envelope if isinstance(envelope, dict) else {}
    log.warning(
        "dropped a call message that failed the fleet signature check (%s) %s: task %s, tool %s, turn %s, "
        "call %s, key id %s; it was not run and nothing was recorded",
        reason, where, _shown(task_id), _shown(envelope.get("name")), _shown(envelope.get("turn_id")),
        _shown(envelope.get("call_id")), _shown(envelope.get("key_id")))
    try:
        client = runtime.ledger.redis
        key = runtime.keys.security_dropped
        with client.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, reason, 1)
            pipe.hincrby(key, "total", 1)
            pipe.execute()
    except Exception as exc:  # noqa: BLE001 - the log line above is the record then
        log.warning("could not count the dropped message in Redis (%s)", type(exc).__name__)
