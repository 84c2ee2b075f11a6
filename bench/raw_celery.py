"""The raw Celery baseline: a plain Celery app on the same Redis, its own queue, the same no-op body,
and a sleep task (``bench.raw.sleep``) for the plan efficiency section's canvas (:mod:`bench.plan_raw`).

Celery's defaults (JSON, default prefetch, no task events), only the broker, result backend and
queue set. With ``like_toolfleet``, the same app takes every Celery setting toolfleet's workers and
dispatchers run with (``toolfleet.worker.app.celery_config``: task events, published in batches;
no prefetch; late acknowledgement; toolfleet's kombu transport; messages sent with the priority of
a call no other call waits for), all but the default queue, so the benchmark can tell what those
settings cost from what toolfleet's own path costs. With ``claim`` as well, the task sends one
claim before its body (:data:`CLAIM_SCRIPT`: one round trip to a Lua script of the shape of
toolfleet's claim, without its checks' Python): the floor of any Celery runtime that fences each
call before running it (toolfleet's reason for that round trip: docs/design.md, fencing), so the
report can tell what the claim's round trip costs from what the rest of toolfleet's path costs.
Start a worker with ``python -m bench.raw_celery <redis_url> <namespace> <concurrency>
[like-toolfleet | like-toolfleet-claim]``; once it consumes it pushes its name on
``<namespace>:workers:ready`` (like toolfleet workers).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready

from toolfleet import Settings
from toolfleet.dispatcher.submit import priority_of
from toolfleet.worker.app import celery_config
from toolfleet.worker.events import BatchedTaskEvents

from .tools import noop_body

NOOP = "bench.raw.noop"
SLEEP = "bench.raw.sleep"
# A claim of toolfleet's shape (toolfleet/ledger_scripts.py CLAIM): the turn's flags read, a fencing
# token taken, the start recorded, a started event on the turn's stream; returns the token, or 0
# when the turn is cancelled or ended. KEYS: flags hash, runs hash, events stream; ARGV: call id, now.
CLAIM_SCRIPT = """
local flags = redis.call('HMGET', KEYS[1], 'cancelled', 'ended')
if flags[1] or flags[2] then return 0 end
local token = redis.call('HINCRBY', KEYS[2], 'fence:' .. ARGV[1], 1)
redis.call('HSET', KEYS[2], 'start:' .. ARGV[1], ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'call', ARGV[1], 'state', 'started')
return token
"""


def make_app(redis_url: str, namespace: str, like_toolfleet: bool = False, claim: bool = False) -> Celery:
    """The raw app; ``claim``: its task claims each call first (:data:`CLAIM_SCRIPT`)."""
    app = Celery(f"raw-{namespace}", broker=redis_url, backend=redis_url)
    app.conf.update(
        task_default_queue=f"{namespace}.raw",
        broker_connection_retry_on_startup=True,
        result_expires=600,  # the benchmark's results need not outlive it
        worker_hijack_root_logger=False,
    )
    if like_toolfleet:
        config = celery_config(Settings(redis_url=redis_url, namespace=namespace))
        app.conf.update({k: v for k, v in config.items() if k != "task_default_queue"})
        app.conf.task_default_priority = priority_of(1, redis_url)
        app.steps["consumer"].add(BatchedTaskEvents)

    claims: dict[int, Any] = {}  # the claim script's client, one per pool process (made after the fork)
    keys = [f"{namespace}:flags", f"{namespace}:runs", f"{namespace}:events"]

    @app.task(name=NOOP, bind=True)
    def noop(self: Any) -> str:
        if claim:
            script = claims.get(os.getpid())
            if script is None:
                script = claims[os.getpid()] = redis.Redis.from_url(redis_url).register_script(CLAIM_SCRIPT)
            if not script(keys=keys, args=[self.request.id, "0"]):
                return "not claimed"
        return noop_body()

    @app.task(name=SLEEP)
    def sleep(seconds: float, label: str = "") -> str:
        """The body of ``sleep_read`` / ``sleep_write`` (bench/tools.py) without toolfleet: the plan
        efficiency section's raw Celery side."""
        time.sleep(seconds)
        return label

    @worker_ready.connect(weak=False)
    def _ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            redis.Redis.from_url(redis_url).rpush(ready_key(namespace), sender.hostname)

    return app


def ready_key(namespace: str) -> str:
    return f"{namespace}:workers:ready"


def main(argv: list[str]) -> None:
    redis_url, namespace, concurrency = argv[0], argv[1], int(argv[2])
    variant = argv[3] if len(argv) > 3 else ""
    app = make_app(redis_url, namespace, like_toolfleet=variant.startswith("like-toolfleet"),
                   claim=variant == "like-toolfleet-claim")
    app.worker_main(["worker", "--pool=prefork", f"--concurrency={concurrency}", f"--queues={namespace}.raw",
                     "--loglevel=WARNING", "--without-mingle", "--without-gossip", f"--hostname=raw@{namespace}"])


if __name__ == "__main__":
    main(sys.argv[1:])
