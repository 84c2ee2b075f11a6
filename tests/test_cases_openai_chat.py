"""Cases 01-05 (OpenAI Chat Completions) through `toolfleet run --json`: real CLI, real Redis,
real prefork workers; each result checked against the case's expect file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CASES, ROOT, TEST_TOOLS
from .expect import check_run
from .sdk_types import check_messages

CHAT = CASES / "openai_chat"


def toolfleet_run(settings, case: Path, workspace: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "toolfleet", "run", str(case), "--workspace", str(workspace), "--json",
            "--redis-url", settings.redis_url, "--namespace", settings.namespace, "--tools", TEST_TOOLS,
            "--timeout", "120", *extra]
    if settings.broker_url:
        argv += ["--broker-url", settings.broker_url]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


def expect_of(name: str) -> dict:
    return json.loads((CHAT / f"{name}.expect.json").read_text())


@pytest.mark.parametrize("name", ["01_parallel_reads", "02_read_write_order", "03_bad_calls", "04_slow_commands"])
def test_case_meets_its_expect_file(name, settings, worker, workspace):
    proc = toolfleet_run(settings, CHAT / f"{name}.json", workspace)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    check_run(doc, expect_of(name), workspace)
    assert [m["tool_call_id"] for m in doc["messages"]] == expect_of(name)["order"]
    assert all(m["role"] == "tool" and m["content"] for m in doc["messages"])
    check_messages("openai_chat", doc["assistant"] + doc["messages"])


def test_case_02_equals_one_at_a_time_execution(settings, worker, workspace, tmp_path):
    """Results and files after a planned run equal those of running each call alone, in order."""
    import shutil

    case = CHAT / "02_read_write_order.json"
    calls = json.loads(case.read_text())["choices"][0]["message"]["tool_calls"]
    planned = json.loads(toolfleet_run(settings, case, workspace).stdout)

    serial_ws = tmp_path / "serial"
    shutil.copytree(CASES / "workspace", serial_ws)
    serial = []
    for call in calls:  # one response per call: nothing can overlap
        single = {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}
        path = tmp_path / f"{call['id']}.json"
        path.write_text(json.dumps(single))
        serial.append(json.loads(toolfleet_run(settings, path, serial_ws).stdout)["results"][0])

    assert [r["content"] for r in planned["results"]] == [r["content"] for r in serial]
    for rel in ("src/inventory/store.py", "notes/summary.md"):
        assert (workspace / rel).read_text() == (serial_ws / rel).read_text()


def test_case_04_cancel_mid_batch(settings, worker, workspace):
    proc = toolfleet_run(settings, CHAT / "04_slow_commands.json", workspace, "--cancel-after", "2.5")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    check_run(doc, expect_of("04_slow_commands"), workspace, cancelled=True)
    assert not any("not by this command" in w for w in doc["warnings"])  # its own cancel: nothing to explain


def test_case_05_duplicate_ids_refuse_the_batch(settings, worker, workspace):
    proc = toolfleet_run(settings, CHAT / "05_duplicate_ids.json", workspace)
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    for text in expect_of("05_duplicate_ids")["batch_rejected"]["contains"]:
        assert text in doc["error"]["message"]
    assert doc["results"] == [] and doc["turn_id"] is None
