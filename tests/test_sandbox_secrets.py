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


@pytest.mark.parametrize("how", ["mv ops ops2", "mv ops/.toolfleet ops/moved", "mv ops/.toolfleet/fleet.key x",
                                 "ln ops/.toolfleet/fleet.key x", "rm -rf ops", "mv . ../elsewhere"])
def test_a_secret_in_the_workspace_cannot_be_moved_out_of_its_cover(place, how):
    """Renaming the folder that holds a covered secret (a breaker's case: ``mv ops ops2``, then the
    next command read ``ops2/.toolfleet/fleet.key``) would move it, on the host, to where the next
    sandbox does not look. Every directory between the workspace and the secret is a mount point
    in the sandbox: the kernel refuses to rename or remove it (EBUSY)."""
    workspace = place / "ws"
    home = workspace / "ops" / ".toolfleet"
    _secret(home / "fleet.key")
    config = sandbox.SandboxConfig.from_settings(Settings(), {"TOOLFLEET_HOME": str(home)})
    first = _run(config, workspace, f"{how} 2>&1; cat ops/.toolfleet/fleet.key 2>&1; echo end")
    assert KEY not in first.stdout and first.stdout.endswith("end\n"), first.stdout
    assert (home / "fleet.key").read_text() == KEY + "\n"  # still where the cover is
    found = _run(config, workspace, "grep -rs fleet-key . ..; echo end")
    assert KEY not in found.stdout, found.stdout


def test_the_secret_folder_move_through_a_worker(start_worker, dispatcher, workspace, monkeypatch):
    home = workspace / "ops" / ".toolfleet"
    _secret(home / "fleet.key")
    monkeypatch.setenv("TOOLFLEET_HOME", str(home))
    start_worker()
    [first] = dispatcher.run([call("c", "run_command", command="cat ops/.toolfleet/fleet.key; mv ops ops2")],
                             workspace=str(workspace), timeout_s=60)
    assert KEY not in first.content, first.content
    both = "cat ops2/.toolfleet/fleet.key ops/.toolfleet/fleet.key"
    [second] = dispatcher.run([call("c", "run_command", command=both)], workspace=str(workspace), timeout_s=60)
    assert KEY not in second.content, second.content


@pytest.mark.parametrize("shared", ["/tmp", "/var/tmp", "/dev/shm", "/run", "/var/run"])
def test_a_workspace_the_host_shares_is_refused(shared):
    """Bound read-write, the host's /tmp would hand a command the Unix sockets of other services and of
    the worker's own session host (a breaker's hardening note), whatever the sandbox's network."""
    with pytest.raises(sandbox.ToolFailure) as refused:
        sandbox.SandboxState(sandbox.SandboxConfig()).command(["true"], Path(shared))
    assert refused.value.code == "PERMISSION_DENIED" and "/tmp" in str(refused.value)


@pytest.mark.parametrize("url_setting", ["redis_url", "ledger_url", "broker_url"])
def test_a_tls_key_named_in_a_url_is_covered_as_the_key_file_setting_is(place, url_setting):
    """``rediss://...?ssl_keyfile=PATH`` configures a client alone (toolfleet/redis_tls.py): that
    key is the worker's secret too (a breaker's find: only ``redis_key_file`` was covered)."""
    key = _secret(place / "tls" / "client.key")
    workspace = place / "ws"
    workspace.mkdir()
    url = f"rediss://redis.internal:6380/0?ssl_cert_reqs=required&ssl_keyfile={key}"
    config = sandbox.SandboxConfig.from_settings(Settings(**{url_setting: url}), {})
    assert str(key) in config.hidden
    done = _run(config, workspace, f"cat {key} 2>&1; echo end")
    assert KEY not in done.stdout and done.stdout.endswith("end\n"), done.stdout
