"""What a worker process holds: settings, registry, and per-process Redis connections."""

from __future__ import annotations

import os
import threading

import redis

from ..keys import Keys
from ..ledger import Ledger
from ..settings import Settings
from ..tools.registry import Registry
from .cancel_watch import CancelWatcher


class Runtime:
    """Shared by the Celery app's task and signal handlers. Connections are made lazily and anew
    in each process, because a Redis socket must not be shared across ``fork``."""

    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.keys = Keys(settings.namespace)
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._ledger: Ledger | None = None
        self.watcher = CancelWatcher(self.keys, self._new_client, settings.cancel_grace_s)

    def _new_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, socket_connect_timeout=3)

    @property
    def ledger(self) -> Ledger:
        with self._lock:
            if self._ledger is None or self._pid != os.getpid():
                self._ledger = Ledger(self.settings, client=self._new_client())
                self._pid = os.getpid()
            return self._ledger
