"""Cases 06-10 (OpenAI Responses, Anthropic, and the Chat, Anthropic and Responses streams) through
`toolfleet run --json`: real CLI, real Redis, real prefork workers. Each result is checked against
the case's expect file, the results go back in the provider's shape paired by id, and the
assistant message plus the results validate against the official SDK request types. Case 10 was
made here (case 06 as Responses stream events); 06-09 come from shared/cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import CASES, ROOT, TEST_TOOLS
from .expect import check_run
from .sdk_types import check_messages, check_tools
from .test_cases_openai_chat import toolfleet_run

PROVIDER_CASES = [
    ("openai_responses", "06_parallel_reads.json"),
    ("anthropic", "07_mixed.json"),
    ("openai_chat_stream", "08_parallel_reads.jsonl"),
    ("anthropic_stream", "09_two_reads.jsonl"),
    ("openai_responses_stream", "10_parallel_reads.jsonl"),
]


def result_ids(format: str, messages: list[dict]) -> list[str]:
    """The call ids the result messages are paired with, in order, checking the shape."""
    if format.startswith("openai_chat"):
        assert all(m["role"] == "tool" and m["content"] for m in messages)
        return [m["tool_call_id"] for m in messages]
    if format.startswith("openai_responses"):
        assert all(m["type"] == "function_call_output" and m["output"] for m in messages)
        return [m["call_id"] for m in messages]
    assert len(messages) == 1 and messages[0]["role"] == "user", "Anthropic: ONE user message of tool_result blocks"
    blocks = messages[0]["content"]
    assert all(b["type"] == "tool_result" and b["content"] for b in blocks)
    return [b["tool_use_id"] for b in blocks]


@pytest.mark.parametrize("folder, file", PROVIDER_CASES, ids=[f for _, f in PROVIDER_CASES])
def test_case_meets_its_expect_file(folder, file, settings, worker, workspace):
    case = CASES / folder / file
    expect = json.loads(case.with_name(file.split(".")[0] + ".expect.json").read_text())
    proc = toolfleet_run(settings, case, workspace)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["format"] == expect["format"] == folder
    check_run(doc, expect, workspace)
    assert result_ids(folder, doc["messages"]) == expect["order"]
    check_messages(folder, doc["assistant"] + doc["messages"])
    assert doc["warnings"] == []
    if folder.startswith("anthropic"):
        errors = {r["call_id"] for r in doc["results"] if r["status"] == "error"}
        flagged = {b["tool_use_id"] for b in doc["messages"][0]["content"] if b.get("is_error")}
        assert flagged == errors


def test_case_07_orders_the_write_before_the_read_of_the_same_file(settings, worker, workspace):
    proc = toolfleet_run(settings, CASES / "anthropic" / "07_mixed.json", workspace)
    doc = json.loads(proc.stdout)
    assert doc["plan"]["deps"]["toolu_03check"] == ["toolu_02note"]
    assert (workspace / "notes" / "owner.md").read_text() == "inventory-service owner: Wang Wu\n"


def toolfleet_tools(settings, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "toolfleet", "tools", "--redis-url", settings.redis_url,
            "--namespace", settings.namespace, *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("format, sdk", [("chat", "openai_chat"), ("responses", "openai_responses"),
                                         ("anthropic", "anthropic")])
def test_tools_command_prints_each_providers_tools_list(format, sdk, settings):
    proc = toolfleet_tools(settings, "--format", format, "--tools", TEST_TOOLS)
    assert proc.returncode == 0, proc.stderr
    tools = json.loads(proc.stdout)
    check_tools(sdk, tools)
    names = [t["function"]["name"] if format == "chat" else t["name"] for t in tools]
    assert names[:6] == ["read_file", "list_dir", "grep", "write_file", "edit_file", "run_command"]
    assert "wait_read" in names  # from --tools
    assert "built-in tools plus tests.tools_for_tests" in proc.stderr


def test_tools_command_describes_the_live_workers_tools(settings, worker):
    proc = toolfleet_tools(settings, "--format", "anthropic")
    assert proc.returncode == 0, proc.stderr
    names = {t["name"] for t in json.loads(proc.stdout)}
    assert {"read_file", "wait_read", "append_line"} <= names  # the worker serves tests.tools_for_tests too
    assert "1 live worker(s)" in proc.stderr
