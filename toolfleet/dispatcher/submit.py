"""Sending one call to the workers as a Celery task (docs/design.md, step 4).

The arguments Flower shows (``kwargsrepr``) are redacted (:mod:`toolfleet.tools.redact`); the message
itself carries them whole, for the handler. Each send appends a ``submitted`` audit event. Every
envelope is signed with the fleet key (:mod:`toolfleet.signing`, docs/signing.md) unless the
settings say ``insecure_no_signing``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

from celery import Celery
from kombu.exceptions import BatchPublishError, OperationalError

from ..audit import AuditLog
from ..errors import BrokerUnavailable
from ..keys import Keys
from ..models import CallEnvelope
from ..settings import Settings
from ..signing import sign
from ..tools.spec import ToolSpec
from ..worker.app import TASK_NAME
from .affinity import live_queue
from .sent_events import SentEvents
from .wire import shown_arguments

KWARGSREPR_MAX_CHARS = 1000
# Celery's soft limit comes this long after the call's own deadline, so a handler that watches its
# deadline (run_command) ends cleanly first; the soft limit is the backstop for those that do not.
SOFT_LIMIT_MARGIN_S = 0.5


def priority_of(rank: int, broker_url: str) -> int:
    """The Celery message priority of a call that heads a chain of ``rank`` calls: longer chains
    are served first (:mod:`toolfleet.dispatcher.plan`). Four levels, kombu's default Redis
    priority steps (0, 3, 6, 9); Redis serves 0 first, AMQP serves 9 first."""
    urgency = min(max(rank, 1), 4) - 1  # 0 (nothing waits for it) .. 3 (heads 4 or more calls)
    if broker_url.startswith(("redis", "rediss", "sentinel")):
        return 9 - 3 * urgency
    return 3 * urgency


def hard_limit_s(settings: Settings, limit_s: float) -> float:
    """How long after its start an execution with time limit ``limit_s`` (s) may still act: the
    limit, :data:`SOFT_LIMIT_MARGIN_S` to Celery's hard limit, and ``kill_grace_s`` for the kill."""
    return limit_s + SOFT_LIMIT_MARGIN_S + settings.kill_grace_s


def message_expiry_s(settings: Settings, limit_s: float) -> float:
    """Seconds after sending at which a call's message expires (Celery ``expires``): a worker that
    receives it later, or takes it from the queue later, discards it without running it (state
    REVOKED, reason "expired"). ``max_queue_wait_s`` (after which the dispatcher has reported the
    call ``TOOL_UNAVAILABLE``) plus the call's hard limit. The expiry is an absolute time from the
    dispatcher's clock, compared with the worker's: keep the clocks in sync (NTP). The ledger's
    claim (turn ended, cancelled, lease lapsed) is the check that does not depend on clocks."""
    return settings.max_queue_wait_s + hard_limit_s(settings, limit_s)


def task_id(turn_id: str, call_id: str) -> str:
    """The Celery task id of a call: derived, so any process can revoke a turn's tasks."""
    return f"{turn_id}:{call_id}"


log = logging.getLogger(__name__)


