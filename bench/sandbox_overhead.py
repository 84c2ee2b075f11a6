"""Measurement 7, what the sandbox adds to a ``run_command`` call: the same command run by the
``run_command`` handler with the sandbox (bubblewrap, network none) and without it
(``sandbox = "none"``), interleaved call by call in one process, so load hits both alike.

Measured at the handler (from the call into the handler to its return, process start and output
collection included): that is where the sandbox acts; the queueing around a call through a worker
is the same either way. Target: the added median <= 10 ms.

Standalone: ``python -m bench.sandbox_overhead [--rounds N] [--command CMD]`` prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from toolfleet.tools import sandbox
from toolfleet.tools.command import run_command
from toolfleet.tools.context import ToolContext

from .stats import summary_ms

COMMAND = "echo ok"
TARGET_ADDED_MS = 10.0


def _call(workspace: Path, command: str) -> tuple[float, float]:
    """Wall seconds of one call, and CPU seconds of the processes it started (bwrap, the shell)."""
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="run_command", workspace=workspace,
                      deadline=time.monotonic() + 30)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run_command(ctx=ctx, command=command)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rounds: int = 200, command: str = COMMAND, warmup: int = 5) -> dict[str, Any]:
    """``rounds`` calls of ``command`` each way, alternating. Raises RuntimeError when the sandbox
    cannot be created here (the figure would be meaningless)."""
    boxed = sandbox.configure(sandbox.SandboxConfig(mode="bwrap", network="none"))
    if boxed.error:
        raise RuntimeError(f"the sandbox cannot be created here: {boxed.error}")
    bare = sandbox.configure(sandbox.SandboxConfig(mode="none"))
    samples: dict[str, list[float]] = {"sandbox": [], "no_sandbox": []}
    cpu_s: dict[str, float] = {"sandbox": 0.0, "no_sandbox": 0.0}
    load_before = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
            workspace = Path(tmp)
            for i in range(warmup + rounds):
                for name, state in (("sandbox", boxed), ("no_sandbox", bare)) if i % 2 else \
                        (("no_sandbox", bare), ("sandbox", boxed)):
                    sandbox.install(state)
                    elapsed, cpu = _call(workspace, command)
                    if i >= warmup:
                        samples[name].append(elapsed)
                        cpu_s[name] += cpu
            argv = boxed.command(["bash", "-c", command], workspace)[0]
    finally:
        sandbox.install(boxed)
    stats = {k: summary_ms(v) for k, v in samples.items()}
    added = stats["sandbox"]["median_ms"] - stats["no_sandbox"]["median_ms"]
    return {"command": command, "rounds": rounds, "stats": stats, "added_median_ms": added,
            "cpu_ms_per_call": {k: v / rounds * 1000 for k, v in cpu_s.items()},
            "load_1min": [load_before, os.getloadavg()[0]],
            "target_added_ms": TARGET_ADDED_MS, "argv": argv}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--command", default=COMMAND)
    args = parser.parse_args()
    result = measure(args.rounds, args.command)
    s = result["stats"]
    print(json.dumps(result["stats"], indent=2))
    print(f"run_command {args.command!r}, median of {args.rounds}: with sandbox {s['sandbox']['median_ms']:.2f} ms, "
          f"without {s['no_sandbox']['median_ms']:.2f} ms, added {result['added_median_ms']:.2f} ms "
          f"(target <= {TARGET_ADDED_MS:g} ms); CPU of the started processes per call: "
          f"{result['cpu_ms_per_call']['sandbox']:.2f} ms with, {result['cpu_ms_per_call']['no_sandbox']:.2f} ms "
          f"without; load average (1 min) {result['load_1min'][0]:.2f} before, {result['load_1min'][1]:.2f} after")


if __name__ == "__main__":
    main()
