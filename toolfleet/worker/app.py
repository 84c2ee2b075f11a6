"""The Celery app of a toolfleet worker (and of the dispatcher, which only sends with it).

One task, ``toolfleet.run_call``, runs one call; each message carries ``shadow="tool.<name>"`` so
Flower and the logs show the tool, and ``kwargsrepr`` shows turn id, call id and arguments.
JSON only (never pickle), task events on (published in batches, :mod:`.events`). A worker takes a
message only when one of its processes is free (no prefetch): so a cancelled turn's queued calls
are not held by a busy worker, and the calls that head the longest chains of a plan (their
message priority) start first.

Worker loss: the task is acknowledged late and its message rejected back to the queue when the
pool process running it dies (``acks_late`` + ``reject_on_worker_lost``), so the call is delivered
again; :mod:`.side_effects` then decides whether it may run again (reads and journaled writes) or gets
``WORKER_LOST``. With a Redis broker an unacknowledged message comes back after the visibility
timeout, so that must be longer than any call can take (:func:`visibility_timeout_s`). Results
live in the turn ledger, not in Celery's result backend (``ignore_result``): a REVOKED state there
proves nothing about whether a call ran. The task returns only status, error code and sizes (an
error result raises :class:`~.task_states.CallFailed` carrying the same, so Flower shows it as a
failed task: :mod:`.task_states`), and the worker's log lines are redacted (:mod:`.redaction`):
Flower and the logs never see tool output.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.exceptions import Ignore, SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from celery.signals import worker_shutdown
from celery.worker.request import Request
from celery.worker.state import task_ready

from ..errors import ConfigurationError
from ..models import ErrorCode
from ..observe.results import running
from ..policy.config import Policy
from ..redis_tls import password_in_userinfo, ssl_options
from ..settings import Settings
from ..tools.redact import register_own_secrets
from ..tools.registry import Registry, default_registry
from .affinity import connect_affinity
from .authenticity import message_problem, report_drop
from .catalog import connect_catalog
from .events import BatchedTaskEvents
from .execute import RUNNING_COPY_MESSAGE, SUPERSEDED_MESSAGE, execute
from .lost_ends import abandoned, finalize, killed, note_stale_death, record_unstarted, recorded, spec_of
from .main_steps import MAIN_WAIT_S, MainSteps
from .pool import POOL_CLASS
from .reaper import connect_reaper
from .redaction import redacted_failure
from .runtime import Runtime
from .side_effects import timeout_hint
from .task_states import KILLED_AT_HARD_LIMIT, KILLED_ON_CANCEL, CallFailed, ShadowedAMQP, task_outcome
from .transport import TRANSPORT_CLASS

TASK_NAME = "toolfleet.run_call"
HEALTH_TASK_NAME = "toolfleet.health_check"
HEALTH_TIME_LIMIT_S = 10.0
VISIBILITY_MARGIN_S = 60.0
BROKER_SOCKET_TIMEOUT_S = 5.0  # a read of the Redis broker that takes longer fails (kombu's default: never)
BROKER_CONNECT_TIMEOUT_S = 3.0
log = logging.getLogger(__name__)


def longest_hard_limit_s(settings: Settings, registry: Registry) -> float:
    """The longest a call of ``registry`` may run before it is killed (s): the largest time limit a
    call can ask for, plus the soft-limit margin and the kill grace the dispatcher adds."""
    from ..dispatcher.submit import hard_limit_s  # the dispatcher imports this module

    limits = [spec.max_timeout_s if spec.timeout_arg else spec.timeout_s for spec in registry]
    return hard_limit_s(settings, max(limits, default=0.0))


def visibility_timeout_s(settings: Settings, registry: Registry) -> float:
    """The Redis broker's visibility timeout (s): a message not acknowledged that long after a
    worker took it is handed out again. It must exceed the longest hard time limit plus the queue
    wait, or a call still running would be delivered a second time. Default: that sum plus a
    margin. Raises :class:`ConfigurationError` if ``settings.visibility_timeout_s`` is shorter."""
    needed = longest_hard_limit_s(settings, registry) + settings.max_queue_wait_s
    if settings.visibility_timeout_s is None:
        return needed + VISIBILITY_MARGIN_S
    if settings.visibility_timeout_s <= needed:
        raise ConfigurationError(
            f"visibility_timeout_s={settings.visibility_timeout_s:g} is too short: it must exceed the longest "
            f"hard time limit plus max_queue_wait_s ({needed:g} s), or a running call is delivered twice"
        )
    return settings.visibility_timeout_s


def broker_transport_options(settings: Settings, registry: Registry) -> dict[str, Any]:
    """Redis broker: the visibility timeout, the unacknowledged-message bookkeeping kept under
    the namespace (kombu's default keys ``unacked*`` are shared by every app on the database), and
    socket timeouts: kombu's default waits for ever on a broker that is frozen or gone without
    closing the connection (its docs: "a synchronous command such as a publish waits forever on
    the dead connection"), so a dispatcher's publish or revoke, and with it ``submit()``,
    ``cancel()`` and a turn's driver, would wait as long (docs/guarantees.md, E12). The worker's
    BRPOP (1 s) and pub/sub reads are the event loop's, on readable sockets only."""
    if not settings.broker_is_redis:
        return {}
    return {"visibility_timeout": visibility_timeout_s(settings, registry), **unacked_keys(settings.namespace),
            "socket_timeout": BROKER_SOCKET_TIMEOUT_S, "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S}


def event_exchange(namespace: str) -> str:
    """The exchange a namespace's task events go to (Celery's ``event_exchange``; default
    ``celeryev``, shared by every app on the broker). On a Redis broker its fanout channel is
    ``/<db>.<namespace>.celeryev/<event type>`` (docs/deploying.md)."""
    return f"{namespace}.celeryev"


def control_exchange(namespace: str) -> str:
    """The name Celery's control mailbox is made from (``control_exchange``; default ``celery``,
    shared by every app): broadcasts go to ``<namespace>.celery.pidbox``, a worker's queue is
    ``<hostname>.<namespace>.celery.pidbox``, replies ``<id>.reply.<namespace>.celery.pidbox``."""
    return f"{namespace}.celery"


def unacked_keys(namespace: str) -> dict[str, str]:
    """kombu's unacknowledged-message keys (Redis broker), under ``namespace`` (Flower uses them too)."""
    return {"unacked_key": f"{namespace}.unacked", "unacked_index_key": f"{namespace}.unacked_index",
            "unacked_mutex_key": f"{namespace}.unacked_mutex"}


def celery_config(settings: Settings, registry: Registry | None = None) -> dict[str, Any]:
    """Celery settings shared by workers and dispatchers."""
    registry = registry if registry is not None else default_registry()
    return {
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        # task events on the namespace's own exchange: Flower (toolfleet.monitor) of one namespace shows
        # that namespace's workers and tasks only, not every fleet sharing the broker's database
        "event_exchange": event_exchange(settings.namespace),
        # control messages (a cancel's revoke, Flower's inspect) on the namespace's own mailbox, so one
        # fleet's dispatcher reaches its own workers only, and its Flower lists them only
        "control_exchange": control_exchange(settings.namespace),
        "task_default_queue": f"{settings.namespace}.default",
        "worker_send_task_events": True,
        # task-sent events let Flower list queued calls (PENDING); ShadowedAMQP names them by the
        # shadow, as the worker's events do (worker/task_states.py; cost: bench/, "sent events")
        "task_send_sent_event": settings.task_sent_events,
        "worker_prefetch_multiplier": 1,
        # take a message only when a process is free (Redis brokers; Celery >= 5.6): otherwise the
        # worker reserves queued calls ahead, in queue order, and a later call heading a longer
        # chain (higher priority) waits behind them
        "worker_disable_prefetch": True,
        "worker_pool": POOL_CLASS,
        "result_expires": settings.result_ttl_s,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": broker_transport_options(settings, registry),
        "broker_transport": TRANSPORT_CLASS if settings.broker_is_redis else None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_hijack_root_logger": False,
        "task_publish_retry": False,
        # rediss:// URLs: TLS options for the broker and the result backend (toolfleet/redis_tls.py);
        # Flower reads broker_use_ssl too. None: not TLS (Celery's default)
        "broker_use_ssl": ssl_options(settings.broker) if settings.broker_is_redis else None,
        "redis_backend_use_ssl": ssl_options(settings.redis_url),
        # RabbitMQ: the tool queues Celery declares on demand (workers and dispatchers alike)
        "task_create_missing_queue_type": settings.broker_queue_type,
        "task_default_queue_type": settings.broker_queue_type,
    }


def create_app(settings: Settings, registry: Registry | None = None, policy: Policy | None = None) -> Celery:
    """A Celery app bound to ``settings``; ``registry`` (default: built-in tools) is what a worker
    started from this app serves, ``policy`` (default: permissive) what it checks before running a
    call. ``app.toolfleet`` is the :class:`Runtime`."""
    registry = registry if registry is not None else default_registry()
    register_own_secrets(settings.secret_values())  # masked in whatever this process shows
    runtime = Runtime(settings, registry, policy)
    # the backend's ?password= as :password@, which Celery masks where it shows the URL (inspect conf)
    app = Celery(f"toolfleet-{settings.namespace}", broker=settings.broker,
                 backend=password_in_userinfo(settings.redis_url), amqp=ShadowedAMQP)
    app.conf.update(celery_config(settings, registry))
    app.steps["consumer"].add(BatchedTaskEvents)
    app.toolfleet = runtime  # type: ignore[attr-defined]
    steps = MainSteps()  # the main process's ledger steps, off its event loop

    @worker_shutdown.connect(weak=False)
    def _drain_steps(**_: Any) -> None:
        steps.drain()

    class CallRequest(Request):
        """Hooks of the worker's main process for the ends the task body never sees."""

        _toolfleet_drop: str | None = None

        def revoked(self) -> bool:
            """Celery asks this just before it hands the message to a pool process: a message
            without a valid fleet signature is dropped here, unrun (worker/authenticity.py)."""
            if super().revoked():
                return True
            if self._toolfleet_drop is None:
                problem = message_problem(runtime, task=TASK_NAME, task_id=self.id,
                                          queue=(self.delivery_info or {}).get("routing_key"),
                                          timelimit=self.time_limits, kwargs=self.kwargs)
                self._toolfleet_drop = problem or ""
                if problem:
                    report_drop(runtime, problem, task_id=self.id, kwargs=self.kwargs, where="on receipt")
                    self.reject(requeue=False)  # acknowledged, not requeued: task-rejected
                    task_ready(self)
            return bool(self._toolfleet_drop)

        def on_timeout(self, soft: bool, timeout: float) -> None:
            super().on_timeout(soft, timeout)
            if not soft:  # off the event loop, which enforces the other calls' limits (main_steps.py)
                kwargs, pid = self.kwargs, self.worker_pid
                steps.run(lambda: killed(
                    runtime, kwargs, pid, ErrorCode.TIMEOUT,
                    f"the call ran past its hard time limit ({timeout:g} s) and its process was killed",
                    timeout_hint(spec_of(runtime, kwargs)), broken=True, unstarted=(
                        f"the worker's pool process was stuck before it could start the call, and was killed "
                        f"at the call's hard time limit ({timeout:g} s); the call did not run",
                        "nothing happened; ask again if the call is still wanted")))

        def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)
            stopped_by_us = self._already_cancelled or self._already_revoked
            if isinstance(exc, WorkerLostError) or (isinstance(exc, SystemExit) and not stopped_by_us):
                # The message goes back to the queue (reject_on_worker_lost); the next delivery
                # decides what the call may do (worker/side_effects.py). Free its journal key and
                # mark its claim dead first (waited for, at most MAIN_WAIT_S: main_steps.py).
                kwargs, pid = self.kwargs, self.worker_pid
                steps.run(lambda: abandoned(runtime, kwargs, broken=True, pid=pid), wait_s=MAIN_WAIT_S)
                steps.run(lambda: note_stale_death(runtime, kwargs, pid))
            hard_limit = isinstance(exc, TimeLimitExceeded)
            if hard_limit:  # Celery logged "hard time limit exceeded": no traceback of it too, and
                return_ok, send_failed_event = True, False  # a failed event that names the code
            error_result = isinstance(exc, CallFailed)  # an error result, not a crash: no traceback in Flower
            super().on_failure(exc_info, send_failed_event=send_failed_event and not error_result, return_ok=return_ok)
            if error_result and send_failed_event:
                self.send_event("task-failed", exception=repr(exc), traceback="")
            if hard_limit:  # the result is reported by on_timeout
                self.send_event("task-failed", exception=repr(CallFailed(KILLED_AT_HARD_LIMIT)), traceback="")
            elif type(exc).__name__ == "Terminated":
                # Celery sent task-revoked; the call's result is an error (CANCELLED, or the
                # dispatcher's OUTCOME_UNKNOWN): a failed task in Flower (worker/task_states.py)
                self.send_event("task-failed", exception=repr(CallFailed(KILLED_ON_CANCEL)), traceback="")
                kwargs, pid = self.kwargs, self.worker_pid
                steps.run(lambda: killed(
                    runtime, kwargs, pid, ErrorCode.CANCELLED, "the call was stopped when its turn was cancelled",
                    "the call may have done part of its work; check before repeating it", broken=False, unstarted=(
                        "the worker's pool process was terminated (a revoke) before it could start the call; "
                        "the call did not run", "nothing happened; ask again if the call is still wanted")))

    # shared=False: Celery registers a shared task on every app created later in the process, which
    # would run this app's closure (its runtime, its namespace) for another app's calls.
    # throws: an error result raises CallFailed, an expected exception (one log line, no traceback)
    @app.task(name=TASK_NAME, bind=True, Request=CallRequest, acks_late=True, reject_on_worker_lost=True,
              ignore_result=True, shared=False, throws=(CallFailed,))
    def run_call(self: Any, envelope: dict[str, Any]) -> dict[str, Any]:
        problem = message_problem(runtime, task=TASK_NAME, task_id=self.request.id,
                                  queue=(self.request.delivery_info or {}).get("routing_key"),
                                  timelimit=self.request.timelimit, kwargs={"envelope": envelope})
        if problem:  # the main process checked already (CallRequest.revoked); a second line
            report_drop(runtime, problem, task_id=self.request.id, kwargs={"envelope": envelope}, where="in the task")
            return {"dropped": problem}
        try:
            hard_s = (self.request.timelimit or (None, None))[0]  # the kill the worker will really apply
            with running(self.request, envelope):  # its span and the running gauge (observe/results.py)
                result = execute(runtime, envelope, worker=self.request.hostname or "worker", hard_limit_s=hard_s)
        except SoftTimeLimitExceeded:
            # The soft limit landed outside the handler (before the claim, or while a result was
            # being built or recorded): the call still gets its one result; a recorded one is kept
            # (first wins). NOT_EXECUTED where no claim began the call (one atomic step), else TIMEOUT.
            abandoned(runtime, {"envelope": envelope}, broken=False)
            if not record_unstarted(
                    runtime, {"envelope": envelope},
                    "the call's time limit passed before the worker's pool process could start it; it did not run",
                    "nothing happened; ask again if the call is still wanted"):
                finalize(runtime, {"envelope": envelope}, ErrorCode.TIMEOUT,
                          "the call ran past its time limit and was stopped",
                          timeout_hint(spec_of(runtime, {"envelope": envelope})), pid=os.getpid())
            result = recorded(runtime, envelope)
            if result is None:
                return {}
        except Exception as exc:  # Flower and the logs show the exception: redacted (worker/redaction.py)
            spec = spec_of(runtime, {"envelope": envelope})
            raise redacted_failure(exc, envelope, spec.sensitive if spec else ()) from None
        if result.error is not None and result.error.message in (SUPERSEDED_MESSAGE, RUNNING_COPY_MESSAGE):
            # this message ran nothing, and it has the call's task id (turn:call) like the message
            # that runs the call: it must not end that task. A task-succeeded here outranks the
            # other message's task-failed in Celery's event state (Flower's), in either order, so
            # a cancelled or failed call showed SUCCESS. Ignore: acknowledged, no final event.
            raise Ignore()
        # ids, codes and sizes only: the content is the ledger's; an error result raises CallFailed
        return task_outcome(result)

    @app.task(name=HEALTH_TASK_NAME, ignore_result=True, acks_late=False, shared=False,
              soft_time_limit=HEALTH_TIME_LIMIT_S, time_limit=HEALTH_TIME_LIMIT_S + 2)
    def health_check(tool: str, auth: dict[str, Any] | None = None) -> None:
        request = health_check.request
        problem = message_problem(runtime, task=HEALTH_TASK_NAME, task_id=request.id,
                                  queue=(request.delivery_info or {}).get("routing_key"), timelimit=None,
                                  kwargs={"envelope": {} if auth is None else auth})
        if not problem and auth is not None and runtime.settings.fleet_keys is not None and auth.get("tool") != tool:
            problem = "bad_signature"  # a signed check of another tool
        if problem:  # the checks flip breakers: only the fleet's dispatchers may ask for one
            report_drop(runtime, problem, task_id=request.id, kwargs={"envelope": auth}, where="(health check)")
            return
        run_health_check(runtime, tool)

    connect_catalog(app, runtime)
    connect_affinity(app, runtime)  # live sessions: own queue, session host (worker/affinity.py)
    connect_reaper(app, runtime)  # run_command's sandboxes end when the worker's liveness lapses
    return app


def run_health_check(runtime: Runtime, tool: str) -> None:
    """Run ``tool``'s side-effect-free health check here and close or reopen its breaker. A tool
    without one passes when this worker serves it. A worker that does not serve it says nothing
    (the breaker retries after its cooldown)."""
    spec = runtime.registry.get(tool)
    if spec is None:
        return
    ok = True
    if spec.health_check is not None:
        try:
            spec.health_check()
        except Exception as exc:  # the check failing is the answer
            log.warning("health check of %s failed: %s", tool, exc)
            ok = False
    runtime.breakers.health(tool, ok)
