"""The worker's own secret files are out of a sandboxed command's sight (docs/sandbox.md): the
command runs as the worker's user, who may read them, so the kernel covers each (an empty tmpfs
over a directory, /dev/null over a file) in the sandbox's mount namespace. Found by a helper
trying to break the sandbox: ``run_command "cat ~/.toolfleet/fleet.key"`` gave the model the
local stack's fleet key (and the state file beside it, the Redis URL)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolfleet.settings import Settings
from toolfleet.tools import sandbox

from .faults import call

KEY = "fleet-key-SANDBOXSECRETTEST0123456789abcdef"


@pytest.fixture
def place() -> Iterator[Path]:
    """Outside /tmp (the sandbox has its own /tmp), so the sandbox would see it read-only."""
    path = Path(tempfile.mkdtemp(prefix="toolfleet-secrets-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _secret(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


def _run(config: sandbox.SandboxConfig, workspace: Path, script: str) -> subprocess.CompletedProcess:
    argv, env = sandbox.SandboxState(config).command(["/bin/sh", "-c", script], workspace)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


def test_secret_files_and_toolfleet_home_are_covered_in_the_sandbox(place):
    home = place / "home"
    _secret(home / "fleet.key")
    (home / "stack.json").write_text('{"redis_url": "redis://:hunter2@127.0.0.1:6379/0"}')
    key_file = _secret(place / "keys" / "worker.key")
    password_file = _secret(place / "keys" / "redis.password")
    os.symlink(key_file, place / "keys" / "link-to-key")
    workspace = place / "ws"
    workspace.mkdir()
    inside = _secret(workspace / "tls.key")  # an operator's file inside a workspace
    environ = {"TOOLFLEET_HOME": str(home), "TOOLFLEET_FLEET_KEY_FILE": str(place / "keys" / "link-to-key"),
               "TOOLFLEET_REDIS_PASSWORD_FILE": str(password_file)}
    config = sandbox.SandboxConfig.from_settings(Settings(redis_key_file=str(inside)), environ)
    assert {str(home), str(place / "keys" / "link-to-key"), str(password_file), str(inside)} <= set(config.hidden)
    script = (f"cat {home}/fleet.key {home}/stack.json {key_file} {place}/keys/link-to-key {password_file} "
              f"{inside} 2>&1; echo listing; ls -A {home}; echo written > out.txt && cat out.txt")
    done = _run(config, workspace, script)
    assert KEY not in done.stdout and "hunter2" not in done.stdout, done.stdout
    assert done.stdout.split("listing\n")[1] == "written\n", done.stdout  # the home is empty in there
    assert (workspace / "out.txt").read_text() == "written\n"
    assert key_file.read_text() == KEY + "\n" and inside.read_text() == KEY + "\n"  # the host's are untouched
    unhidden = _run(sandbox.SandboxConfig(), workspace, f"cat {key_file}")
    assert KEY in unhidden.stdout  # the covering is what hides it: readable to this user otherwise


def test_a_workspace_inside_toolfleet_home_stays_usable(place):
    home = place / "home"
    _secret(home / "fleet.key")
    workspace = home / "workspaces" / "w1"
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("hello\n")
    config = sandbox.SandboxConfig.from_settings(Settings(), {"TOOLFLEET_HOME": str(home)})
    done = _run(config, workspace, f"cat notes.txt; cat {home}/fleet.key 2>&1; echo more >> notes.txt")
    assert "hello" in done.stdout and KEY not in done.stdout, done.stdout
    assert (workspace / "notes.txt").read_text() == "hello\nmore\n"


def test_a_secret_rotated_by_re_pointing_its_link_stays_covered(place):
    """Kubernetes secret volumes: the named file is a link through ``..data`` to a dated
    directory; a rotation re-points ``..data`` and deletes the old directory. The link is resolved
    at each command, not once at start-up (a reviewer's case)."""
    volume = place / "volume"
    _secret(volume / "..2026_01" / "fleet.key")
    os.symlink("..2026_01", volume / "..data")
    os.symlink("..data/fleet.key", volume / "fleet.key")
    workspace = place / "ws"
    workspace.mkdir()
    config = sandbox.SandboxConfig.from_settings(Settings(), {"TOOLFLEET_FLEET_KEY_FILE": str(volume / "fleet.key")})
    _secret(volume / "..2026_02" / "fleet.key").write_text("rotated-" + KEY + "\n")
    os.symlink("..2026_02", volume / "..data.new")
    os.replace(volume / "..data.new", volume / "..data")
    shutil.rmtree(volume / "..2026_01")
    done = _run(config, workspace, f"cat {volume}/fleet.key 2>&1; echo end")
    assert KEY not in done.stdout and done.stdout.endswith("end\n"), done.stdout


def test_a_secret_file_removed_after_start_up_does_not_break_commands(place):
    workspace = place / "ws"
    workspace.mkdir()
    gone = _secret(place / "gone.key")
    config = sandbox.SandboxConfig.from_settings(Settings(), {"TOOLFLEET_FLEET_KEY_FILE": str(gone)})
    gone.unlink()
    done = _run(config, workspace, "echo ran")
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr


def test_through_a_worker_the_stack_home_is_not_readable(start_worker, dispatcher, workspace, place, monkeypatch):
    home = place / "home"
    _secret(home / "fleet.key")
    monkeypatch.setenv("TOOLFLEET_HOME", str(home))
    start_worker()
    command = f"cat {home}/fleet.key; echo listing; ls -A {home}; echo end"
    [result] = dispatcher.run([call("c", "run_command", command=command)], workspace=str(workspace), timeout_s=60)
    assert KEY not in result.content and result.content.split("listing\n")[1] == "end\n", result.content
