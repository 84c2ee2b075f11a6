"""The tests' local Redis Cluster of three masters: :mod:`bench.cluster`, which the benchmark uses too
(it may not import from ``tests/``). Runnable by hand as before::

    python -m tests.redis_cluster DIR     # prints redis+cluster://127.0.0.1:PORT, runs until Ctrl-C / SIGTERM
    TOOLFLEET_TEST_LEDGER_URL=redis+cluster://127.0.0.1:PORT pytest tests/test_turn.py
"""

from __future__ import annotations

from bench.cluster import LocalCluster, binaries, main

__all__ = ["LocalCluster", "binaries", "main"]

if __name__ == "__main__":
    main()
