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
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from toolfleet import Dispatcher, ToolCall
from toolfleet.keys import Keys
from toolfleet.settings import Settings
from toolfleet.tools import sandbox
from toolfleet.tools.command import run_command
from toolfleet.tools.context import ToolContext
from toolfleet.tools.registry import default_registry
from toolfleet.worker.live_shell import Shell

from .stack import BENCH_TOOLS, PrivateRedis, WorkerProcess, _delete_namespace
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
    worker = WorkerProcess(argv, redis_url, Keys(ns).workers_ready)
    settings = Settings(redis_url=redis_url, namespace=ns, cancel_grace_s=0.5, kill_grace_s=1.0)
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
        print(json.dumps(measure(args.rounds, url), indent=2))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
