"""The worker's sandbox reaper: ``run_command``'s sandboxes end once the worker's liveness lapses,
even when the worker is frozen (:func:`toolfleet.worker.sandbox_lease.reap`, which says how).

The main process starts the reaper before the pool forks (:func:`connect_reaper`), so every pool
process knows the registry; the catalog's heartbeat renews the lease after each publish Redis
confirmed (:func:`renew`); ``run_command`` registers the process that leads its sandbox's group
while it runs (:func:`register`). Without a reaper (a tool run in-process, a worker that does not
serve ``run_command``) :func:`register` does nothing.

Files: ``/tmp/toolfleet-reap-<worker pid>-*/`` (``0700``; every sandbox covers ``/tmp`` with a tmpfs
of its own, so no command can reach it): ``lease`` and ``running/<pid>-<start time>``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup, worker_shutdown

from .sandbox_lease import LeaseFile, private_dir, read_deadline, script_argv, start_time

log = logging.getLogger(__name__)
CATALOG_TTL_BEATS = 3  # the catalog key lives 3 heartbeats (worker/catalog.py): the lease shadows it
REAP_MARGIN_S = 0.5  # the sandboxes end this long before a dispatcher can judge the worker dead (s): the
# kill of a sandbox that loads every core took up to 0.7 s past the deadline in a breaker's trial (the
# reaper also raises its priority, sandbox_lease.boost)
_state: dict[str, Any] = {}  # "dir", "lease", "registry", "proc", "pid": set in the main process before the fork


def lease_deadline(sent_at: float, heartbeat_s: float) -> float:
    """The lease after a catalog publish sent at ``sent_at`` (monotonic, s): ``REAP_MARGIN_S`` before
    the earliest time a dispatcher can judge the worker dead (its catalog key lapsed, then missing for
    ``DEAD_CONFIRM_S``: ``toolfleet/dispatcher/availability.py``), so every ``WORKER_LOST`` comes later."""
    from ..dispatcher.availability import DEAD_CONFIRM_S  # here: the dispatcher package imports the worker's

    return sent_at + CATALOG_TTL_BEATS * heartbeat_s + DEAD_CONFIRM_S - REAP_MARGIN_S


def lapsed() -> bool:
    """Whether this worker's lease has lapsed (any process of the worker; ``False`` without a reaper)."""
    lease = _state.get("lease")
    if lease is None:
        return False
    deadline = read_deadline(lease.path)
    return deadline is None or deadline <= time.monotonic()


def start(heartbeat_s: float) -> None:
    """Make the reaper's directory and start it (main process, before the pool forks)."""
    directory = private_dir("reap")
    registry = os.path.join(directory, "running")
    os.mkdir(registry, 0o700)
    lease = LeaseFile(os.path.join(directory, "lease"))
    lease.renew(lease_deadline(time.monotonic(), heartbeat_s))  # nothing runs before the first publish
    proc = subprocess.Popen(script_argv("--reap", lease.path, registry, str(os.getpid())),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                            start_new_session=True)  # outside the worker's process group: a freeze does not stop it
    _state.update(dir=directory, lease=lease, registry=registry, proc=proc)  # proc: kept, so Popen never warns


def renew(sent_at: float, heartbeat_s: float) -> None:
    """After a catalog publish (or keep-alive) Redis confirmed, sent at ``sent_at`` (monotonic, s)."""
    lease = _state.get("lease")
    if lease is not None and _state.get("pid") in (None, os.getpid()):
        try:
            lease.renew(lease_deadline(sent_at, heartbeat_s))
        except OSError as exc:  # /tmp full: the lease lapses, and with it the running commands
            log.warning("the sandbox reaper's lease could not be renewed (%s)", exc)


def register(pid: int) -> str | None:
    """Enter the process group led by ``pid`` (a command's sandbox) in the registry: the reaper kills
    it if the worker's liveness lapses. Returns the entry for :func:`unregister` (``None`` without a
    reaper in this process, or when ``pid`` is gone)."""
    registry = _state.get("registry")
    started = start_time(pid) if registry is not None else None
    if registry is None or started is None:
        return None
    entry = os.path.join(registry, f"{pid}-{started}")
    try:
        open(entry, "x").close()
    except OSError:
        return None
    return entry


def unregister(entry: str | None) -> None:
    """Take :func:`register`'s entry out once its group has ended."""
    if entry is not None:
        try:
            os.unlink(entry)
        except OSError:
            pass


def stop() -> None:
    """Worker shutdown: remove the directory (the reaper itself ends with the worker)."""
    directory = _state.pop("dir", None)
    _state.clear()
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def connect_reaper(app: Celery, runtime: Any) -> None:
    """Start the reaper with the worker of ``app`` when its registry serves ``run_command``."""
    if not any(spec.name == "run_command" for spec in runtime.registry):
        return

    @celeryd_after_setup.connect(weak=False)
    def _setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is not app:
            return
        try:
            start(runtime.settings.heartbeat_s)
            _state["pid"] = os.getpid()
        except Exception as exc:  # noqa: BLE001 - the worker still runs; a frozen one's commands end at their limit
            log.error("the sandbox reaper did not start (%s): a frozen worker's commands run until their own "
                      "time limit", exc)

    @worker_shutdown.connect(weak=False)
    def _shutdown(sender: Any = None, **_: Any) -> None:
        if _state.get("pid") == os.getpid():
            stop()
