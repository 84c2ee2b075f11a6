"""docker-compose.yml is valid (checked with Debian's docker-compose, no engine needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from .conftest import ROOT


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
