"""docker-compose.yml is valid (checked with Debian's docker-compose, no engine needed)."""

from __future__ import annotations

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
