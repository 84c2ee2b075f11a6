"""kombu's Redis transport, safe to lose its connection while late-acknowledged calls run.

With ``acks_late``, a call that is running holds an unacknowledged message. When the worker loses
its Redis connection (Redis restarted), Celery tears the connection down and then closes its
channel, and kombu 5.7's channel close tries to put those messages back in the queue through the
torn-down connection: ``AttributeError: 'NoneType' object has no attribute 'hostname'`` in
``Channel._connparams``, which Celery treats as unrecoverable, so the worker exits instead of
reconnecting (seen here with Celery 5.7 / kombu 5.7; the same failure as celery/kombu#970). Even
when it works, putting a message back while its call still runs would deliver the call twice.

This transport changes six things, and nothing else:

- A channel remembers its connection parameters, so the calls still running can acknowledge their
  messages after the reconnect (the acknowledgement removes them from Redis's unacked index).
- When the connection is already gone, closing the channel does not put the messages of running
  calls back in the queue; they stay in the unacked index, and only a message that is never
  acknowledged (its worker died too) comes back, after the visibility timeout, as kombu intends.
- A channel keeps one synchronous ``redis.Redis`` client on its connection pool instead of building
  a new one for every publish, acknowledgement and unacked-index update (kombu 5.7's
  ``Channel.conn_or_acquire``): with redis-py 8 building a client costs more CPU than the command
  it sends (``bench/fixes.md``). The client holds no connection of its own (each command borrows one
  from the pool), so sharing it is safe; a new pool after a reconnect gets a new client.
- A publish batch (kombu's ``Producer.batch``, which toolfleet uses to send a group of calls in one
  round trip) runs as one MULTI/EXEC transaction instead of a plain pipeline: the group's messages
  reach their queues all together or not at all, never a part of them.
- The unacked-index updates (ZADD + HSET when a message is delivered, ZREM + HDEL when it is
  acknowledged) go in one plain pipeline instead of a MULTI/EXEC transaction: still one round trip,
  two commands fewer each (4 of the 10 broker commands a call costs; docs/scaling.md). Nothing
  depends on the pair being atomic: a delivery's message already left its queue (BRPOP) before the
  pair is sent, so a connection lost before it loses the message with or without MULTI; the index
  entry goes first on delivery (an index entry whose message is not stored yet is skipped by
  kombu's restore) and first on acknowledgement (a stored message without its index entry is never
  restored), so another worker's restore never sees half of a pair as a message to put back.

- The BRPOP a worker sends for each message it fetches is packed once per order of its queues,
  not rebuilt and packed each time (:meth:`Channel._brpop_start`).

Selected by the ``broker_transport`` setting of :func:`toolfleet.worker.app.celery_config` when
the broker is Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)
TRANSPORT_CLASS = "toolfleet.worker.transport:Transport"
# packed BRPOP commands kept per channel (one per order of its queues), counted in keys: a worker of
# 10 tool queues keeps all 10 orders (400 keys); one of hundreds of queues keeps a few and repacks
BRPOP_PACKED_MAX_KEYS = 4096


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> None:
        if client is None and getattr(self.channel.connection, "client", None) is None:
            if self._delivered:
                log.warning("broker connection lost with %d message(s) of running calls unacknowledged; "
                            "they stay in Redis's unacked index until acknowledged", len(self._delivered))
            self._delivered.clear()
            return
        super().restore_unacked(client)

    @contextmanager
    def pipe_or_acquire(self, pipe: Any = None, client: Any = None) -> Iterator[Any]:
        """kombu's, with a plain pipeline (``transaction=False``) instead of MULTI/EXEC for the
        unacked-index updates of :meth:`append`, :meth:`ack` and :meth:`reject` (module docstring)."""
        if pipe:
            yield pipe
        else:
            with self.channel.conn_or_acquire(client) as conn:
                yield conn.pipeline(transaction=False)


class PublishBatch(kombu_redis.PublishBatch):
    def __init__(self, channel: Any, max_size: int) -> None:
        super().__init__(channel, max_size)
        self.pipeline = self._stack.enter_context(channel._create_client().pipeline(transaction=True))


class Channel(kombu_redis.Channel):
    QoS = QoS
    _saved_connparams: dict[str, Any] | None = None
    _sync_client: Any = None
    _sync_client_pool: Any = None
    _brpop_packed_on: Any = None  # the connection the packed BRPOP commands were made for
    _brpop_packed: dict[tuple[Any, ...], Any]

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        if self._sync_client is None or self._sync_client_pool is not pool:
            self._sync_client = super()._create_client()
            self._sync_client_pool = pool
        return self._sync_client

    def _brpop_start(self, timeout: Any = None) -> None:
        """kombu's, with the packed BRPOP command kept per queue order: kombu builds the key list
        (every queue times every priority step: 40 keys for 10 tools) and packs it again for each
        message it fetches; the worker's main process spent about 35 us of CPU per message on that
        (bench/fixes.md). The same queues, order, steps, prefix and timeout give the same bytes."""
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        connection = self.client.connection
        if self._brpop_packed_on is not connection:  # a new connection (a reconnect): pack afresh
            self._brpop_packed_on, self._brpop_packed = connection, {}
        cache_key = (tuple(queues), timeout or 0)
        packed = self._brpop_packed.get(cache_key)
        if packed is None:
            keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
            command_args: list[Any] = ["BRPOP", *keys, timeout or 0]
            if self.global_keyprefix:
                command_args = self.client._prefix_args(command_args)
            if (len(self._brpop_packed) + 1) * len(keys) > BRPOP_PACKED_MAX_KEYS:
                self._brpop_packed.clear()
            packed = self._brpop_packed[cache_key] = connection.pack_command(*command_args)
        self._in_poll = connection
        self._brpop_sent_at = monotonic()
        connection.send_packed_command(packed)

    def create_publish_batch(self, max_size: int) -> PublishBatch:
        return PublishBatch(self, max_size)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if getattr(self.connection, "client", None) is None and self._saved_connparams is not None:
            return dict(self._saved_connparams)
        params = super()._connparams(asynchronous=asynchronous)
        if not asynchronous:
            self._saved_connparams = dict(params)
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel
