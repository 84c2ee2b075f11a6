"""Connection and runtime settings, as one value object.

Environment variables are read only here (``Settings.from_env``), called at the edge (CLI, worker
start-up); library code takes a ``Settings`` explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


class Settings(BaseModel):
    """Where the broker and result store live and how a fleet behaves.

    - ``redis_url``: result store, turn ledger and tool catalog (and the broker unless
      ``broker_url`` is set).
    - ``broker_url``: Celery broker; defaults to ``redis_url``.
    - ``ledger_url``: where the turn ledger and every other key toolfleet keeps (journal, breakers,
      locks, sessions, catalog, audit) live; defaults to ``redis_url``. ``redis+cluster://host:port``
      (or ``rediss+cluster://``) puts them on a Redis Cluster (redis-py's ``RedisCluster``, any node
      as the seed; docs/scaling.md). Celery's broker and result backend stay on ``broker_url`` /
      ``redis_url``: a cluster cannot carry them.
    - ``broker_queue_type``: RabbitMQ broker only: ``"classic"`` (default) or ``"quorum"``: the
      tool queues are declared as quorum queues (replicated over a RabbitMQ cluster, so the broker
      survives a node; Celery's ``task_create_missing_queue_type``; docs/scaling.md). Every worker
      and dispatcher of a namespace must agree (RabbitMQ refuses a queue declared with another type).
    - ``namespace``: prefix of every Redis key and queue name toolfleet uses, so several fleets
      (or test runs) share one Redis without seeing each other.
    - ``result_ttl_s``: how long a turn's ledger (results, events) is kept in Redis.
    - ``cancel_grace_s``: after a cancel, how long a running call gets to stop by itself before it
      is killed and reported ``CANCELLED`` by the dispatcher.
    - ``kill_grace_s``: added to a call's time limit to make the hard limit that kills the process.
    - ``heartbeat_s``: how often a worker republishes its tool catalog; a worker silent for three
      heartbeats is presumed dead (its catalog expires, its journal leases lapse).
    - ``output_ttl_s``: how long the whole output of a call whose result was cut stays readable
      with ``read_output``.
    - ``max_queue_wait_s``: how long a submitted call may wait for a worker to start it before the
      dispatcher gives it ``TOOL_UNAVAILABLE`` (the ledger then keeps it from ever starting).
    - ``max_attempts``: how many times a call whose worker died is started again (reads and
      journaled writes) before it is given ``WORKER_LOST``.
    - ``visibility_timeout_s``: Redis broker only: seconds before an unacknowledged message is handed
      out again. ``None`` derives it from the registry (longest hard time limit + ``max_queue_wait_s``
      + a margin); a value that is not larger than that is refused (:func:`toolfleet.worker.app.
      visibility_timeout_s`), since a shorter one runs a still-running call a second time.
    - ``journal_ttl_s``: how long the idempotency journal remembers an execution.
    - ``require_live_worker``: refuse a call at once (``TOOL_UNAVAILABLE``) when no live worker
      serves its tool; turn off for fleets that scale workers up from zero on queue length.
    - ``breaker_failures`` / ``breaker_cooldown_s``: a tool's circuit opens after that many
      consecutive failures (crashes, time-outs, lost workers) and stays open that long before a
      health check may close it.
    - ``turn_lease_s``: a turn's lease in Redis, renewed by its dispatcher every
      ``turn_lease_s / 6``; when the dispatcher vanishes without ending the turn, the lease lapses
      and workers refuse the turn's calls (a turn that is over leaves nothing that can run later).
      Longer than any Redis outage a live turn should ride out.
    - ``clock_skew_margin_s``: how much the clocks of two processes (or a paused process's idea of
      "now") may disagree, and how long a step may take between an execution's last fencing check
      and its effect: a takeover of a call that might still run waits until its deadline (hard
      time limit) plus this margin has passed (issue "fencing"; docs/guarantees.md).
    - ``lock_lease_s`` / ``lock_wait_s``: resource locks across turns: the lease a turn holds on the
      paths it writes (renewed while it runs, so a dead dispatcher frees them within a lease) and
      how long a turn waits for another turn's lock before its writes get ``TOOL_UNAVAILABLE``.
    - ``sandbox``: what ``run_command`` runs in (docs/sandbox.md): ``"bwrap"`` (default; bubblewrap:
      read-only root, the workspace the only writable place, own PID namespace) or ``"none"``
      (unsandboxed; only when the operator says so, and every result then says it).
    - ``sandbox_network``: ``"none"`` (default; the command has only a loopback of its own) or
      ``"host"`` (the worker's network).
    - ``bwrap_path``: the bubblewrap binary (a name looked up on ``PATH``, or a path).
    """

    model_config = ConfigDict(frozen=True)

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str | None = None
    ledger_url: str | None = None
    broker_queue_type: Literal["classic", "quorum"] = "classic"
    namespace: str = "toolfleet"
    result_ttl_s: int = 24 * 3600
    cancel_grace_s: float = 0.5
    kill_grace_s: float = 2.0
    heartbeat_s: float = 2.0
    output_ttl_s: int = 24 * 3600
    max_queue_wait_s: float = 600.0
    max_attempts: int = 3
    visibility_timeout_s: float | None = None
    journal_ttl_s: int = 7 * 24 * 3600
    require_live_worker: bool = True
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0
    lock_lease_s: float = 30.0
    clock_skew_margin_s: float = 1.0
    lock_wait_s: float = 600.0
    sandbox: Literal["bwrap", "none"] = "bwrap"
    sandbox_network: Literal["host", "none"] = "none"
    bwrap_path: str = "bwrap"
    turn_lease_s: float = 60.0

    @field_validator("heartbeat_s", "max_queue_wait_s", "breaker_cooldown_s", "lock_lease_s", "lock_wait_s",
                     "cancel_grace_s", "kill_grace_s", "turn_lease_s", "clock_skew_margin_s")
    @classmethod
    def _positive_s(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive number of seconds")
        return value

    @field_validator("max_attempts", "breaker_failures", "result_ttl_s", "journal_ttl_s")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("ledger_url")
    @classmethod
    def _ledger_scheme(cls, value: str | None) -> str | None:
        if value and not value.startswith(("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)):
            raise ValueError("must be a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL")
        return value

    @model_validator(mode="after")
    def _quorum_needs_rabbitmq(self) -> Settings:
        if self.broker_queue_type == "quorum" and self.broker_is_redis:
            raise ValueError("broker_queue_type 'quorum' needs a RabbitMQ broker (broker_url amqp://...)")
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace_chars(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise ValueError("namespace may hold letters, digits, '_', '.', '-' only")
        return value

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def ledger(self) -> str:
        """The ledger's Redis URL: ``ledger_url``, else ``redis_url``."""
        return self.ledger_url or self.redis_url

    @property
    def ledger_is_cluster(self) -> bool:
        return self.ledger.startswith(CLUSTER_SCHEMES)

    @property
    def broker_is_redis(self) -> bool:
        return self.broker.startswith(("redis://", "rediss://"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``REDIS_URL``, ``TOOLFLEET_BROKER_URL``, ``TOOLFLEET_LEDGER_URL``,
        ``TOOLFLEET_BROKER_QUEUE_TYPE``, ``TOOLFLEET_NAMESPACE``,
        ``TOOLFLEET_HEARTBEAT_S``, ``TOOLFLEET_TURN_LEASE_S``, ``TOOLFLEET_CLOCK_SKEW_MARGIN_S``,
        ``TOOLFLEET_SANDBOX``, ``TOOLFLEET_SANDBOX_NETWORK``, ``TOOLFLEET_BWRAP``; keyword overrides that are
        not ``None`` win."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        if env.get("REDIS_URL"):
            values["redis_url"] = env["REDIS_URL"]
        if env.get("TOOLFLEET_BROKER_URL"):
            values["broker_url"] = env["TOOLFLEET_BROKER_URL"]
        if env.get("TOOLFLEET_BROKER_QUEUE_TYPE"):
            values["broker_queue_type"] = env["TOOLFLEET_BROKER_QUEUE_TYPE"]
        if env.get("TOOLFLEET_LEDGER_URL"):
            values["ledger_url"] = env["TOOLFLEET_LEDGER_URL"]
        if env.get("TOOLFLEET_NAMESPACE"):
            values["namespace"] = env["TOOLFLEET_NAMESPACE"]
        if env.get("TOOLFLEET_HEARTBEAT_S"):
            values["heartbeat_s"] = float(env["TOOLFLEET_HEARTBEAT_S"])
        for name, field in (("TOOLFLEET_SANDBOX", "sandbox"), ("TOOLFLEET_SANDBOX_NETWORK", "sandbox_network"),
                            ("TOOLFLEET_BWRAP", "bwrap_path")):
            if env.get(name):
                values[field] = env[name]
        if env.get("TOOLFLEET_TURN_LEASE_S"):
            values["turn_lease_s"] = float(env["TOOLFLEET_TURN_LEASE_S"])
        if env.get("TOOLFLEET_CLOCK_SKEW_MARGIN_S"):
            values["clock_skew_margin_s"] = float(env["TOOLFLEET_CLOCK_SKEW_MARGIN_S"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
