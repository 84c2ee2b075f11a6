"""What sending costs the Redis broker: a group of calls goes in one MULTI/EXEC with one
``task.multi`` event message (toolfleet/worker/transport.py ``PublishBatch``, dispatcher/sent_events.py);
a call sent alone is one LPUSH and its ``task-sent`` event, no transaction (its message leaves first,
so the worker can start on it while the event is still being sent)."""

from __future__ import annotations

import json

import redis

from toolfleet import Dispatcher, Settings

from .conftest import FLEET_KEY, make_registry
from .faults import call


def _counts(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("multi", "lpush", "publish")}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


def _queued(client: redis.Redis, namespace: str, tool: str) -> list[dict]:
    keys = [k for k in client.scan_iter(match=f"{namespace}.{tool}*") if client.type(k) == b"list"]
    return [json.loads(body) for key in keys for body in client.lrange(key, 0, -1)]


def test_a_call_sent_alone_needs_no_transaction_and_a_group_gets_one(private_redis, namespace):
    """On a private Redis (its command counts are this test's alone), with no worker (the messages
    stay queued): a turn of one call costs one LPUSH and one PUBLISH (its ``task-sent`` event) and no
    MULTI; a turn of two reads sent together costs one MULTI for both LPUSHes and one PUBLISH for both
    events. Every message is in its queue."""
    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, fleet_key=FLEET_KEY, require_live_worker=False)
    client = redis.Redis.from_url(server.url)
    with Dispatcher(settings, make_registry()) as dispatcher:
        warm = dispatcher.submit([call("w1", "wait_read", label="w")])  # declares the queue (its own MULTIs)
        warm.cancel()
        before = _counts(client)
        alone = dispatcher.submit([call("a1", "wait_read", label="one")])
        sent_alone = _delta(_counts(client), before)
        before = _counts(client)
        pair = dispatcher.submit([call("p1", "wait_read", label="x"), call("p2", "wait_read", label="y")])
        sent_pair = _delta(_counts(client), before)
        queued = _queued(client, namespace, "wait_read")
        alone.cancel()
        pair.cancel()
    assert sent_alone == {"multi": 0, "lpush": 1, "publish": 1}, sent_alone
    assert sent_pair == {"multi": 1, "lpush": 2, "publish": 1}, sent_pair
    assert sorted(m["headers"]["id"] for m in queued) == sorted(
        [f"{warm.turn_id}:w1", f"{alone.turn_id}:a1", f"{pair.turn_id}:p1", f"{pair.turn_id}:p2"])
