"""The Celery app Flower (and any read-only monitor) runs with: ``celery -A toolfleet.monitor flower``.

Built from the environment (``REDIS_URL``, ``TOOLFLEET_BROKER_URL``, ``TOOLFLEET_REDIS_CA_FILE``...:
:meth:`toolfleet.settings.Settings.from_env`), so Flower logs in as its own ACL user and speaks TLS
to a ``rediss://`` Redis exactly as workers do: its broker connection, its result backend and its
queue-length view (which reads ``broker_use_ssl``) all get the same TLS options
(:mod:`toolfleet.redis_tls`). It serves no tasks. ``toolfleet up`` and docker-compose.yml start Flower
with it; the rules of Flower's ACL user are in docs/deploying.md.
"""

from __future__ import annotations

from celery import Celery

from .redis_tls import password_in_userinfo, ssl_options
from .settings import Settings
from .worker.app import control_exchange, event_exchange, unacked_keys


def monitor_app(settings: Settings) -> Celery:
    """A Celery app that only watches the fleet of ``settings`` (JSON events, TLS, no tasks)."""
    app = Celery(f"toolfleet-{settings.namespace}", broker=settings.broker,
                 backend=password_in_userinfo(settings.redis_url))  # masked where Celery shows it
    app.conf.update(
        accept_content=["json"],
        result_accept_content=["json"],
        event_serializer="json",
        event_exchange=event_exchange(settings.namespace),  # the namespace's events only
        control_exchange=control_exchange(settings.namespace),  # and its workers for inspect
        task_default_queue=f"{settings.namespace}.default",
        broker_connection_retry_on_startup=True,
        # the namespace's unacked keys, as workers use them (kombu's defaults are outside the
        # namespace, where Flower's ACL user may not write)
        broker_transport_options=unacked_keys(settings.namespace) if settings.broker_is_redis else {},
        broker_use_ssl=ssl_options(settings.broker) if settings.broker_is_redis else None,
        redis_backend_use_ssl=ssl_options(settings.redis_url),
    )
    return app


app = monitor_app(Settings.from_env())
