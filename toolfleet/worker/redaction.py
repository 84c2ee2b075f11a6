"""What a worker lets Celery, Flower and the logs see of a call: ids, codes and sizes, never content.

docs/design.md: "No tool output, secret or argument leaves the ledger unredacted: Celery messages,
results, logs and Flower carry ids, codes and sizes." A call's result lives in the turn ledger,
which is what the dispatcher reads; Celery only ever sees:

- **the task's return value** (:func:`task_summary`): ``{"status", "code", "content_chars", "data"}``.
  Celery puts it in the worker's ``succeeded in … : <return value>`` log line and in the
  ``task-succeeded`` event Flower shows as the task's ``result`` (even with ``ignore_result``); an
  error result raises :class:`~.task_states.CallFailed` whose message is the same summary
  (``task-failed``: Flower's ``exception``);
- **an exception the task body raises** (:func:`redacted_failure`): re-raised as
  :class:`CallTaskError` whose message is the original traceback, redacted, so Flower's
  ``exception``/``traceback`` fields and Celery's error log line carry no secret;
- **log lines** (:func:`install_log_redaction`, installed when a worker starts): every record
  created in the worker's processes, Celery's and kombu's included, has its message and traceback
  text redacted (:func:`toolfleet.tools.redact.redact_text`) before any handler sees it, with the
  secret argument values of the call running in the process masked too (:func:`call_secrets`: a
  tool's own ``log.warning("trying %s", password)``), and the body of a message Celery cannot run
  is logged as its size only;
- **error messages** (:func:`mask_known_secrets`): a tool that quotes back an argument the model
  passed under a secret name (``password``, ``token``, a declared ``sensitive`` parameter) has that
  value masked in ``error.message``/``error.hint`` before the result is recorded (shapes are
  masked by :meth:`toolfleet.models.ToolResult.failure` already).

The task's arguments as Flower shows them (``kwargsrepr``) are masked by the dispatcher when it
sends (:mod:`toolfleet.dispatcher.submit`). The content of an ``ok`` result, and the output a
failed call printed, reach the model unredacted through the ledger: the model asked for them.
"""

from __future__ import annotations

import itertools
import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.exceptions import TaskPredicate
from celery.signals import worker_init, worker_process_init
from pydantic import ValidationError

from .. import forksafe
from ..models import ToolResult
from ..tools.redact import redact_text, secret_values

_install_lock = forksafe.lock()
_installed = False
_running_lock = forksafe.lock()
_running: dict[int, frozenset[str]] = {}  # the secret argument values of each call running in this process
_running_values: tuple[str, ...] = ()  # their union, replaced whole (read without the lock)
_running_ids = itertools.count()


def task_summary(result: ToolResult) -> dict[str, Any]:
    """What the task returns to Celery for ``result``: status, error code and sizes only, e.g.
    ``{"status": "ok", "code": None, "content_chars": 120, "data": False}`` (``data``: whether the
    tool returned structured data). The content stays in the ledger."""
    return {
        "status": result.status,
        "code": result.error.code.value if result.error else None,
        "content_chars": len(result.content),
        "data": result.data is not None,
    }


class CallTaskError(Exception):
    """The task body failed outside the tool's handler (the handler's own failures are results).
    The message is the original exception's traceback, redacted."""


def redacted_failure(exc: BaseException, envelope: Any = None,
                     sensitive: tuple[str, ...] | list[str] = ()) -> BaseException:
    """What a task raises instead of ``exc``: ``exc`` itself for Celery's control exceptions
    (retry, ignore, reject), else a :class:`CallTaskError` holding ``exc``'s traceback, redacted,
    with the secret argument values of ``envelope`` (the task's kwarg, any shape; ``sensitive``:
    the tool's declared sensitive parameters) masked too. A
    pydantic ``ValidationError`` is told without its input values: it quotes them cut short, and a
    secret cut in two no longer has a recognisable shape."""
    if isinstance(exc, TaskPredicate):
        return exc
    arguments = envelope.get("arguments") if isinstance(envelope, dict) else None
    known = secret_values(arguments, sensitive) if isinstance(arguments, dict) else set()
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
                             for e in exc.errors(include_input=False, include_url=False))
        last = f"ValidationError: {exc.error_count()} validation error(s) for {exc.title}: {problems}\n"
        text = "".join(["Traceback (most recent call last):\n", *traceback.format_tb(exc.__traceback__), last])
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return CallTaskError(redact_text(text, known).rstrip())