class Submitter:
    """Sends calls with one Celery app (thread-safe: Celery's producer pool)."""

    def __init__(self, app: Celery, settings: Settings, audit: AuditLog | None = None) -> None:
        self.app = app
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.fleet_keys = settings.require_signing("dispatcher")  # None: unsigned, on purpose
        self.audit = audit
        self._announced: set[tuple[str, str]] = set()  # (turn, call) whose `submitted` is written
        self._lock = threading.Lock()
        self._batch = threading.local()  # .producer: the producer of this thread's open batch
        self._reporter: ThreadPoolExecutor | None = None  # report_failed's thread, started on first use
        self._result_cls: Any = None  # send_task's AsyncResult, with one result backend for every thread

    @contextmanager
    def batch(self, size: int) -> Iterator[None]:
        """Calls :meth:`send` inside the block (at most ``size``, in this thread) reach the broker
        together when it ends: one round trip, and on a Redis broker one MULTI/EXEC transaction,
        so they all reach their queues or none does (kombu's ``Producer.batch``; other brokers
        publish each at once). Raises :class:`BrokerUnavailable` at the end if that send fails;
        an exception inside the block discards the calls not yet sent. Their ``task-sent`` events
        (``Settings.task_sent_events``) go with them as one message (:mod:`.sent_events`)."""
        with self.app.producer_or_acquire() as producer:
            self._batch.producer = producer
            self._batch.sent = SentEvents(self.app) if self.settings.task_sent_events else None
            self._batch.declare = {}  # queue name -> [its Queue bound to the producer's channel]
            try:
                with producer.batch(max_size=4 * size + 17):  # never flushes part-way
                    yield
                    if self._batch.sent is not None:
                        self._batch.sent.flush(producer)
            except (OperationalError, OSError, BatchPublishError) as exc:
                raise BrokerUnavailable(self.settings.broker, str(exc)) from exc
            finally:
                self._batch.producer = self._batch.sent = self._batch.declare = None

    def _declare(self, producer: Any, queue: str) -> list[Any] | None:
        """What a send in this thread's batch declares: the queue Celery would declare, bound to the
        batch's channel once per batch (kombu's ``maybe_declare`` copies an unbound queue to bind it
        on every send before it finds the declaration cached); ``None`` outside a batch (Celery's own)."""
        bound = getattr(self._batch, "declare", None)
        if producer is None or bound is None:
            return None
        if queue not in bound:
            bound[queue] = [self.app.amqp.queues[queue].bind(producer.channel)]
        return bound[queue]

    def _sent_result(self) -> Any:
        """The class ``send_task`` makes its (unused: the ledger has the results) AsyncResult with,
        bound to the result backend of the thread that sent first. Celery's default takes
        ``app.backend``, which is per thread: each turn's driver thread would build a Redis result
        backend (a client, redis-py's driver info from package metadata) for its first send."""
        if self._result_cls is None:
            with self._lock:
                if self._result_cls is None:
                    self._result_cls = partial(self.app.AsyncResult, backend=self.app.backend)
        return self._result_cls

    def announce(self, turn_id: str, calls: Sequence[tuple[str, ToolSpec]], pipe: Any = None) -> int:
        """Write the ``submitted`` audit entry of ``(call_id, spec)`` about to be sent, in one
        round trip (instead of one per :meth:`send`); with ``pipe`` (a pipeline on the ledger's
        Redis), only queue its commands there: the caller executes it before sending. Returns how
        many commands were queued on ``pipe``. A failed write is logged (the audit is best effort)."""
        if self.audit is None or not calls:
            return 0
        queued = self.audit.append_submitted(turn_id, [(call_id, self._submitted(turn_id, call_id, spec))
                                                       for call_id, spec in calls], pipe=pipe)
        with self._lock:
            self._announced.update((turn_id, call_id) for call_id, _ in calls)
        return queued

    def _submitted(self, turn_id: str, call_id: str, spec: ToolSpec) -> dict[str, Any]:
        return {"tool": spec.name, "queue": self.keys.queue(spec.queue), "task_id": task_id(turn_id, call_id)}

    def send(
        self,
        *,
        turn_id: str,
        call_id: str,
        spec: ToolSpec,
        arguments: dict[str, Any],
        workspace: str | None,
        session_id: str | None,
        rank: int = 1,
        headers: dict[str, str] | None = None,
        shown: dict[str, Any] | None = None,
    ) -> str:
        """Publish the call; returns its task id. ``rank`` is the plan's rank of the call (the
        longer the chain it heads, the sooner a worker takes it). Raises BrokerUnavailable if the
        broker refuses. Inside :meth:`batch`, the call is only buffered until the batch ends.
        ``headers``: extra message headers (the W3C trace context of the call's span, observe/tracing.py).
        ``shown``: ``shown_arguments(arguments, spec.sensitive)`` (wire.py) when the caller has it already."""
        limit_s = spec.time_limit_s(arguments)
        submitted_at = time.time()
        expires_s = message_expiry_s(self.settings, limit_s)
        envelope = CallEnvelope(
            turn_id=turn_id,
            call_id=call_id,
            name=spec.name,
            arguments=arguments,
            workspace=workspace,
            session_id=session_id,
            time_limit_s=limit_s,
            idempotency_key=spec.idempotency_key_for(turn_id, call_id, arguments),
            submitted_at=submitted_at,
            expires_at=None if self.fleet_keys is None else submitted_at + expires_s,
            key_id=None if self.fleet_keys is None else self.fleet_keys.current_id,
        )
        shown = json.dumps(
            {"turn_id": turn_id, "call_id": call_id,
             "arguments": shown_arguments(arguments, spec.sensitive) if shown is None else shown},
            default=str,
        )
        if len(shown) > KWARGSREPR_MAX_CHARS:
            shown = shown[: KWARGSREPR_MAX_CHARS - 3] + "..."
        tid = task_id(turn_id, call_id)
        queue = live_queue(self.settings, spec, session_id) or self.keys.queue(spec.queue)  # live sessions
        soft_s, hard_s = limit_s + SOFT_LIMIT_MARGIN_S, hard_limit_s(self.settings, limit_s)
        body = envelope.model_dump(mode="json")
        if self.fleet_keys is not None:  # bound: envelope, task id, queue, the limits the worker enforces
            body["signature"] = sign(self.fleet_keys, task=TASK_NAME, task_id=tid, queue=queue,
                                     limits=[soft_s, hard_s], envelope=body)
        with self._lock:
            announced = (turn_id, call_id) in self._announced
            self._announced.discard((turn_id, call_id))
        if self.audit is not None and not announced:  # before the send: it precedes the worker's `started`
            self.audit.append_submitted(turn_id, [(call_id, self._submitted(turn_id, call_id, spec))])
        producer = getattr(self._batch, "producer", None)
        try:
            self.app.send_task(
                TASK_NAME,
                kwargs={"envelope": body},
                task_id=tid,
                queue=queue,
                soft_time_limit=soft_s,
                time_limit=hard_s,
                shadow=f"tool.{spec.name}",
                priority=priority_of(rank, self.settings.broker),
                argsrepr="()",
                kwargsrepr=shown,
                retry=False,
                producer=producer,
                declare=self._declare(producer, queue),
                event_dispatcher=getattr(self._batch, "sent", None),  # None: Celery publishes it at once
                # the result is the ledger's, not Celery's (the task has ignore_result): without
                # this, Celery's Redis backend subscribes to each task's result channel at send
                ignore_result=True,
                # a message no worker took by then is discarded unrun (Celery revokes it as
                # "expired"): the dispatcher has given the call TOOL_UNAVAILABLE by then, and the
                # worst late start (taken at the deadline, lost, redelivered) is covered by the hard limit
                expires=expires_s,
                headers=headers,
                result_cls=self._sent_result(),
            )
        except (OperationalError, OSError) as exc:
            raise BrokerUnavailable(self.settings.broker, str(exc)) from exc
        return tid

    def report_failed(self, task_id: str, code: str, worker: str | None = None) -> None:
        """Tell Flower that a task the dispatcher ended itself failed (its worker died, no worker
        took it): one ``task-failed`` event, as a worker sends for an error result
        (:mod:`toolfleet.worker.task_states`); otherwise Flower would show it ``STARTED`` or
        ``PENDING`` for good. ``worker``: the worker that ran it, if any (the event comes from it,
        as far as Flower can tell). Sent from a thread of its own (one, reports in order), so a
        broker in trouble never holds up the turn's driver. Best effort: the ledger holds the
        result either way."""
        if not task_id:
            return
        with self._lock:
            if self._reporter is None:
                self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolfleet-flower")
            self._reporter.submit(self._send_failed, task_id, code, worker)

    def _send_failed(self, task_id: str, code: str, worker: str | None) -> None:
        from ..worker.task_states import CallFailed

        text = f"{code}: ended by the dispatcher (see the turn ledger)"
        try:
            with self.app.events.default_dispatcher(hostname=worker) as events:
                events.send("task-failed", uuid=task_id, exception=repr(CallFailed(text)), traceback="")
        except Exception as exc:  # noqa: BLE001 - Flower's view only
            log.warning("could not tell Flower that task %s failed (%s)", task_id, exc)

    def close(self) -> None:
        """Stop the thread that reports failed tasks (reports still queued are dropped)."""
        with self._lock:
            reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.shutdown(wait=False, cancel_futures=True)

    def revoke(self, task_ids: list[str], *, kill: bool = False) -> None:
        """Tell the workers to drop (``kill=False``) or SIGKILL (``kill=True``) these tasks."""
        if not task_ids:
            return
        try:
            if kill:
                self.app.control.revoke(task_ids, terminate=True, signal="SIGKILL")
            else:
                self.app.control.revoke(task_ids)
        except (OperationalError, OSError):
            pass  # best effort: the ledger already keeps them from starting
