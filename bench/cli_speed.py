"""How long the CLI's everyday commands take, end to end, as a user runs them (issue 15, point 8):
``toolfleet --help``, a no-op ``toolfleet run`` (one ``list_dir`` call against a live stack),
``toolfleet up -d`` and ``toolfleet down``; each the median of ``runs`` runs (wall time of the whole
process, Python's start included; ``python -c pass`` is timed too, as the floor). Modules are
byte-compiled as after ``pip install`` (a warm-up run fills a private cache, even when the
environment sets ``PYTHONDONTWRITEBYTECODE``).

Targets (issue 15, on a 2-core machine): ``--help`` <= 0.3 s, a no-op ``run`` <= 0.6 s, ``down`` <= 2 s.
Standalone: ``python -m bench.cli_speed [--runs N] [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS_S = {"help": 0.3, "run_noop": 0.6, "down": 2.0}
NOOP_RESPONSE = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}]}}]}


CPU_S: dict[str, list[float]] = {}  # CPU seconds of each timed command's process, by argv[3] (or "python")


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    CPU_S.setdefault(argv[3] if len(argv) > 3 else "python", []).append(cpu_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} failed ({done.returncode}): {done.stderr[-1500:]}")
    return elapsed, done


def _stats(times: list[float]) -> dict[str, Any]:
    return {"n": len(times), "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "all_s": [round(t, 3) for t in times]}


def _delete_namespace(redis_url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{namespace}[:.]*", count=500):
        client.delete(key)


def measure(runs: int = 5, redis_url: str = "redis://127.0.0.1:6379/0") -> dict[str, Any]:
    """Median wall seconds of each command over ``runs`` runs, with the targets and verdicts."""
    tf = [sys.executable, "-m", "toolfleet"]
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        home, workspace, response = Path(tmp) / "home", Path(tmp) / "ws", Path(tmp) / "noop.json"
        workspace.mkdir()
        (workspace / "a.txt").write_text("a\n")
        response.write_text(json.dumps(NOOP_RESPONSE))
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOOLFLEET_HOME=str(home), REDIS_URL=redis_url,
                   TOOLFLEET_NAMESPACE=f"bench-cli-{uuid.uuid4().hex[:8]}",
                   # as installed: byte-compiled modules (cached here, not in the venv or the checkout)
                   PYTHONPYCACHEPREFIX=str(Path(tmp) / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        times: dict[str, list[float]] = {"python": [], "help": [], "run_noop": [], "up": [], "down": []}
        _timed([*tf, "--help"], env)  # warm-up: fills the bytecode cache
        CPU_S.clear()
        for _ in range(runs):
            times["python"].append(_timed([sys.executable, "-c", "pass"], env)[0])
            times["help"].append(_timed([*tf, "--help"], env)[0])
        for _ in range(runs):
            try:
                times["up"].append(_timed([*tf, "up", "-d", "--workers", "1", "--no-flower"], env)[0])
                if not times["run_noop"]:
                    _timed([*tf, "run", str(response), "-w", str(workspace), "--json"], env)  # warm-up
                    CPU_S["run"].pop()
                    for _ in range(runs):
                        elapsed, done = _timed([*tf, "run", str(response), "-w", str(workspace), "--json"], env)
                        assert json.loads(done.stdout)["results"][0]["status"] == "ok", done.stdout
                        times["run_noop"].append(elapsed)
            finally:
                times["down"].append(_timed([*tf, "down"], env)[0])
        _delete_namespace(redis_url, env["TOOLFLEET_NAMESPACE"])
    out: dict[str, Any] = {"runs": runs, "load_1min": os.getloadavg()[0], "targets_s": TARGETS_S,
                           "date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu_count": os.cpu_count()}
    out.update({name: _stats(values) for name, values in times.items()})
    for name, key in (("python", "python"), ("help", "--help"), ("run_noop", "run"), ("up", "up"), ("down", "down")):
        out[name]["cpu_median_s"] = statistics.median(CPU_S.get(key) or [float("nan")])
    out["met"] = {name: out[name]["median_s"] <= target for name, target in TARGETS_S.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--into", type=Path, default=None,
                        help="also put the figures into this results.json (then `python -m bench --render`)")
    args = parser.parse_args()
    figures = measure(args.runs, args.redis_url)
    print(json.dumps(figures, indent=2))
    if args.into is not None:
        results = json.loads(args.into.read_text())
        results["cli"] = figures
        args.into.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
