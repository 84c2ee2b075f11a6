"""A worker tools module (tests only) of pool-process hazards.

It makes every pool-process fork happen while other threads of the worker's main process hold
the locks a pool process takes on its first call: the runtime's (its ledger client), the cancel
watcher's and the log redaction's, and with ``--metrics-port`` prometheus_client's. That is the
moment a real worker meets when its steps thread records the end of a pool process killed at its
hard limit while Celery forks the replacement (tests/test_fork_safety.py).

Each hold lasts ``HOLD_S`` and is taken before the fork begins (Celery's
``worker_before_create_process`` signal, sent by the main process just before it forks).

``stuck_write`` is a journaled write whose pool process is stuck before its claim, out of the soft
time limit's reach (its journal key function blocks the soft limit's signal and sleeps past the
hard limit): what an inherited lock, or a process stopped in the kernel, looks like from outside."""

from __future__ import annotations

import inspect
import signal
import threading
import time

from celery import current_app
from celery.signals import worker_before_create_process

from toolfleet import tool
from toolfleet.observe import metrics
from toolfleet.worker import execute as execute_module
from toolfleet.worker import redaction

HOLD_S = 1.0


def _held_by_another_thread(lock) -> None:
    taken = threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            threading.Event().wait(HOLD_S)

    threading.Thread(target=hold, daemon=True, name="fork-hazard").start()
    taken.wait(5.0)


@worker_before_create_process.connect(weak=False)
def _fork_while_held(**_) -> None:
    runtime = getattr(current_app, "toolfleet", None)
    if runtime is None:
        return
    for lock in (runtime._lock, runtime.watcher._lock, redaction._running_lock, *_metrics_locks()):
        _held_by_another_thread(lock)


def _metrics_locks() -> list:
    """With ``--metrics-port``: prometheus_client's one lock of every multiprocess value (the
    catalog heartbeat and the steps thread's results take it in the main process) and the lock
    of the results counter's labels."""
    worker = metrics.worker_metrics()
    if worker is None:
        return []
    from prometheus_client import values

    return [inspect.getclosurevars(values.ValueClass.inc).nonlocals["lock"], worker.calls._lock]


@tool(access="read", resources=lambda a: [], timeout_s=2)
def hello(who: str) -> str:
    """Say hello.

    Args:
        who: Who to greet.
    """
    return f"hello {who}"


def _stuck_key(arguments) -> str:
    from billiard.process import current_process

    if current_process().name.startswith("ForkPoolWorker"):  # not in the dispatcher, which derives it too
        if arguments.get("marker"):
            open(arguments["marker"], "w").close()  # the test's sign that the process is stuck now
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])  # billiard's soft time limit
        time.sleep(arguments["stuck_s"])
    return f"stuck:{arguments['label']}"


@tool(access="write", resources=lambda a: [f"stuck:{a['label']}"], timeout_s=1, idempotency_key=_stuck_key)
def stuck_write(label: str, stuck_s: float) -> str:
    """A journaled write whose pool process is stuck for ``stuck_s`` before its claim.

    Args:
        label: Any text (its journal key).
        stuck_s: Seconds the pool process is stuck before it can claim the call.
    """
    return f"wrote {label}"


@tool(access="write", resources=lambda a: [f"stuck:{a['label']}"], timeout_s=30, idempotency_key=_stuck_key)
def stuck_long_write(label: str, stuck_s: float, marker: str) -> str:
    """``stuck_write`` with a time limit of 30 s, which creates the file ``marker`` once stuck.

    Args:
        label: Any text (its journal key).
        stuck_s: Seconds the pool process is stuck before it can claim the call.
        marker: A file created when the pool process is stuck.
    """
    return f"wrote {label}"



_held_up: set[str] = set()  # labels whose pool process was held up once already


def _held_up_screen(screen):
    """The worker's policy check (before the claim), held up ``stuck_s`` once per label and pool
    process for ``slow_to_start_write``, within the soft time limit's reach: what a slow Redis
    (the remembered rules, the cancel listener's start) or a lock held a while looks like."""

    def held_up(runtime, env, spec, worker):
        from billiard.process import current_process

        label = env.arguments.get("label", "")
        if (env.name == "slow_to_start_write" and label not in _held_up
                and current_process().name.startswith("ForkPoolWorker")):
            _held_up.add(label)
            time.sleep(env.arguments["stuck_s"])  # the soft time limit ends it
        return screen(runtime, env, spec, worker)

    return held_up


execute_module.screen_call = _held_up_screen(execute_module.screen_call)


@tool(access="write", resources=lambda a: [f"slow:{a['label']}"], timeout_s=1)
def slow_to_start_write(label: str, stuck_s: float) -> str:
    """A write whose pool process is held up for ``stuck_s`` before its claim (once per label).

    Args:
        label: Any text.
        stuck_s: Seconds the pool process is held up before it can claim the call.
    """
    return f"wrote {label}"


_key_held_up: set[str] = set()  # labels whose key function was held up once already in this process


def _held_up_key(arguments) -> str:
    from billiard.process import current_process

    label = arguments["label"]
    if arguments["stuck_s"] and label not in _key_held_up and current_process().name.startswith("ForkPoolWorker"):
        _key_held_up.add(label)
        time.sleep(arguments["stuck_s"])  # the soft time limit ends it
    return f"keyed:{label}"


@tool(access="write", resources=lambda a: [f"keyed:{a['label']}"], timeout_s=1, idempotency_key=_held_up_key)
def keyed_write(label: str, stuck_s: float, path: str) -> str:
    """A journaled write keyed by ``label`` (a second call of a label replays the first's result):
    appends a line to the file ``path`` each time it really runs. Its key function is held up
    ``stuck_s`` (once per label and pool process), within the soft time limit's reach.

    Args:
        label: The write's journal key.
        stuck_s: Seconds the key function is held up (0: not).
        path: A file the write appends a line to.
    """
    with open(path, "a") as file:
        file.write(f"{label}\n")
    return f"wrote {label}"
