"""The core path over TLS, each role logged in as its own Redis ACL user with the least-privilege
rules of docs/deploying.md (issue 18 point 1).

A private redis-server (TLS only, the ``default`` user off) is started with a CA, server and
client certificates made here; the dispatcher and the prefork workers reach it by ``rediss://``
URLs with the CA given as ``TOOLFLEET_REDIS_CA_FILE``-style settings. The ACL rules are read from
docs/deploying.md (the block operators copy), so the page and the test cannot drift apart. A role
missing a permission fails with a message that names the refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolfleet import BrokerRefused, Dispatcher, ErrorCode, Settings
from toolfleet.access import check_worker_access
from toolfleet.ledger import Ledger
from toolfleet.worker.catalog import live_catalog

from .conftest import ROOT, WorkerProcess, make_registry
from .faults import call, wait_started
from .secure_redis import SecureRedis, make_pki, tls_redis_binary

DOCS = ROOT / "docs" / "deploying.md"
ROLES = ("dispatcher", "worker", "flower", "monitor")
PASSWORDS = {role: f"{role}-{uuid.uuid4().hex}" for role in ROLES}


def documented_rules() -> dict[str, str]:
    """The ``user`` lines of docs/deploying.md's ACL block (namespace ``toolfleet``), by user: the
    test runs what the page tells operators to load, so the two cannot drift apart."""
    text = DOCS.read_text()
    block = text.split("<!-- acl-rules", 1)[1].split("<!-- /acl-rules -->", 1)[0]
    lines = [line.strip() for line in block.splitlines() if line.strip().startswith("user ")]
    return {line.split()[1]: line for line in lines}


def acl_users(namespace: str) -> list[str]:
    """The documented rules of each role for ``namespace``, with a password of this run (the
    ``default`` user is switched off by SecureRedis, as the page's first line does)."""
    rules = documented_rules()
    assert rules.pop("default") == "user default off"
    assert set(rules) == set(ROLES), rules
    users = []
    for role, line in rules.items():
        line = line.replace(f">{role.upper()}_PASSWORD", f">{PASSWORDS[role]}")
        line = line.replace("toolfleet:", f"{namespace}:").replace("toolfleet.", f"{namespace}.")
        users.append(line.removeprefix("user "))
    return users


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[tuple[SecureRedis, str]]:
    binary, why_not = tls_redis_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the ACL + TLS test: {why_not}")
        pytest.skip(why_not)
    directory = tmp_path_factory.mktemp("secure-redis")
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    admin_password = uuid.uuid4().hex
    server = SecureRedis(binary, directory, make_pki(directory),
                         [*acl_users(namespace), f"admin on >{admin_password} ~* &* +@all"])
    try:
        server.wait_ready("admin", admin_password)
        server.admin_password = admin_password  # type: ignore[attr-defined]
        yield server, namespace
    finally:
        server.stop()


def role_settings(server: SecureRedis, namespace: str, role: str) -> Settings:
    """The settings a process of ``role`` runs with: its user in a rediss:// URL, the test CA, the
    client certificate (the server requires one), and the test run's fleet key when there is one in
    the environment (docs/signing.md)."""
    fleet_key = {k: v for k, v in os.environ.items() if k.startswith("TOOLFLEET_FLEET_KEY")}
    return Settings.from_env(fleet_key, redis_url=server.url(role, PASSWORDS[role]), namespace=namespace,
                             redis_ca_file=str(server.pki.ca), redis_cert_file=str(server.pki.client_cert),
                             redis_key_file=str(server.pki.client_key), cancel_grace_s=0.5, kill_grace_s=1.0)


def denied(server: SecureRedis) -> list[dict]:
    """Redis's ACL log: every refusal since the server started."""
    return server.client("admin", server.admin_password).acl_log(200)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def fleet(secure) -> Iterator[tuple[SecureRedis, str]]:
    """One worker (prefork, 2 processes) logged in as ``worker``, for the whole module."""
    server, namespace = secure
    worker = WorkerProcess(role_settings(server, namespace, "worker"), 2, "acl")
    try:
        worker.wait_ready()
        yield server, namespace
    finally:
        worker.stop()


def test_core_path_over_tls_with_least_privilege_users(fleet, tmp_path: Path):
    """Submit a batch, run on prefork workers, cancel mid-batch, results in call order: every
    process an ACL user of its role, every connection TLS, and Redis refused nothing."""
    server, namespace = fleet
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with Dispatcher(role_settings(server, namespace, "dispatcher"), make_registry()) as dispatcher:
        turn = dispatcher.submit([call("c1", "structured", n=2), call("c2", "count_until_cancelled", seconds=20),
                                  call("c3", "count_until_cancelled", seconds=20)], workspace=str(workspace))
        wait_started(dispatcher, turn.turn_id, "c2")
        first = next(iter(turn.as_completed(timeout_s=30)))  # c1 ends at once; c2 runs 20 s
        assert first.call_id == "c1" and first.status == "ok", first
        turn.cancel()
        results = turn.results(timeout_s=30)
    assert [r.call_id for r in results] == ["c1", "c2", "c3"]
    assert results[1].code is ErrorCode.CANCELLED, results[1]
    assert results[2].code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED), results[2]
    assert [e for e in denied(server) if e.get("username") in ("dispatcher", "worker")] == []


