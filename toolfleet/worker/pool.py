"""The prefork pool of a toolfleet worker: Celery's, noticing dead pool processes sooner.

Celery's prefork pool learns that a pool process died (SIGKILL, out-of-memory killer) when its
``maintain_pool`` timer runs, every 5 s in Celery 5.7: measured here, a killed process was reported
4.5 s late, after the hard time limit of a short call had already fired, so the call was reported
``TIMEOUT`` instead of being redelivered. This pool runs the same check every
``MAINTAIN_POOL_S``; the check only looks at the pool's own process table.

Selected by the ``worker_pool`` setting of :func:`toolfleet.worker.app.celery_config` (Celery's
``--pool=prefork``, its default, then takes it).
"""

from __future__ import annotations

from typing import Any

from celery.concurrency.asynpool import AsynPool
from celery.concurrency.prefork import TaskPool as PreforkTaskPool

MAINTAIN_POOL_S = 0.5
POOL_CLASS = "toolfleet.worker.pool:TaskPool"


class _SoonerMaintainedPool(AsynPool):
    @property
    def timers(self) -> dict[Any, float]:
        return {self.maintain_pool: MAINTAIN_POOL_S}


class TaskPool(PreforkTaskPool):
    """Celery's prefork ``TaskPool`` with :data:`MAINTAIN_POOL_S` pool maintenance."""

    Pool = _SoonerMaintainedPool
