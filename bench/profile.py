"""Profile a toolfleet worker under the no-op throughput load, with py-spy (the bench extra).

``python -m bench.profile [--seconds 8] [--processes 2] [--out bench/results/profile.md]``

Starts a private Redis and a toolfleet worker, drives no-op batches at it (as the throughput
measurement does) while ``py-spy record --subprocesses`` samples the worker's main process and
its pool processes, then writes the heaviest frames of each side, inclusive (a frame counts for
every sample it is on the stack of). py-spy needs ptrace rights (root, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import collections
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .overhead import run_toolfleet
from .stack import ROOT, PrivateRedis, ToolfleetFleet

SKIP = re.compile(  # frames every sample passes through, or the generic layers of redis-py: not informative
    r"runpy|typer|click|celery/bin|bootsteps|toolfleet/cli|__main__|worker_main|Celery\.start|"
    r"billiard/(pool|process|popen_fork|context)|_create_worker_process|WorkController\.start|Consumer\.start|"
    r"Evloop\.start|asynloop|Hub\.create_loop|BasePool\.start|TaskPool\.on_start|trace_task|__protected_call__|"
    r"promise\.__call__|Retry\.call_with_retry|redis/client\.py|redis/_parsers|redis/connection\.py|"
    r"commands/core\.py|contextlib"
)


def summarize(raw_path: Path, top: int = 25) -> dict[str, list[tuple[float, str]]]:
    """Inclusive share of samples per frame, for the main process and for the pool processes."""
    totals: dict[str, int] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = {"main": collections.Counter(), "pool": collections.Counter()}
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        parts = stack.split(";")
        side = "pool" if len(parts) > 1 and parts[1].startswith("process ") else "main"
        totals[side] += int(count)
        seen = set()
        for frame in parts:
            if frame.startswith("process "):
                continue
            key = re.sub(r":\d+\)", ")", frame)
            if key not in seen and not SKIP.search(key):
                frames[side][key] += int(count)
                seen.add(key)
    return {side: [(n / totals[side] * 100, f) for f, n in c.most_common(top)] for side, c in frames.items()
            if totals[side]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "profile.md")
    args = parser.parse_args(argv)
    redis_server = PrivateRedis()
    stop = threading.Event()
    try:
        with ToolfleetFleet(redis_server.url, args.processes) as fleet, tempfile.TemporaryDirectory() as tmp:
            def load() -> None:
                while not stop.is_set():
                    run_toolfleet(fleet)

            drivers = [threading.Thread(target=load, daemon=True) for _ in range(4)]
            for t in drivers:
                t.start()
            time.sleep(1.0)  # let the load settle before sampling
            raw = Path(tmp) / "worker.txt"
            subprocess.run([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(fleet.worker.proc.pid),
                            "--subprocesses", "-r", "200", "-d", str(int(args.seconds)), "-f", "raw", "-o", str(raw),
                            "--nonblocking"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            stop.set()
            for t in drivers:
                t.join()
            sides = summarize(raw)
    finally:
        stop.set()
        redis_server.stop()
    command = shlex.join(["python", "-m", "bench.profile", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Worker profile under no-op load ({args.processes} processes, {args.seconds:g} s, py-spy)", "",
             f"Made with `{command}`. "
             "Share of samples with the frame on the stack (samples include waiting on Redis sockets).", ""]
    for side, rows in sides.items():
        lines += [f"## {'Main process (consumer loop)' if side == 'main' else 'Pool processes (task bodies)'}", "",
                  "| share | frame |", "| --- | --- |"]
        lines += [f"| {share:.1f}% | `{frame}` |" for share, frame in rows]
        lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