def test_no_password_no_plain_text(fleet):
    """The server has no ``default`` user (a client without credentials is refused), no plain port
    (a client without TLS gets no Redis answer) and wants a client certificate signed by its CA;
    the live clients are the roles' users."""
    import redis

    server, _ = fleet
    tls = {"ssl_ca_certs": str(server.pki.ca), "socket_timeout": 5}
    anonymous = redis.Redis.from_url(f"rediss://127.0.0.1:{server.port}/0", ssl_certfile=str(server.pki.client_cert),
                                     ssl_keyfile=str(server.pki.client_key), **tls)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    no_certificate = redis.Redis.from_url(server.url("dispatcher", PASSWORDS["dispatcher"]), **tls)
    with pytest.raises((redis.ConnectionError, OSError)):
        no_certificate.ping()
    with pytest.raises((redis.ConnectionError, OSError)):
        redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=3, socket_connect_timeout=3).ping()
    admin = server.client("admin", server.admin_password)  # type: ignore[attr-defined]
    assert "worker" in {c["user"] for c in admin.client_list()}


def test_read_only_monitor_reads_the_fleet_and_cannot_command_it(fleet, tmp_path: Path):
    """The monitor user reads a turn's results and the live catalog; a submit with its
    credentials fails with BrokerRefused naming the refusal, and nothing runs."""
    server, namespace = fleet
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with Dispatcher(role_settings(server, namespace, "dispatcher"), make_registry()) as dispatcher:
        turn = dispatcher.submit([call("r1", "structured", n=3)], workspace=str(workspace))
        assert turn.results(timeout_s=30)[0].status == "ok"
    monitor = role_settings(server, namespace, "monitor")
    ledger = Ledger(monitor)
    assert ledger.results(turn.turn_id)["r1"].status == "ok"
    assert live_catalog(monitor, ledger.redis), "the monitor sees the live workers' catalog"
    with pytest.raises(BrokerRefused) as info:
        with Dispatcher(monitor, make_registry()) as dispatcher:
            dispatcher.submit([call("m1", "structured", n=1)], workspace=str(workspace))
    message = str(info.value)
    assert "refused" in message and "no permissions" in message, message
    assert PASSWORDS["monitor"] not in message and "monitor:**@" in message, message


def test_a_wrong_password_is_refused_with_a_clear_message_and_masked(fleet):
    server, namespace = fleet
    wrong = role_settings(server, namespace, "dispatcher").model_copy(
        update={"redis_url": role_settings(server, namespace, "dispatcher").redis_url.replace(
            PASSWORDS["dispatcher"], "not-the-password")})
    with pytest.raises(BrokerRefused) as info:
        Ledger(wrong)
    assert "not-the-password" not in str(info.value) and "refused" in str(info.value), str(info.value)


