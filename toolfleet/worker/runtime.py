"""What a worker process holds: settings, registry, policy, and per-process Redis connections."""

from __future__ import annotations

import json
import os

import redis

from .. import forksafe
from ..breaker import Breakers
from ..interrupt_safe import make_interrupt_safe
from ..keys import Keys
from ..ledger import Ledger
from ..policy.config import Policy
from ..policy.rules import RuleStore
from ..redis_client import client_for
from ..settings import Settings
from ..tools.registry import Registry
from ..tools.stored_output import OutputStore
from .cancel_watch import CancelWatcher
from .journal import Journal

REDIS_RETRY_S = 30.0  # how long a worker keeps trying to record a result while Redis is away
# a read of the ledger client of the worker's main process that takes longer fails (a frozen Redis:
# worker/main_steps.py), whatever redis-py's default (5 s since redis-py 8, none before)
MAIN_SOCKET_TIMEOUT_S = 5.0


class Runtime:
    """Shared by the Celery app's task and signal handlers. Connections are made lazily and anew
    in each process, because a Redis socket must not be shared across ``fork``."""

    def __init__(self, settings: Settings, registry: Registry, policy: Policy | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.policy = policy if policy is not None else Policy.permissive()
        self.keys = Keys(settings.namespace)
        self._lock = forksafe.lock()  # held by the main process's threads too: unlocked in each pool process
        self._pid: int | None = None
        self._ledger: Ledger | None = None
        self._journal: Journal
        self._breakers: Breakers
        self.watcher = CancelWatcher(self.keys, self._new_client, settings.cancel_grace_s)
        self._home_pid = os.getpid()  # the worker's main process: the pool processes are forked later

    def _new_client(self, **options: float) -> redis.Redis:
        return client_for(self.settings.ledger, socket_connect_timeout=3, **options)

    @property
    def ledger(self) -> Ledger:
        with self._lock:
            if self._ledger is None or self._pid != os.getpid():
                # interrupt-safe: soft time limits and cancels raise in this process's main thread
                # mid-command (toolfleet/interrupt_safe.py); the cancel watcher's pub/sub client is its own
                main = {"socket_timeout": MAIN_SOCKET_TIMEOUT_S} if os.getpid() == self._home_pid else {}
                client = make_interrupt_safe(self._new_client(**main))
                self._ledger = Ledger(self.settings, client=client, retry_s=REDIS_RETRY_S)
                self._journal = Journal(self.settings, client, self._ledger.retrying)
                self._breakers = Breakers(self.settings, client)
                self._pid = os.getpid()
            return self._ledger

    @property
    def rules(self) -> RuleStore:
        """Remembered approval rules (read when the policy would ask)."""
        return RuleStore(self.ledger.redis, self.keys, self.settings.redis_url)

    @property
    def outputs(self) -> OutputStore:
        """Where whole outputs of cut results are kept for ``read_output``."""
        return OutputStore(self.ledger.redis, self.keys, self.settings.output_ttl_s)

    def approvals_decision(self, turn_id: str, call_id: str) -> str | None:
        """``approved``, ``denied`` or ``None``: a person's decision on a held call."""
        raw = self.ledger.redis.hget(self.keys.turn_decisions(turn_id), call_id)
        return None if raw is None else json.loads(raw).get("decision")

    @property
    def journal(self) -> Journal:
        """The idempotency journal of this process (same connection as the ledger)."""
        self.ledger  # noqa: B018 - makes the per-process connection
        return self._journal

    @property
    def breakers(self) -> Breakers:
        """The circuit breakers, for reporting how calls went."""
        self.ledger  # noqa: B018 - makes the per-process connection
        return self._breakers
