"""What a call of a live session's ``shell`` costs, against a ``run_command`` call (issue 13, item 3).

Two levels, each interleaved call by call so load hits both alike:

- **through a worker** (what an agent sees): one turn with one call, ``shell`` (the session's
  persistent bash, on the worker that holds it) against ``run_command`` (a new sandbox per call),
  from ``Dispatcher.run`` to its result;
- **at the handler**: :meth:`toolfleet.worker.live_shell.Shell.run` against the ``run_command``
  handler, in this process (no queueing).

Standalone: ``python -m bench.live_session [--rounds N] [--redis-url URL]`` prints the figures as
JSON (a private redis-server is started when no URL is given).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from toolfleet import Dispatcher, ToolCall
from toolfleet.keys import Keys
from toolfleet.settings import Settings
from toolfleet.tools import sandbox
from toolfleet.tools.command import run_command
from toolfleet.tools.context import ToolContext
from toolfleet.tools.registry import default_registry
from toolfleet.worker.live_shell import Shell

from .stack import BENCH_TOOLS, FLEET_KEY, READY_TIMEOUT_S, ROOT, PrivateRedis, WorkerProcess, _delete_namespace
from .stats import summary_ms

SHELL_TOOLS = "toolfleet.tools.shell_session"


def at_handler(rounds: int, workspace: Path) -> dict[str, Any]:
    box = sandbox.configure(sandbox.SandboxConfig())
    if box.error:
        raise RuntimeError(f"the sandbox cannot be created here: {box.error}")
    shell = Shell(workspace)
    never = threading.Event()
    samples: dict[str, list[float]] = {"shell": [], "run_command": []}
    try:
        for i in range(rounds + 5):
            for name in (("shell", "run_command") if i % 2 else ("run_command", "shell")):
                t0 = time.perf_counter()
                if name == "shell":
                    shell.run(f"echo {i}", 30, never)
                else:
                    ctx = ToolContext(call_id="c", turn_id="t", tool_name="run_command", workspace=workspace,
                                      deadline=time.monotonic() + 30)
                    run_command(ctx=ctx, command=f"echo {i}")
                if i >= 5:
                    samples[name].append(time.perf_counter() - t0)
    finally:
        shell.close()
    return {k: summary_ms(v) for k, v in samples.items()}


def through_worker(rounds: int, redis_url: str, workspace: Path) -> dict[str, Any]:
    ns = f"bench-{uuid.uuid4().hex[:8]}-live"
    argv = [sys.executable, "-m", "toolfleet", "worker", "--redis-url", redis_url, "--namespace", ns,
            "--concurrency", "2", "--tools", BENCH_TOOLS, "--tools", SHELL_TOOLS, "--hostname", f"tf@{ns}",
            "--loglevel", "WARNING"]
    worker = _start_worker(argv, redis_url, Keys(ns).workers_ready)
    settings = Settings(redis_url=redis_url, namespace=ns, cancel_grace_s=0.5, kill_grace_s=1.0, fleet_key=FLEET_KEY)
    samples: dict[str, list[float]] = {"shell": [], "run_command": []}
    try:
        with Dispatcher(settings, default_registry([BENCH_TOOLS, SHELL_TOOLS])) as dispatcher:
            for i in range(rounds + 5):
                for name in (("shell", "run_command") if i % 2 else ("run_command", "shell")):
                    call = ToolCall(id="c", name=name, arguments={"command": f"echo {i}"})
                    t0 = time.perf_counter()
                    [result] = dispatcher.run([call], workspace=str(workspace), session_id="bench", timeout_s=60)
                    if not result.ok:
                        raise RuntimeError(f"{name} failed: {result.content}")
                    if i >= 5:
                        samples[name].append(time.perf_counter() - t0)
    finally:
        worker.stop()
        _delete_namespace(redis_url, ns)
    return {k: summary_ms(v) for k, v in samples.items()}


def _start_worker(argv: list[str], redis_url: str, ready_key: str) -> WorkerProcess:
    """:class:`bench.stack.WorkerProcess`, waiting for readiness in short BLPOPs (redis-py 8 reads
    with a 5 s socket timeout: a worker slower than that to start on a loaded machine is not an error)."""
    worker = WorkerProcess.__new__(WorkerProcess)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    env.pop("TOOLFLEET_NAMESPACE", None)
    worker.proc = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True)
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and worker.proc.poll() is None:
        if client.blpop([ready_key], timeout=2) is not None:
            client.close()
            return worker
    worker.stop()
    raise RuntimeError(f"worker {argv} did not become ready in {READY_TIMEOUT_S:g} s")


def measure(rounds: int, redis_url: str) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        handler = at_handler(rounds, Path(tmp))
        worker = through_worker(rounds, redis_url, Path(tmp))
    return {"rounds": rounds, "at_handler": handler, "through_worker": worker,
            "load_1min": [load_before, os.getloadavg()[0]]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live_session", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    server = None if args.redis_url else PrivateRedis()
    try:
        url = args.redis_url or server.url  # type: ignore[union-attr]
        figures = measure(args.rounds, url)
        print(json.dumps(figures, indent=2))
        (Path(__file__).parent / "results" / "live_session.json").write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
