"""Redis clients for toolfleet's own connections (the ledger, the dispatcher's reads, the CLI):
one place that picks a single Redis or a Redis Cluster from the URL and turns redis-py's errors into
toolfleet's (:class:`~toolfleet.errors.BrokerUnavailable`, :class:`~toolfleet.errors.BrokerRefused`).
Celery's own broker connections are kombu's, not these.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)

from .access import refused
from .errors import BrokerBusy, BrokerRefused, BrokerUnavailable
from .settings import CLUSTER_SCHEMES

REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, OSError)  # Redis unreachable, not refusing
# Redis answering but refusing for a while, by its error replies (redis-py's classes for OOM,
# READONLY, CLUSTERDOWN / MASTERDOWN, TRYAGAIN; LOADING is redis-py's BusyLoadingError, a
# ConnectionError already): https://redis.io/docs/latest/develop/reference/protocol-spec/#simple-errors
REDIS_BUSY = (OutOfMemoryError, ReadOnlyError, ClusterDownError, TryAgainError)
BUSY_CODES = ("OOM", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY", "MISCONF", "NOREPLICAS")
# the codes redis-py has no class for (BUSY, MISCONF, NOREPLICAS) stay at the start of a plain ResponseError
BUSY_REPLIES = tuple(f"{code} " for code in BUSY_CODES)
# Redis 6 wraps a refusal inside a script: "Error running script (call to f_...): @user_script:1:
# @user_script: 1: -OOM command not allowed ..." (Redis 7 passes the code through as it is)
IN_SCRIPT = re.compile(r"@user_script: ?\d+: -(" + "|".join(BUSY_CODES) + ") ")


def busy(exc: BaseException) -> bool:
    """``exc`` is Redis answering but refusing every write for a while: out of memory at
    ``maxmemory`` with nothing it may evict (``OOM``), a replica that was the master before a
    failover (``READONLY``), a cluster without a master for a slot (``CLUSTERDOWN``,
    ``MASTERDOWN``, ``TRYAGAIN``), a script holding the server (``BUSY``), a failed snapshot that
    stops writes (``MISCONF``), too few replicas (``NOREPLICAS``). Like an outage, it ends by
    itself or by an operator; unlike an ACL refusal (:func:`toolfleet.access.refused`), waiting
    helps."""
    if isinstance(exc, REDIS_BUSY):
        return True
    if not isinstance(exc, redis.ResponseError):
        return False
    text = str(exc)
    return text.startswith(BUSY_REPLIES) or IN_SCRIPT.search(text) is not None


def read_only(exc: BaseException) -> bool:
    """``exc`` is a ``READONLY`` reply (this Redis is a replica now), also inside a script on Redis 6."""
    if isinstance(exc, ReadOnlyError):
        return True
    wrapped = IN_SCRIPT.search(str(exc)) if isinstance(exc, redis.ResponseError) else None
    return wrapped is not None and wrapped.group(1) == "READONLY"


def unavailable(exc: BaseException) -> bool:
    """``exc`` is Redis unreachable (:data:`REDIS_DOWN`) or refusing for a while (:func:`busy`):
    the errors a step may be retried on, within its budget."""
    return isinstance(exc, REDIS_DOWN) or busy(exc)


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
    """Turn redis-py's connection errors inside the block into :class:`BrokerUnavailable`, Redis
    refusing writes for a while (:func:`busy`) into :class:`BrokerBusy`, and Redis refusing the
    login or a command (ACL rules) into :class:`BrokerRefused`."""
    try:
        yield
    except (redis.RedisError, OSError) as exc:
        raise as_broker_error(url, exc) from exc


def as_broker_error(url: str, exc: BaseException) -> BaseException:
    """toolfleet's error for redis-py's ``exc`` on ``url`` (:func:`translated`), or ``exc`` itself
    when it is none of those (a script's bug, a wrong key type: not the environment)."""
    if refused(exc):
        return BrokerRefused(url, str(exc))
    if busy(exc):
        return BrokerBusy(url, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, REDIS_DOWN):
        return BrokerUnavailable(url, str(exc))
    return exc
