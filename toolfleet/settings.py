"""Connection and runtime settings, as one value object.

Environment variables are read only here (``Settings.from_env``), called at the edge (CLI, worker
start-up); library code takes a ``Settings`` explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .defaults import DEFAULT_MAX_PROCESSES, DEFAULT_REDIS_URL, MIN_MAX_PROCESSES, default_namespace
from .redis_tls import TLS_QUERY, ssl_options, with_login, with_tls
from .signing import MIN_KEY_CHARS, FleetKeys, read_key_file

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")

__all__ = ["DEFAULT_REDIS_URL", "Settings", "default_namespace"]


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
      (or test runs) share one Redis without seeing each other. Default ``toolfleet-<user>``
      (:func:`toolfleet.defaults.default_namespace`: per user, so two users of one Redis do not
      share queues; issue 15 point 12).
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
      paths it writes (renewed while it runs, so a dead dispatcher frees them within a lease; while
      some of the turn's writes are in flight the lease is this + ``turn_lease_s`` + the longest
      hard limit among them + ``clock_skew_margin_s``, so it outlasts every write the dispatcher
      sent: ``dispatcher.locks.lease_s``, ``dispatcher.turn_locks``)
      and how long a turn waits for another turn's lock before its writes get ``TOOL_UNAVAILABLE``.
    - ``sandbox``: what ``run_command`` runs in (docs/sandbox.md): ``"bwrap"`` (default; bubblewrap:
      read-only root, the workspace the only writable place, own PID namespace) or ``"none"``
      (unsandboxed; only when the operator says so, and every result then says it).
    - ``sandbox_network``: ``"none"`` (default; the command has only a loopback of its own) or
      ``"host"`` (the worker's network).
    - ``bwrap_path``: the bubblewrap binary (a name looked up on ``PATH``, or a path).
    - ``sandbox_max_processes``: tasks (processes and threads) one sandbox may have at once, for
      ``run_command`` and each live ``shell`` alike (default 512; 0: no limit; else at least 16, the
      sandbox's own processes count), kept by the kernel:
      a cgroup per sandbox, or ``RLIMIT_NPROC`` in its user namespace (docs/sandbox.md, Processes).
    - ``sandbox_cgroup``: where those cgroups are made: ``"auto"`` (default: under the worker's own
      cgroup, ``pids`` controller), a directory of a delegated cgroup, or ``"off"``.
    - ``redis_ca_file`` / ``redis_cert_file`` / ``redis_key_file`` / ``redis_cert_reqs``: TLS to a
      ``rediss://`` Redis (CA bundle, client certificate and key: PEM paths; ``required`` (default),
      ``optional`` or ``none``). They are written into ``redis_url`` and ``broker_url`` as the query
      parameters every Redis client reads (:mod:`toolfleet.redis_tls`); a URL's own parameters win.
      ACL users go in the URL: ``rediss://user:password@host:6380/0`` (docs/deploying.md).
    - ``fleet_key`` / ``fleet_keys_previous``: the fleet key the dispatcher signs call messages
      with (HMAC-SHA256, at least 32 characters), and older keys workers still accept during a
      rotation (docs/signing.md). Secret: ``repr`` and dumps show ``**********``.
    - ``insecure_no_signing``: no key, on purpose: the dispatcher sends unsigned messages and
      workers run any message that reaches their queues. Without a key and without this, a
      dispatcher or worker refuses to start (:meth:`require_signing`).
    - ``task_sent_events``: the dispatcher publishes a ``task-sent`` event per call (Celery's
      ``task_send_sent_event``), so Flower lists calls still waiting in a queue; its cost is measured
      in bench/ ("sent events", bench/results/report.md), which chose the default.
    """

    # errors never quote a value: a Redis URL holds a password
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str | None = None
    ledger_url: str | None = None
    broker_queue_type: Literal["classic", "quorum"] = "classic"
    namespace: str = Field(default_factory=default_namespace)
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
    sandbox_max_processes: int = Field(default=DEFAULT_MAX_PROCESSES, ge=0)
    sandbox_cgroup: str = "auto"
    turn_lease_s: float = 60.0
    redis_ca_file: str | None = None
    redis_cert_file: str | None = None
    redis_key_file: str | None = None
    redis_cert_reqs: Literal["required", "optional", "none"] = "required"

    @model_validator(mode="before")
    @classmethod
    def _tls_into_urls(cls, data: object) -> object:
        """``rediss://`` URLs carry the TLS options (:func:`toolfleet.redis_tls.with_tls`)."""
        if not isinstance(data, dict):
            return data
        options = {field: data.get(field) for field in TLS_QUERY}
        return {**data, **{name: with_tls(data[name], options) for name in ("redis_url", "broker_url")
                           if isinstance(data.get(name), str)}}

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _tls_options_known(cls, value: str | None) -> str | None:
        ssl_options(value)  # ValueError for an ssl_cert_reqs that is not required/optional/none
        return value

    @field_validator("redis_url", "broker_url", "ledger_url")
    @classmethod
    def _url_readable(cls, value: str | None) -> str | None:
        """A URL whose host and port cannot be read (a password holding ``#``, ``?`` or ``/``
        unencoded cuts it there: redis-py then raised ``ValueError`` quoting the password's start
        as "the port", which the CLI printed): refused here, where the message quotes nothing of it."""
        if value and not value.startswith("unix://"):
            from urllib.parse import urlsplit

            seeds = value.split(",") if value.startswith(CLUSTER_SCHEMES) else [value]  # host:port,host:port
            try:
                parts = [urlsplit(seed if "://" in seed else f"redis://{seed}") for seed in seeds]
                readable = all(p.hostname and (p.port or True) for p in parts)  # .port raises when not a number
            except ValueError:  # .port: not a number
                readable = False
            if not readable:
                raise ValueError("cannot be read as a URL: no host, or a port that is not a number. A password "
                                 "holding '#', '?', '/' or '@' must be percent-encoded (%23, %3F, %2F, %40)")
        return value

    fleet_key: SecretStr | None = None
    fleet_keys_previous: tuple[SecretStr, ...] = ()
    insecure_no_signing: bool = False

    @field_validator("fleet_key", "fleet_keys_previous")
    @classmethod
    def _key_length(cls, value: SecretStr | tuple[SecretStr, ...] | None) -> object:
        for key in (value if isinstance(value, tuple) else (value,)):
            if key is not None and len(key.get_secret_value().strip()) < MIN_KEY_CHARS:
                raise ValueError(f"a fleet key must have at least {MIN_KEY_CHARS} characters "
                                 "(`toolfleet keygen` makes one)")
        return value

    def __repr_args__(self) -> Iterator[tuple[str | None, object]]:
        """``repr`` (and ``str``) show each URL with its password masked (``redis://:**@host``,
        ``?password=**``), as the keys show ``**********``: a settings object gets logged, quoted by
        a test's assertion, captured with an error tracker's frame locals."""
        from .errors import shown_url_with_query

        for name, value in super().__repr_args__():
            shown = isinstance(name, str) and name.endswith("_url") and isinstance(value, str)
            yield name, shown_url_with_query(value) if shown else value

    @property
    def fleet_keys(self) -> FleetKeys | None:
        """The keys to sign with and accept, or ``None`` when no key is set."""
        if self.fleet_key is None:
            return None
        return FleetKeys.of(self.fleet_key.get_secret_value(),
                            [k.get_secret_value() for k in self.fleet_keys_previous])

    def require_signing(self, who: str) -> FleetKeys | None:
        """The fleet keys; ``None`` only with ``insecure_no_signing``. Raises
        :class:`~toolfleet.errors.ConfigurationError` naming what to set when there is no key."""
        from .errors import ConfigurationError

        keys = self.fleet_keys
        if keys is None and not self.insecure_no_signing:
            raise ConfigurationError(
                f"no fleet key: this {who} needs the key the fleet signs every call message with (a dispatcher "
                "signs, a worker checks). Set TOOLFLEET_FLEET_KEY (or TOOLFLEET_FLEET_KEY_FILE; `toolfleet keygen` "
                "makes a key). The toolfleet commands find the key of the local stack of `toolfleet up` while "
                "it runs (none runs here? start it: `toolfleet up -d`); in Python, build the settings with "
                "Settings.from_env(toolfleet.stack.with_local_fleet_key()), which finds it. Or run without "
                "signing on purpose (TOOLFLEET_INSECURE_NO_SIGNING=1, `toolfleet worker --insecure-no-signing`, "
                "Settings(insecure_no_signing=True)); see docs/signing.md")
        return keys

    task_sent_events: bool = True

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

    @field_validator("sandbox_max_processes")
    @classmethod
    def _fits_a_sandbox(cls, value: int) -> int:
        if 0 < value < MIN_MAX_PROCESSES:
            raise ValueError(f"must be 0 (no limit) or at least {MIN_MAX_PROCESSES}: the sandbox's own processes "
                             "(the deadline's timeout, bwrap and its init, the shell) count against it")
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

    def secret_values(self) -> tuple[str, ...]:
        """The secrets these settings hold, as text: the fleet keys, and the passwords of the Redis,
        ledger and broker URLs (masked wherever a shown text holds them: :mod:`toolfleet.tools.redact`)."""
        from urllib.parse import parse_qsl, unquote, urlsplit

        found = [k.get_secret_value() for k in (self.fleet_key, *self.fleet_keys_previous) if k is not None]
        for url in (self.redis_url, self.broker, self.ledger):
            try:
                parts = urlsplit(url)
                password = parts.password
            except ValueError:
                continue
            if password:
                found.append(unquote(password))
            # redis-py also takes the password as a query parameter: redis://host/0?password=...
            found += [value for name, value in parse_qsl(parts.query) if name == "password" and value]
        return tuple(dict.fromkeys(found))

    @property
    def broker_is_redis(self) -> bool:
        return self.broker.startswith(("redis://", "rediss://"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``REDIS_URL``, ``TOOLFLEET_BROKER_URL``, ``TOOLFLEET_LEDGER_URL``,
        ``TOOLFLEET_BROKER_QUEUE_TYPE``, ``TOOLFLEET_NAMESPACE``,
        ``TOOLFLEET_HEARTBEAT_S``, ``TOOLFLEET_TURN_LEASE_S``, ``TOOLFLEET_CLOCK_SKEW_MARGIN_S``,
        ``TOOLFLEET_SANDBOX``, ``TOOLFLEET_SANDBOX_NETWORK``, ``TOOLFLEET_BWRAP``, ``TOOLFLEET_TASK_SENT_EVENTS``
        (``0``/``false``/``no``/``off`` turn it off), ``TOOLFLEET_REDIS_CA_FILE``,
        ``TOOLFLEET_REDIS_CERT_FILE``, ``TOOLFLEET_REDIS_KEY_FILE``, ``TOOLFLEET_REDIS_CERT_REQS``; keyword
        overrides that are not ``None`` win. ``TOOLFLEET_REDIS_PASSWORD_FILE`` (a file holding the Redis
        password, e.g. a Docker secret; ``TOOLFLEET_REDIS_USER`` the ACL user, default Redis's ``default``)
        logs the Redis URLs in unless they carry a password already. Raises ``ValueError`` when that
        file cannot be read. The fleet key: ``TOOLFLEET_FLEET_KEY`` + ``TOOLFLEET_FLEET_KEYS_PREVIOUS``
        (comma-separated), or ``TOOLFLEET_FLEET_KEY_FILE`` (:func:`toolfleet.signing.read_key_file`; not
        both), and ``TOOLFLEET_INSECURE_NO_SIGNING=1``. Raises :class:`~toolfleet.errors.ConfigurationError`
        for an unreadable key file or both key sources."""
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
            values["heartbeat_s"] = _seconds(env, "TOOLFLEET_HEARTBEAT_S")
        for name, field in (("TOOLFLEET_SANDBOX", "sandbox"), ("TOOLFLEET_SANDBOX_NETWORK", "sandbox_network"),
                            ("TOOLFLEET_BWRAP", "bwrap_path"), ("TOOLFLEET_REDIS_CA_FILE", "redis_ca_file"),
                ("TOOLFLEET_REDIS_CERT_FILE", "redis_cert_file"), ("TOOLFLEET_REDIS_KEY_FILE", "redis_key_file"),
                ("TOOLFLEET_REDIS_CERT_REQS", "redis_cert_reqs"), ("TOOLFLEET_SANDBOX_CGROUP", "sandbox_cgroup"),
                ("TOOLFLEET_SANDBOX_MAX_PROCESSES", "sandbox_max_processes")):
            if env.get(name):
                values[field] = env[name]
        if env.get("TOOLFLEET_TURN_LEASE_S"):
            values["turn_lease_s"] = _seconds(env, "TOOLFLEET_TURN_LEASE_S")
        if env.get("TOOLFLEET_CLOCK_SKEW_MARGIN_S"):
            values["clock_skew_margin_s"] = _seconds(env, "TOOLFLEET_CLOCK_SKEW_MARGIN_S")
        values.update(_keys_from_env(env))
        if env.get("TOOLFLEET_TASK_SENT_EVENTS"):
            values["task_sent_events"] = env["TOOLFLEET_TASK_SENT_EVENTS"].strip().lower() not in (
                "0", "false", "no", "off")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if env.get("TOOLFLEET_REDIS_PASSWORD_FILE"):  # a Docker secret: the password never in an env var
            password = _read_secret(env["TOOLFLEET_REDIS_PASSWORD_FILE"], "TOOLFLEET_REDIS_PASSWORD_FILE")
            for name in ("redis_url", "broker_url"):
                url = values.get(name, DEFAULT_REDIS_URL if name == "redis_url" else None)
                if isinstance(url, str):
                    values[name] = with_login(url, env.get("TOOLFLEET_REDIS_USER") or None, password)
        return cls(**values)


def _seconds(env: Mapping[str, str], name: str) -> float:
    """``env[name]`` as a number of seconds; a ValueError naming the variable otherwise."""
    try:
        return float(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not a number of seconds") from None


def _read_secret(path: str, variable: str) -> str:
    """The content of a secret file, without its final newline; ``ValueError`` naming ``variable``
    when it cannot be read or is empty."""
    try:
        value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"{variable}={path}: cannot read the secret ({exc.strerror})") from exc
    if not value:
        raise ValueError(f"{variable}={path}: the secret file is empty")
    return value


def _keys_from_env(env: Mapping[str, str]) -> dict[str, object]:
    from .errors import ConfigurationError

    values: dict[str, object] = {}
    if env.get("TOOLFLEET_FLEET_KEY") and env.get("TOOLFLEET_FLEET_KEY_FILE"):
        raise ConfigurationError("set TOOLFLEET_FLEET_KEY or TOOLFLEET_FLEET_KEY_FILE, not both")
    if env.get("TOOLFLEET_FLEET_KEY_FILE"):
        current, previous = read_key_file(env["TOOLFLEET_FLEET_KEY_FILE"])
        values["fleet_key"], values["fleet_keys_previous"] = current, tuple(previous)
    elif env.get("TOOLFLEET_FLEET_KEY"):
        values["fleet_key"] = env["TOOLFLEET_FLEET_KEY"].strip()
        values["fleet_keys_previous"] = tuple(k.strip() for k in env.get("TOOLFLEET_FLEET_KEYS_PREVIOUS", "").split(",")
                                              if k.strip())
    if env.get("TOOLFLEET_INSECURE_NO_SIGNING", "").strip().lower() in ("1", "true", "yes"):
        values["insecure_no_signing"] = True
    return values
