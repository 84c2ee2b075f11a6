"""docker-compose.yml is valid (checked with Debian's docker-compose, no engine needed) and secure by
default (issue 18 point 3): Redis asks for a password read from a secret and is published on loopback
only, keeps an append-only file on a named volume, the fleet key comes from a secret, Flower asks for
a password."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from .conftest import ROOT

REDIS_PORT = 6379


def need_compose() -> None:
    """Skip where docker-compose is missing, except in CI, which must check the file."""
    if shutil.which("docker-compose") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must check docker-compose.yml: apt-get install docker-compose")
        pytest.skip("docker-compose not installed (apt-get install docker-compose)")


def test_compose_file_passes_docker_compose_config():
    need_compose()
    env = dict(os.environ, FLOWER_BASIC_AUTH="admin:secret")
    proc = subprocess.run(["docker-compose", "config"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert {"redis", "worker", "flower"} <= set(config["services"])
    assert config["services"]["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "admin:secret"
    assert "ports" not in config["services"]["worker"]  # so `--scale worker=N` works


def test_compose_refuses_to_start_flower_without_a_password():
    need_compose()
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    proc = subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "FLOWER_BASIC_AUTH" in proc.stderr


def compose_config(**env: str) -> dict:
    """``docker-compose config`` of the repository's file, with ``env`` (FLOWER_BASIC_AUTH set)."""
    need_compose()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "FLOWER_", "TOOLFLEET_"))}
    environ.update({"FLOWER_BASIC_AUTH": "admin:secret", **env})
    proc = subprocess.run(["docker-compose", "config"], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def published(service: dict) -> list[tuple[str, int]]:
    """(host address, container port) of each port a service publishes ("" = every interface);
    short ("127.0.0.1:6379:6379/tcp") and long ({host_ip, target}) syntax."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found.append((port.get("host_ip", ""), int(port["target"])))
            continue
        parts = str(port).split("/")[0].split(":")
        found.append((parts[0] if len(parts) == 3 else "", int(parts[-1])))
    return found


def speaks_redis(name: str, service: dict) -> bool:
    return "redis" in str(service.get("image", "")) or any(port == REDIS_PORT for _, port in published(service))


def command_text(service: dict) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


def test_no_service_publishes_redis_without_a_password():
    """Whatever the variables say, a service that is (or publishes) Redis asks for a password, and
    the password is a secret file, not a value in the file or an environment variable."""
    for env in ({}, {"REDIS_BIND": "0.0.0.0"}):
        config = compose_config(**env)
        redis_services = {name: s for name, s in config["services"].items() if speaks_redis(name, s)}
        assert redis_services, "no Redis service found"
        for name, service in redis_services.items():
            command = command_text(service)
            assert "requirepass" in command or "--aclfile" in command, f"{name} runs Redis without a password"
            assert "/run/secrets/" in command, f"{name}: the password must come from a secret"
            assert any(s.get("source", s) == "redis_password" for s in service.get("secrets", [])), name


def test_redis_is_published_on_loopback_only_unless_asked():
    config = compose_config()
    for name, service in config["services"].items():
        for host, port in published(service):
            assert host == "127.0.0.1", f"{name} publishes port {port} on every interface"
    opened = compose_config(REDIS_BIND="0.0.0.0")
    assert ("0.0.0.0", REDIS_PORT) in published(opened["services"]["redis"])


def test_redis_keeps_an_append_only_file_on_a_named_volume():
    """docs/guarantees.md's Redis-restart promise needs append-only persistence that outlives the
    container."""
    config = compose_config()
    redis_service = config["services"]["redis"]
    command = command_text(redis_service)
    assert "--appendonly yes" in command and "--appendonly no" not in command
    directory = command.split("--dir", 1)[1].split()[0]
    volumes = [v if isinstance(v, dict) else {"source": v.split(":")[0], "target": v.split(":")[1]}
               for v in redis_service["volumes"]]
    named = {v["source"] for v in volumes if v["target"] == directory}
    assert named and named <= set(config.get("volumes", {})), (directory, volumes)


def test_clients_log_in_and_the_fleet_key_comes_from_a_secret():
    """Workers and Flower get the Redis password from the secret (TOOLFLEET_REDIS_PASSWORD_FILE),
    workers the fleet key from the fleet_key secret (TOOLFLEET_FLEET_KEY_FILE, docs/signing.md); no
    secret value is written in the environment of any service."""
    config = compose_config()
    for name in ("worker", "flower"):
        service = config["services"][name]
        env = service["environment"]
        assert env["TOOLFLEET_REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password", name
        assert any(s.get("source", s) == "redis_password" for s in service["secrets"]), name
        assert "TOOLFLEET_FLEET_KEY" not in env and "REDIS_PASSWORD" not in env, name
    worker = config["services"]["worker"]
    assert any(s.get("source", s) == "fleet_key" for s in worker["secrets"])
    assert worker["environment"]["TOOLFLEET_FLEET_KEY_FILE"] == "/run/secrets/fleet_key"
    assert {"redis_password", "fleet_key"} <= set(config["secrets"])
    assert all("file" in secret for secret in config["secrets"].values())


def test_flower_asks_for_a_password_and_uses_the_fleet_settings():
    config = compose_config()
    flower = config["services"]["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == "admin:secret"
    assert "toolfleet.monitor" in flower["entrypoint"]  # TLS, user and namespace from the environment


def test_env_example_is_a_working_env_file_that_asks_for_flowers_password():
    """``.env.example`` copied as it is leaves Flower's password empty: compose refuses until it is
    set, and then the file works."""
    need_compose()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "FLOWER_", "TOOLFLEET_"))}
    argv = ["docker-compose", "--env-file", ".env.example", "config"]
    refused = subprocess.run(argv, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "FLOWER_BASIC_AUTH" in refused.stderr
    proc = subprocess.run(argv, cwd=ROOT, env={**environ, "FLOWER_BASIC_AUTH": "ops:pw"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert config["services"]["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "ops:pw"
    assert config["services"]["redis"]["ports"]  # the example's REDIS_BIND keeps it on loopback
    assert all(host == "127.0.0.1" for host, _ in published(config["services"]["redis"]))


def test_monitoring_profile_is_optional_and_its_files_are_in_the_repo():
    """Issue 17: Prometheus + Grafana only with ``--profile monitoring``; the scrape config names the
    workers, the dispatcher and Flower; the dashboard is a file in the repo and asks for our metrics."""
    need_compose()
    env = dict(os.environ, FLOWER_BASIC_AUTH="admin:secret")
    proc = subprocess.run(["docker-compose", "--profile", "monitoring", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]  # `docker compose up` alone leaves them out
        for volume in services[name]["volumes"]:
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            assert (ROOT / source).exists() or os.path.exists(source), source
    # Grafana's admin password is a secret, not its default admin/admin
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"] == \
        "/run/secrets/grafana_admin_password"
    scrape = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert set(jobs) == {"toolfleet-worker", "toolfleet-dispatcher", "flower"}
    assert jobs["toolfleet-worker"]["dns_sd_configs"][0]["names"] == ["worker"]  # every replica of the service
    dashboard = json.loads((ROOT / "monitoring" / "grafana" / "dashboards" / "toolfleet.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("toolfleet_calls_total", "toolfleet_call_queue_seconds_bucket", "toolfleet_call_run_seconds_bucket",
                   "toolfleet_queue_depth", "toolfleet_worker_calls_running", "toolfleet_calls_in_flight",
                   "toolfleet_worker_heartbeat_timestamp_seconds"):
        assert metric in exprs, metric


def test_redis_refuses_to_start_with_an_empty_password_secret(tmp_path):
    """Found by an attack: an empty secrets/redis_password made `requirepass ""`, a Redis with no
    password at all. The service's own command (as `docker-compose config` gives it, `$$` being the
    container's `$`, run by sh with the secret's path pointed at a file of the test's and
    redis-server replaced by `cat`, so no server starts) exits non-zero naming the secret when it is
    empty, and hands redis-server the requirepass line otherwise."""
    need_compose()
    command = compose_config()["services"]["redis"]["command"]
    assert command[:2] == ["sh", "-c"], command
    assert "exec redis-server - " in command[2]
    secret = tmp_path / "redis_password"

    def run(content: str) -> subprocess.CompletedProcess[str]:
        secret.write_text(content)
        script = (command[2].replace("$$", "$").replace("/run/secrets/redis_password", str(secret))
                  .replace("exec redis-server - ", "exec cat - # "))
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)

    for empty in ("", "\n", "  \n"):
        proc = run(empty)
        assert proc.returncode != 0 and "redis_password is empty" in proc.stderr, (empty, proc.stderr)
    proc = run("s3cret\n")
    assert proc.returncode == 0 and proc.stdout == 'requirepass "s3cret"\n', proc
