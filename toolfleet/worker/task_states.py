"""What Celery and Flower see of a call's end: a task state that tells the truth (issue 15, point 5).

The turn ledger stays the source of results (docs/guarantees.md, promise 11): the dispatcher never
reads Celery's state. But people read Flower, so a task's state there matches the call's result:

- an ``ok`` result: the task returns its summary (:func:`~.redaction.task_summary`): ``SUCCESS``;
- an error result (``TIMEOUT``, ``CANCELLED``, ``EXECUTION_ERROR``, ``WORKER_LOST``,
  ``TOOL_UNAVAILABLE``, ``INVALID_ARGUMENT``, ...), recorded in the ledger first: the task raises
  :class:`CallFailed`, whose message is the summary (code and sizes, never content). The worker
  sends ``task-failed`` without a traceback (Flower: ``FAILURE``, its Failed filter; an error
  result is no crash, so Flower shows no Python traceback for it) and, since the task declares it
  expected (``Task.throws``), logs one INFO line ``raised expected: CallFailed(...)`` without a
  traceback. Nothing is stored in the result backend (``ignore_result``); the message is
  acknowledged as usual (``task_acks_on_failure_or_timeout``);
- a call killed at its hard time limit (``TimeLimitExceeded``): the worker sends ``task-failed``
  naming ``TIMEOUT`` (Celery's own says ``ExceptionWithTraceback()``); Celery's "hard time limit
  exceeded" line says it in the log, so the pool's traceback of it is not logged;
- a call killed when its turn was cancelled (``Terminated``; its result is ``CANCELLED`` or
  ``OUTCOME_UNKNOWN``): Celery sends ``task-revoked``; the worker follows it with ``task-failed``,
  so Flower ends at ``FAILURE`` like any other error result;
- a call the dispatcher ends itself after sending it (its worker died: ``WORKER_LOST``/
  ``OUTCOME_UNKNOWN``; nobody took it: ``TOOL_UNAVAILABLE``): the dispatcher sends ``task-failed``
  (:meth:`toolfleet.dispatcher.submit.Submitter.report_failed`), else Flower would show it
  ``STARTED``/``PENDING`` for good. A call of a cancelled turn that never started is revoked
  (Flower: ``REVOKED``: it did not run);
- a message that ran nothing because another message of the call runs it (superseded by a later
  send, or a copy that arrived while the call runs) raises Celery's ``Ignore``: acknowledged, no
  final event. It has the call's task id, so a ``task-succeeded`` of it would end the call's task
  in Flower as ``SUCCESS`` (which outranks ``FAILURE`` in Celery's event state, in either order);
  the message that runs the call tells its end.

Queued calls: with ``Settings.task_sent_events`` (``task_send_sent_event``) the dispatcher
publishes ``task-sent`` per call, so Flower lists calls still waiting in a queue (``PENDING``).
Celery names the task in that event by its real name; :class:`ShadowedAMQP` names it by the
message's ``shadow`` (``tool.<name>``), as the worker's events do, so Flower never shows
``toolfleet.run_call`` whatever order the events arrive in. Its arguments are the reduced
``argsrepr``/``kwargsrepr`` the dispatcher sends (secrets masked, :mod:`toolfleet.dispatcher.submit`).
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP

from ..models import ToolResult
from .redaction import task_summary


class CallFailed(Exception):
    """The call ended with an error result, already recorded in the turn ledger; raised only so
    Celery and Flower count the task as failed. The message is the result's summary: code, sizes
    (one string argument, so it crosses the pool's pipe as itself: an exception that does not
    unpickle is logged as unexpected, with a traceback)."""

    @classmethod
    def of(cls, summary: dict[str, Any]) -> CallFailed:
        return cls(f"{summary.get('code')} (content_chars={summary.get('content_chars')}, "
                   f"data={summary.get('data')}; the result is in the turn ledger)")


def task_outcome(result: ToolResult) -> dict[str, Any]:
    """The task's return value for ``result``, or raises :class:`CallFailed` for an error result."""
    summary = task_summary(result)
    if result.status == "error":
        raise CallFailed.of(summary)
    return summary


KILLED_AT_HARD_LIMIT = "TIMEOUT: the call was killed at its hard time limit; the result is in the turn ledger"
KILLED_ON_CANCEL = "the call was killed when its turn was cancelled; the result is in the turn ledger"


class ShadowedAMQP(AMQP):
    """Celery's AMQP helper, with the ``task-sent`` event naming the task by its ``shadow``."""

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(task_id, name, *args, **kwargs)
        shadow = message.headers.get("shadow")
        if message.sent_event is not None and shadow:
            message.sent_event["name"] = shadow
        return message