def mask_known_secrets(result: ToolResult, arguments: Any, sensitive: tuple[str, ...] | list[str] = ()) -> ToolResult:
    """``result`` with the call's secret argument values (:func:`~toolfleet.tools.redact.secret_values`)
    masked in ``error.message`` and ``error.hint``, and in the head of ``content`` that repeats
    them. An ``ok`` result, and the output a failed call printed, are returned as they are."""
    error = result.error
    if error is None:
        return result
    known = secret_values(arguments, sensitive)
    if not known:
        return result
    message, hint = redact_text(error.message, known), redact_text(error.hint, known)
    if message == error.message and hint == error.hint:
        return result
    old_head = f"Error [{error.code.value}]: {error.message}" + (f"\nHint: {error.hint}" if error.hint else "")
    new_head = f"Error [{error.code.value}]: {message}" + (f"\nHint: {hint}" if hint else "")
    content = result.content
    content = new_head + content[len(old_head):] if content.startswith(old_head) else redact_text(content, known)
    return result.model_copy(update={"content": content,
                                     "error": error.model_copy(update={"message": message, "hint": hint})})


@contextmanager
def call_secrets(arguments: Any, sensitive: tuple[str, ...] | list[str] = ()) -> Iterator[frozenset[str]]:
    """While the block runs, every log record this process makes has the call's secret argument
    values (:func:`~toolfleet.tools.redact.secret_values`: declared ``sensitive`` parameters,
    secret-named keys at any depth) masked, as its error message has: a tool's own
    ``log.warning("sign_in: %s / %s", user, password)`` shows ``***``. Cleared when the block
    ends, however it ends (a result, an exception, the soft time limit).

    Process-wide, not a context variable: a prefork pool process runs one call at a time, and the
    threads a handler starts (which a context variable does not reach) log through the same
    factory. A thread that outlives its call and logs the value afterwards is not covered."""
    known = frozenset(secret_values(arguments, sensitive))
    if not known:
        yield known
        return
    global _running_values
    ident = next(_running_ids)
    with _running_lock:
        _running[ident] = known
        _running_values = tuple(set().union(*_running.values()))
    try:
        yield known
    finally:
        with _running_lock:
            _running.pop(ident, None)
            _running_values = tuple(set().union(*_running.values()))


def running_call_secrets() -> tuple[str, ...]:
    """The secret argument values of the calls running in this process (:func:`call_secrets`)."""
    return _running_values


def install_log_redaction() -> None:
    """Redact every log record created in this process from now on (idempotent): its message is
    formatted and redacted at once (``args`` cleared), its traceback and stack text redacted. A
    record the redaction fails on keeps only a note saying so. Celery's reports of a message it
    cannot run show the body's size, not the body."""
    global _installed
    with _install_lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _hide_message_bodies()
        _installed = True


def _hide_message_bodies() -> None:
    """Celery logs a message it cannot run (unknown task, undecodable, invalid) with its body, the
    call's arguments whole: show only the body's size."""
    from celery.worker.consumer import consumer

    def dump_body(message: Any, body: Any) -> str:
        raw = getattr(message, "body", None) or b""
        return f"<message body of {len(raw)} bytes: not shown>"

    consumer.dump_body = dump_body


def _redact_record(record: logging.LogRecord) -> None:
    known = _running_values  # the running call's secret argument values (call_secrets)
    try:
        record.msg = redact_text(record.getMessage(), known)
    except Exception:  # noqa: BLE001 - a bad format string: keep neither its text nor its arguments
        record.msg = f"<log line hidden: it could not be formatted ({record.name})>"
    record.args = None
    try:
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = redact_text("".join(traceback.format_exception(*record.exc_info)),
                                          known).rstrip("\n")
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, known)
    except Exception:  # noqa: BLE001
        record.exc_text = "<traceback hidden: it could not be redacted>"
        record.stack_info = None


@worker_init.connect(weak=False, dispatch_uid="toolfleet.worker.redaction")
def _on_worker_init(**_: Any) -> None:
    install_log_redaction()


@worker_process_init.connect(weak=False, dispatch_uid="toolfleet.worker.redaction.process")
def _on_worker_process_init(**_: Any) -> None:
    install_log_redaction()  # inherited through fork already; a spawned pool process needs it too
