"""Connection and runtime settings, as one value object.

Environment variables are read only here (``Settings.from_env``), called at the edge (CLI, worker
start-up); library code takes a ``Settings`` explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, field_validator

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class Settings(BaseModel):
    """Where the broker and result store live and how a fleet behaves.

    - ``redis_url``: result store, turn ledger and tool catalog (and the broker unless
      ``broker_url`` is set).
    - ``broker_url``: Celery broker; defaults to ``redis_url``.
    - ``namespace``: prefix of every Redis key and queue name toolfleet uses, so several fleets
      (or test runs) share one Redis without seeing each other.
    - ``result_ttl_s``: how long a turn's ledger (results, events) is kept in Redis.
    - ``cancel_grace_s``: after a cancel, how long a running call gets to stop by itself before it
      is killed and reported ``CANCELLED`` by the dispatcher.
    - ``kill_grace_s``: added to a call's time limit to make the hard limit that kills the process.
    - ``heartbeat_s``: how often a worker republishes its tool catalog.
    - ``output_ttl_s``: how long the whole output of a call whose result was cut stays readable
      with ``read_output``.
    """

    model_config = ConfigDict(frozen=True)

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str | None = None
    namespace: str = "toolfleet"
    result_ttl_s: int = 24 * 3600
    cancel_grace_s: float = 0.5
    kill_grace_s: float = 2.0
    heartbeat_s: float = 2.0
    output_ttl_s: int = 24 * 3600

    @field_validator("namespace")
    @classmethod
    def _namespace_chars(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise ValueError("namespace may hold letters, digits, '_', '.', '-' only")
        return value

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``REDIS_URL``, ``TOOLFLEET_BROKER_URL``, ``TOOLFLEET_NAMESPACE``;
        keyword overrides that are not ``None`` win."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        if env.get("REDIS_URL"):
            values["redis_url"] = env["REDIS_URL"]
        if env.get("TOOLFLEET_BROKER_URL"):
            values["broker_url"] = env["TOOLFLEET_BROKER_URL"]
        if env.get("TOOLFLEET_NAMESPACE"):
            values["namespace"] = env["TOOLFLEET_NAMESPACE"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