def test_cli_worker_with_a_role_lacking_permissions_exits_with_a_clear_message(fleet):
    """`toolfleet worker` logged in as the read-only monitor: it stops at start-up and says that
    Redis refused it, instead of serving nothing."""
    server, namespace = fleet
    settings = role_settings(server, namespace, "monitor")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    proc = subprocess.run([sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url,
                           "--namespace", namespace, "--concurrency", "1", "--loglevel", "WARNING"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "refused" in proc.stderr and "docs/deploying.md" in proc.stderr, proc.stderr[-3000:]
    assert PASSWORDS["monitor"] not in proc.stderr + proc.stdout


def test_rediss_urls_carry_the_tls_options_to_every_client():
    """Settings write the TLS options into rediss:// URLs (what redis-py, kombu, Celery and Flower
    read); Celery's broker_use_ssl / redis_backend_use_ssl get them too; redis:// stays as given."""
    import ssl

    from toolfleet.worker.app import celery_config

    settings = Settings(redis_url="rediss://w:pw@redis.example:6380/0", redis_ca_file="/etc/tf/ca.pem",
                        redis_cert_file="/etc/tf/c.pem", redis_key_file="/etc/tf/c.key")
    assert settings.redis_url == ("rediss://w:pw@redis.example:6380/0?ssl_ca_certs=/etc/tf/ca.pem"
                                  "&ssl_certfile=/etc/tf/c.pem&ssl_keyfile=/etc/tf/c.key&ssl_cert_reqs=required")
    config = celery_config(settings)
    expected = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/etc/tf/ca.pem",
                "ssl_certfile": "/etc/tf/c.pem", "ssl_keyfile": "/etc/tf/c.key"}
    assert config["broker_use_ssl"] == expected and config["redis_backend_use_ssl"] == expected
    # a parameter of the URL itself wins; a bare rediss:// URL still checks the certificate
    assert Settings(redis_url="rediss://h/0?ssl_cert_reqs=none", redis_ca_file="/x").redis_url == \
        "rediss://h/0?ssl_cert_reqs=none&ssl_ca_certs=/x"
    assert Settings(redis_url="rediss://h/0").redis_url == "rediss://h/0?ssl_cert_reqs=required"
    plain = Settings(redis_url="redis://u:p@h/0", redis_ca_file="/x")
    assert plain.redis_url == "redis://u:p@h/0" and celery_config(plain)["broker_use_ssl"] is None
    env = Settings.from_env({"REDIS_URL": "rediss://h/1", "TOOLFLEET_REDIS_CA_FILE": "/ca.pem",
                             "TOOLFLEET_REDIS_CERT_REQS": "optional"})
    assert env.redis_url == "rediss://h/1?ssl_ca_certs=/ca.pem&ssl_cert_reqs=optional"
    with pytest.raises(ValueError):
        Settings(redis_url="rediss://h/0", redis_cert_reqs="sometimes")
    with pytest.raises(ValueError, match="ssl_cert_reqs") as info:  # the URL's own, checked too
        Settings(redis_url="rediss://u:hunter22@h/0?ssl_cert_reqs=sometimes")
    assert "hunter22" not in str(info.value)  # errors never quote the URL
    json.dumps(config["broker_transport_options"])  # the rest of the config is untouched


def test_flower_as_its_own_user_over_tls_sees_workers_tasks_and_queues(fleet, tmp_path: Path):
    """Flower (``celery -A toolfleet.monitor flower``, as docker-compose.yml and ``toolfleet up``
    start it) logged in as ``flower``: behind basic auth, it lists the live worker (a control
    broadcast and its reply), the tasks of a turn (task events) and the queue lengths (its own
    Redis client, TLS from broker_use_ssl); Redis refused it nothing."""
    import base64
    import time
    import urllib.error
    import urllib.request

    from toolfleet.stack import _free_port

    server, namespace = fleet
    port = _free_port()
    flower = role_settings(server, namespace, "flower")
    env = dict(os.environ, PYTHONPATH=str(ROOT), REDIS_URL=flower.redis_url, TOOLFLEET_NAMESPACE=namespace,
               FLOWER_BASIC_AUTH="admin:flower-pw")
    env.pop("TOOLFLEET_BROKER_URL", None)
    log = (tmp_path / "flower.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-P", "-m", "celery", "-A", "toolfleet.monitor", "flower",
                             f"--port={port}", "--address=127.0.0.1"], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Basic " + base64.b64encode(b"admin:flower-pw").decode()}

    def get(path: str, headers: dict[str, str] | None = None):
        request = urllib.request.Request(base + path, headers=headers or {})
        with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 (local URL)
            return json.load(reply) if "json" in reply.headers.get("Content-Type", "") else reply.read()

    def until(check, what: str, timeout_s: float = 30.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                found = check()
                if found:
                    return found
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)  # Flower learns from events and broadcasts asynchronously: look again
        raise AssertionError(f"{what}; flower log: {(tmp_path / 'flower.log').read_text(errors='replace')[-3000:]}")

    try:
        until(lambda: get("/healthcheck") == b"OK", "flower did not start")
        with pytest.raises(urllib.error.HTTPError) as info:
            get("/api/workers")
        assert info.value.code == 401  # no password, no answer
        workers = until(lambda: get("/api/workers?refresh=1", auth), "flower listed no worker")
        assert any(name.endswith(f"@{namespace}") for name in workers), workers
        workspace = tmp_path / "ws"
        workspace.mkdir()
        with Dispatcher(role_settings(server, namespace, "dispatcher"), make_registry()) as dispatcher:
            turn = dispatcher.submit([call("f1", "structured", n=1)], workspace=str(workspace))
            assert turn.results(timeout_s=30)[0].status == "ok"
        task_id = f"{turn.turn_id}:f1"
        until(lambda: get("/api/tasks", auth).get(task_id, {}).get("state") == "SUCCESS", "flower saw no task")
        queues = until(lambda: get("/api/queues/length", auth), "flower showed no queue lengths")
        assert "active_queues" in queues, queues
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    # on purpose: Flower may not take kombu's unacked mutex, so it never moves other consumers'
    # unacknowledged messages back to their queues (kombu skips the restore when refused)
    refusals = [entry for entry in denied(server)
                if entry.get("username") == "flower" and entry.get("object") != f"{namespace}.unacked_mutex"]
    assert refusals == [], refusals


def test_password_file_logs_the_urls_in(tmp_path: Path):
    """TOOLFLEET_REDIS_PASSWORD_FILE (a Docker secret) puts the password, quoted, into Redis URLs
    that carry none; an unreadable file is a ValueError naming the variable."""
    import redis

    secret = tmp_path / "redis_password"
    secret.write_text("p@ss:w/rd\n")
    env = {"TOOLFLEET_REDIS_PASSWORD_FILE": str(secret), "REDIS_URL": "redis://redis:6379/0"}
    settings = Settings.from_env(env)
    assert redis.connection.parse_url(settings.redis_url)["password"] == "p@ss:w/rd"
    worker = Settings.from_env({**env, "REDIS_URL": "rediss://redis:6380/0", "TOOLFLEET_REDIS_USER": "worker"})
    parsed = redis.connection.parse_url(worker.redis_url)
    assert (parsed["username"], parsed["password"]) == ("worker", "p@ss:w/rd")
    assert Settings.from_env({**env, "REDIS_URL": "redis://u:own@h/0"}).redis_url == "redis://u:own@h/0"
    with pytest.raises(ValueError, match="TOOLFLEET_REDIS_PASSWORD_FILE"):
        Settings.from_env({"TOOLFLEET_REDIS_PASSWORD_FILE": str(tmp_path / "missing")})


def test_worker_with_the_acl_of_before_the_namespaces_own_exchanges_is_refused_at_start(fleet):
    """A worker user whose ACL still names Celery's shared channels (``&/0.celeryev/*``,
    ``&/0.celery.pidbox``: the rules before the namespace got its own exchanges) is told so at
    start-up, naming the channel, not left to fail inside Celery (docs/deploying.md, upgrading)."""
    server, namespace = fleet
    old = documented_rules()["worker"].removeprefix("user worker ")
    old = old.replace(">WORKER_PASSWORD", ">old-worker-pw").replace("toolfleet:", f"{namespace}:")
    old = old.replace("&/0.toolfleet.celeryev/*", "&/0.celeryev/*").replace("&/0.toolfleet.celery.pidbox",
                                                                            "&/0.celery.pidbox")
    old = old.replace("toolfleet.", f"{namespace}.")
    admin = server.client("admin", server.admin_password)  # type: ignore[attr-defined]
    admin.execute_command("ACL", "SETUSER", "oldworker", "reset", *old.split())
    settings = role_settings(server, namespace, "worker").model_copy(
        update={"redis_url": server.url("oldworker", "old-worker-pw")})
    client = server.client("oldworker", "old-worker-pw")
    try:
        with pytest.raises(BrokerRefused) as info:
            check_worker_access(client, settings)
    finally:
        client.close()
        admin.execute_command("ACL", "DELUSER", "oldworker")
    assert f"{namespace}.celeryev" in str(info.value) and "old-worker-pw" not in str(info.value), str(info.value)
    current = role_settings(server, namespace, "worker")  # the documented rules pass the same check
    client = server.client("worker", PASSWORDS["worker"])
    try:
        check_worker_access(client, current)
    finally:
        client.close()
