"""What stored session state costs per call (issue 13): the worker's load before and save after
the handler (:class:`toolfleet.tools.state.SessionStore`) of a ~5 KB state, against a real Redis,
in one process (that is all the state adds to a call: the queueing around it is the same).

The state is examples/vfs.py's ``VirtualFS`` with files filling it to the size asked for (its
random generator alone is ~6.7 KB of JSON, so the 5 KB state is a plain dict of text instead;
both are measured). Standalone: ``python -m bench.session_state [--rounds N] [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any

import redis

from toolfleet.keys import Keys
from toolfleet.tools.state import SessionState, SessionStore

from .stats import summary_ms


def _vfs_state() -> tuple[SessionState, Any]:
    from examples.vfs import TOOLS, VirtualFS

    fs = VirtualFS()
    for i in range(20):
        fs.echo(f"line {i} " * 8, f"f{i}.txt")
    return TOOLS[0].state, fs


def measure(rounds: int = 500, redis_url: str = "redis://127.0.0.1:6379/0", size_bytes: int = 5000) -> dict[str, Any]:
    """Median (and spread) of load, save, and load+save of a ``size_bytes`` dict state and of a
    VirtualFS state, ``rounds`` times each, in ms."""
    client = redis.Redis.from_url(redis_url)
    ns = f"bench-state-{uuid.uuid4().hex[:8]}"
    store = SessionStore(client, Keys(ns), url=redis_url, default_ttl_s=600)
    plain = SessionState("plain", dict[str, str])
    value = {f"k{i:03d}": "x" * 40 for i in range(size_bytes // 50)}
    cases = {"dict_5kb": (plain, value), "vfs": _vfs_state()}
    out: dict[str, Any] = {"rounds": rounds, "load_avg_before": os.getloadavg()[0]}
    try:
        for name, (state, initial) in cases.items():
            sid = f"s-{name}"
            store.open(sid, {state: initial})
            loads, saves, both = [], [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                loaded = store.load(state, sid)
                t1 = time.perf_counter()
                store.save(state, sid, loaded, loaded.value)
                t2 = time.perf_counter()
                loads.append(t1 - t0)
                saves.append(t2 - t1)
                both.append(t2 - t0)
            out[name] = {"size_bytes": len(state.dump(initial)), "load": summary_ms(loads),
                         "save": summary_ms(saves), "load_and_save": summary_ms(both)}
    finally:
        for key in client.scan_iter(match=f"{ns}:*", count=500):
            client.delete(key)
    out["load_avg_after"] = os.getloadavg()[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    print(json.dumps(measure(args.rounds, args.redis_url), indent=2))


if __name__ == "__main__":
    main()
