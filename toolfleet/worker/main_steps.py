"""Ledger steps of the worker's main process, run off its event loop (docs/guarantees.md E11).

The main process enforces every running call's time limits: Celery's timers for the soft and the
hard limit run in its event loop. A hook of one call that waited there on the ledger's Redis (the
``TIMEOUT`` of a call killed at its hard limit, the ``CANCELLED`` of one killed on a cancel, a dead
pool process's journal entry and claim) would stop that loop for as long as Redis is gone or
frozen (the ledger's 30 s retry budget and more; for ever on a frozen Redis with a redis-py before
8, whose reads have no timeout), and every other call would run past its own hard limit
meanwhile. So those steps go to one thread of their own (:class:`MainSteps`), which runs them in
the order given and waits Redis out within the ledger's retry budget; the main process's ledger
client also times out a read after ``MAIN_SOCKET_TIMEOUT_S`` (:mod:`.runtime`), so no step waits
on a frozen Redis for ever.

The one step Celery's next move depends on (a dead pool process's claim marked dead before its
message goes back to the queue, so the copy delivered again may claim the call) is waited for, at
most :data:`MAIN_WAIT_S`, and not at all while an earlier waited step still waits for Redis (so
deaths during an outage never add up their waits). Past that the loop goes on; the step still
lands when Redis answers within the retry budget, and a copy that claimed before it is refused as
a duplicate of a live execution (the call then ends by its deadline: the dispatcher's watchdog).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from .. import forksafe

log = logging.getLogger(__name__)

MAIN_WAIT_S = 2.0  # the longest the main process's event loop waits for a step it depends on
DRAIN_S = 10.0  # at warm shutdown, how long the steps still queued get to finish


class MainSteps:
    """One thread that runs the main process's ledger steps in order. ``run`` never raises: a
    step's exception is logged (the steps are best effort, like the hooks that call them)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], object], threading.Event]] = queue.SimpleQueue()
        self._lock = forksafe.lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._stuck: threading.Event | None = None  # a waited step that outlasted its wait, until it ends

    def run(self, step: Callable[[], object], *, wait_s: float = 0.0) -> bool:
        """Queue ``step``; with ``wait_s``, wait that long for it (and the steps queued before it)
        to finish. Returns whether it finished by then (always False without ``wait_s``)."""
        done = threading.Event()
        self._start()
        self._queue.put((step, done))
        if wait_s <= 0:
            return False
        with self._lock:
            stuck = self._stuck
        if stuck is not None and not stuck.is_set():
            return False  # an earlier waited step still waits for Redis: this one queues behind it, unwaited
        finished = done.wait(wait_s)
        if not finished:
            with self._lock:
                self._stuck = done
        return finished

    def drain(self, timeout_s: float = DRAIN_S) -> bool:
        """Wait up to ``timeout_s`` for every step queued so far; True if all finished."""
        if self._thread is None or self._pid != os.getpid():
            return True
        done = threading.Event()  # waited for even while a step is stuck: the last chance to land
        self._queue.put((lambda: None, done))
        finished = done.wait(timeout_s)
        if not finished:
            log.warning("%d ledger step(s) of the main process still wait for Redis at shutdown; the "
                        "dispatcher answers those calls itself (by their deadline)", self._queue.qsize())
        return finished

    def _start(self) -> None:
        with self._lock:  # a forked child never runs steps, but a thread object from its parent is not alive in it
            if self._thread is None or self._pid != os.getpid():
                self._queue = queue.SimpleQueue()
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="toolfleet-main-steps", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            step, done = self._queue.get()
            try:
                step()
            except Exception:  # noqa: BLE001 - a step's own handling logs what it could not do
                log.exception("a ledger step of the worker's main process failed")
            finally:
                done.set()
