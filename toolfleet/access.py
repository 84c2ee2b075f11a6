"""Redis refusing a process: telling it apart from Redis being down, and checking a worker's rights
at start-up.

With Redis ACL users (docs/deploying.md), Redis may answer and still say no: ``WRONGPASS`` (wrong
user or password), ``NOPERM`` (a command, key or channel the user's rules do not allow), or, for a
command inside a Lua script, "can't run this command". Those are not outages: retrying does not
help, so they become :class:`~toolfleet.errors.BrokerRefused` at once, with Redis's reason.

:func:`check_worker_access` runs before a worker starts consuming: without it, a worker whose
user lacks a right would start, print a traceback from inside Celery and serve nothing.
"""

from __future__ import annotations

import uuid

import redis

from .errors import BrokerRefused
from .keys import Keys
from .settings import Settings

REDIS_REFUSED = (redis.AuthenticationError, redis.exceptions.NoPermissionError)
SCRIPT_REFUSED = "can't run this command"  # a command inside a Lua script refused by the ACL (Redis 7)
KOMBU_BINDINGS = "_kombu.binding_deadlines"  # one of kombu's keys every Redis-broker worker writes


def refused(exc: BaseException) -> bool:
    """``exc`` is Redis refusing the login or a command (not Redis being unreachable)."""
    return isinstance(exc, REDIS_REFUSED) or (isinstance(exc, redis.ResponseError) and SCRIPT_REFUSED in str(exc))


def check_worker_access(client: redis.Redis, settings: Settings) -> None:
    """Try what a worker does first, harmlessly: write and delete a key of the namespace, read a
    queue, kombu's bindings and a control (pidbox) queue, take and drop a pattern subscription to
    the namespace's cancels, and (broker and ledger on one Redis) subscribe to the channels of the
    namespace's own Celery exchanges: task events ``/<db>.<ns>.celeryev/*`` and control broadcasts
    ``/<db>.<ns>.celery.pidbox`` (Redis's ACL grants a channel to publish and subscribe alike, so
    this tries the right to publish without sending anything; docs/deploying.md). Raises
    :class:`BrokerRefused` (URL with the password masked, Redis's reason, and the channel refused)
    when Redis refuses one; other Redis errors pass through. Rights it cannot try without side
    effects (writing kombu's keys) are found by Celery when it starts."""
    keys = Keys(settings.namespace)
    probe = f"{settings.namespace}:access-check:{uuid.uuid4().hex}"
    try:
        pipe = client.pipeline(transaction=True)
        pipe.set(probe, "1", px=10_000)
        pipe.delete(probe)
        pipe.execute()
        client.llen(keys.queue("default"))
        if settings.broker_is_redis and settings.broker == settings.redis_url:
            client.exists(KOMBU_BINDINGS, f"access-check-{uuid.uuid4().hex}.{settings.namespace}.celery.pidbox")
        pubsub = client.pubsub()
        try:
            pubsub.psubscribe(keys.cancel_pattern)
            pubsub.get_message(timeout=1.0)
        finally:
            pubsub.close()
        if settings.broker_is_redis and settings.broker == settings.redis_url:
            db = client.connection_pool.connection_kwargs.get("db", 0)
            for channel in celery_channels(settings.namespace, db):
                pubsub = client.pubsub()
                try:
                    pubsub.subscribe(channel)
                    pubsub.get_message(timeout=1.0)
                except redis.RedisError as exc:
                    if refused(exc):
                        raise BrokerRefused(settings.redis_url, f"{exc} (channel {channel}: docs/deploying.md, "
                                                                "the namespace's own Celery exchanges)") from exc
                    raise
                finally:
                    pubsub.close()
    except redis.RedisError as exc:
        if refused(exc):
            raise BrokerRefused(settings.redis_url, str(exc)) from exc
        raise


def celery_channels(namespace: str, db: int) -> tuple[str, str]:
    """The Redis channels kombu publishes a namespace's task events and control broadcasts on
    (its fanout ``/<db>.<exchange>/<routing key>``): one task event's, and the control mailbox's."""
    from .worker.app import control_exchange, event_exchange  # the app module imports Celery
    return f"/{db}.{event_exchange(namespace)}/task.started", f"/{db}.{control_exchange(namespace)}.pidbox"
