"""kombu's Redis transport, safe to lose its connection while late-acknowledged calls run.

With ``acks_late``, a call that is running holds an unacknowledged message. When the worker loses
its Redis connection (Redis restarted), Celery tears the connection down and then closes its
channel, and kombu 5.7's channel close tries to put those messages back in the queue through the
torn-down connection: ``AttributeError: 'NoneType' object has no attribute 'hostname'`` in
``Channel._connparams``, which Celery treats as unrecoverable, so the worker exits instead of
reconnecting (seen here with Celery 5.7 / kombu 5.7; the same failure as celery/kombu#970). Even
when it works, putting a message back while its call still runs would deliver the call twice.

This transport changes five things, and nothing else:

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

Selected by the ``broker_transport`` setting of :func:`toolfleet.worker.app.celery_config` when
the broker is Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)
TRANSPORT_CLASS = "toolfleet.worker.transport:Transport"


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

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        if self._sync_client is None or self._sync_client_pool is not pool:
            self._sync_client = super()._create_client()
            self._sync_client_pool = pool
        return self._sync_client

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
