"""The commands the Redis broker sees (toolfleet/worker/transport.py).

Sending: a group of calls goes in one MULTI/EXEC with one ``task.multi`` event message
(``PublishBatch``, dispatcher/sent_events.py); a call sent alone is one LPUSH and its ``task-sent``
event, no transaction (its message leaves first, so a worker can start on it while the event is
still being sent). Fetching: the BRPOP kombu would send, packed once per order of the queues."""

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


def _brpops(channel, start, fetches: int) -> list[bytes]:
    """The bytes ``start`` (a ``_brpop_start``) sends on ``channel``'s connection, ``fetches`` times,
    the queue that BRPOP names first moved last after each (kombu's round robin, on a delivery)."""
    sent: list[bytes] = []
    if channel.client.connection is None:  # kombu's poller gets it when it registers the channel
        channel.client.connection = channel.client.connection_pool.get_connection()
    connection = channel.client.connection
    pack = connection.pack_command

    def counted(*args):
        channel.packs = getattr(channel, "packs", 0) + 1
        return pack(*args)

    connection.pack_command = counted
    connection.send_packed_command = lambda packed, check_health=True: sent.append(b"".join(packed))
    connection.send_command = lambda *args, **kw: sent.append(b"".join(connection.pack_command(*args)))
    for _ in range(fetches):
        start(channel)
        channel._in_poll = None
        channel._queue_cycle.rotate(channel._queue_cycle.consume(1)[0])  # as a message from it would
    return sent


def test_the_kept_brpop_is_the_one_kombu_would_send(redis_url, namespace):
    """The worker's transport packs each BRPOP once per order of its queues: over a full rotation of
    three queues (two turns of it), it sends exactly the bytes kombu's own ``_brpop_start`` sends for
    the same queues, priority steps and key prefix, packing each order once; a new connection gets
    a fresh pack."""
    from kombu import Connection, Consumer, Queue
    from kombu.transport import redis as kombu_redis

    from toolfleet.worker.transport import Channel, Transport

    queues = [Queue(f"{namespace}.q{i}") for i in range(3)]
    sent = {}
    for name, start in (("ours", Channel._brpop_start), ("kombu", kombu_redis.Channel._brpop_start)):
        with Connection(redis_url, transport=Transport,
                        transport_options={"global_keyprefix": f"{namespace}:"}) as conn:
            channel = conn.channel()
            Consumer(channel, queues, accept=["json"]).consume()
            sent[name] = _brpops(channel, start, 6)
            if name == "ours":
                assert channel.packs == 3  # once per order of the three queues, not once per fetch
                first = channel._brpop_packed_on
                channel.client.connection = channel.client.connection_pool.get_connection()
                sent["ours"] += _brpops(channel, start, 1)
                assert channel._brpop_packed_on is not first and len(channel._brpop_packed) == 1
    assert len(set(sent["kombu"])) == 3  # three orders of the queues, each sent twice
    assert sent["ours"][:6] == sent["kombu"], (sent["ours"][:6], sent["kombu"])
    assert sent["ours"][6] == sent["kombu"][0]  # the rotation goes on from where it was: 6 mod 3 = 0
    assert f"{namespace}:{namespace}.q0".encode() in sent["ours"][0]


def test_one_event_dispatcher_per_app_and_it_goes_with_the_app(redis_url, namespace):
    """The ``task-sent`` events of every group an app sends share one disabled Celery event
    dispatcher (building one opens a broker Connection object), kept on the app: an app no longer
    used is collected with it (a cache beside the app would keep it alive: the dispatcher holds it)."""
    import gc
    import weakref

    from celery import Celery

    from toolfleet.dispatcher.sent_events import SentEvents

    app = Celery(f"{namespace}-events", broker=redis_url)
    first, second = SentEvents(app), SentEvents(app)
    assert first.dispatcher is second.dispatcher and first.dispatcher.app is app
    assert SentEvents(Celery(f"{namespace}-other", broker=redis_url)).dispatcher is not first.dispatcher
    gone = weakref.ref(app)
    del app, first, second
    gc.collect()
    assert gone() is None
