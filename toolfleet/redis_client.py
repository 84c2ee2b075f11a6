"""Redis clients for toolfleet's own connections (the ledger, the dispatcher's reads, the CLI):
one place that picks a single Redis or a Redis Cluster from the URL and turns redis-py's errors into
toolfleet's (:class:`~toolfleet.errors.BrokerUnavailable`, :class:`~toolfleet.errors.BrokerRefused`).
Celery's own broker connections are kombu's, not these.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from .access import refused
from .errors import BrokerRefused, BrokerUnavailable
from .settings import CLUSTER_SCHEMES

REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError)  # Redis unreachable, not refusing


def connect(url: str) -> redis.Redis:
    """A redis-py client for ``url`` that answers, else :class:`BrokerUnavailable` (or
    :class:`BrokerRefused` when Redis refuses the login). ``redis+cluster://`` /
    ``rediss+cluster://``: a Redis Cluster client (:func:`client_for`)."""
    with translated(url):
        try:
            client = client_for(url, socket_connect_timeout=3, health_check_interval=30)
            client.ping()
        except RedisClusterException as exc:  # no seed node of a cluster answers
            raise BrokerUnavailable(url, str(exc)) from exc
    return client


def client_for(url: str, **options: Any) -> redis.Redis:
    """redis-py's client for ``url``: ``redis.cluster.RedisCluster`` (seeded from the node in the
    URL, the rest found by ``CLUSTER SLOTS``) when the scheme is ``redis+cluster://`` or
    ``rediss+cluster://``, else ``redis.Redis``. ``options``: redis-py connection keywords."""
    if url.startswith(CLUSTER_SCHEMES):
        return RedisCluster.from_url(url.replace("+cluster", "", 1), **options)  # type: ignore[return-value]
    return redis.Redis.from_url(url, **options)


@contextmanager
def translated(url: str) -> Iterator[None]:
    """Turn redis-py's connection errors inside the block into :class:`BrokerUnavailable`, and
    Redis refusing the login or a command (ACL rules) into :class:`BrokerRefused`."""
    try:
        yield
    except (redis.RedisError, OSError) as exc:
        if refused(exc):
            raise BrokerRefused(url, str(exc)) from exc
        if isinstance(exc, REDIS_DOWN):
            raise BrokerUnavailable(url, str(exc)) from exc
        raise
