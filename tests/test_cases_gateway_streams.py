"""Streams shaped like vLLM, Ollama, Gemini, LiteLLM and OpenRouter send them (and issue 12's cases
1-4), through `toolfleet run --json`: real CLI, real Redis, real prefork workers. Each run is
checked against its expect file (results, files, the rebuilt assistant message, warnings), and the
assistant message plus the results validate against the official SDKs' request types and follow
the providers' rules: string arguments, no empty text block, each result right after its call."""

from __future__ import annotations

import json

import pytest

from .conftest import CASES
from .expect import check_run
from .sdk_types import check_messages
from .test_cases_openai_chat import toolfleet_run
from .test_cases_providers import result_ids

STREAMS = CASES / "gateway_streams"
CASE_FILES = sorted(p for p in STREAMS.iterdir() if p.suffix in (".jsonl", ".sse"))
# provider fields the SDKs' request types do not declare, sent back on purpose (the provider asks for them)
EXTENSIONS = {"message": ("reasoning_content", "reasoning", "reasoning_details"), "call": ("extra_content",)}


def pointer_get(doc, pointer: str):
    """The value at an RFC 6901 ``pointer`` in ``doc``; KeyError/IndexError when absent."""
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def without_extensions(messages: list[dict]) -> list[dict]:
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if k not in EXTENSIONS["message"]}
        if "tool_calls" in message:
            message["tool_calls"] = [{k: v for k, v in c.items() if k not in EXTENSIONS["call"]}
                                     for c in message["tool_calls"]]
        out.append(message)
    return out


def check_provider_rules(format: str, assistant: list[dict], messages: list[dict]) -> None:
    if format.startswith("anthropic"):
        for block in assistant[0]["content"]:
            assert block["type"] != "text" or block["text"].strip(), "an empty text block goes back"
            assert block["type"] != "tool_use" or isinstance(block["input"], dict)
        calls = [b["id"] for b in assistant[0]["content"] if b["type"] == "tool_use"]
    else:
        calls = [c["id"] for c in assistant[0]["tool_calls"]]
        assert all(isinstance(c["function"]["arguments"], str) for c in assistant[0]["tool_calls"])
    assert result_ids(format, messages) == calls, "each call's result right after it, in order"


@pytest.mark.parametrize("case", CASE_FILES, ids=[p.name for p in CASE_FILES])
def test_gateway_stream_meets_its_expect_file(case, settings, worker, workspace):
    expect = json.loads((STREAMS / f"{case.stem}.expect.json").read_text())
    proc = toolfleet_run(settings, case, workspace)
    assert proc.returncode == 0, proc.stderr
    proc.stdout.encode("utf-8")  # valid UTF-8 (issue 12, case 4: a lone surrogate crashed the printer)
    doc = json.loads(proc.stdout)
    assert doc["format"] == expect["format"]
    check_run(doc, expect, workspace)
    for rel, want in expect.get("files_after", {}).items():
        if "equals" in want:
            assert (workspace / rel).read_text(encoding="utf-8") == want["equals"]
    for pointer, value in expect["assistant"].items():
        assert pointer_get(doc["assistant"], pointer) == value, pointer
    for pointer in expect["assistant_absent"]:
        with pytest.raises((KeyError, IndexError)):
            pointer_get(doc["assistant"], pointer)
    assert len(doc["warnings"]) == len(expect["warnings"]), doc["warnings"]
    for text, warning in zip(expect["warnings"], doc["warnings"], strict=True):
        assert text in warning
    check_provider_rules(doc["format"], doc["assistant"], doc["messages"])
    check_messages(doc["format"], without_extensions(doc["assistant"]) + doc["messages"])


UNREADABLE = [
    ("tool_calls_null.json", json.dumps({"choices": [{"message": {"role": "assistant", "tool_calls": [None]}}]}),
     "/choices/0/message/tool_calls/0"),
    ("delta_text.jsonl", json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": "x"}]}),
     "/0/choices/0/delta"),
    ("message_text.jsonl", json.dumps({"type": "message_start", "message": "x"}), "/0/message"),
    ("digits.json", '{"content": [{"type": "tool_use", "id": "t", "name": "read_file", "input": {"n": '
     + "7" * 5001 + "}}]}", None),
    ("deep.json", '{"content": ' + "[" * 10_000 + "]" * 10_000 + "}", None),
]


@pytest.mark.parametrize("name, text, pointer", UNREADABLE, ids=[n for n, _, _ in UNREADABLE])
def test_cli_refuses_an_unreadable_payload_without_a_traceback(name, text, pointer, settings, tmp_path):
    """Issue 12, case 6 through the CLI: a clear refusal (exit 2), never a Python traceback."""
    case = tmp_path / name
    case.write_text(text)
    proc = toolfleet_run(settings, case, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    if pointer is None:  # the file itself cannot be read as JSON: said on stderr
        assert "cannot read" in proc.stderr
    else:
        error = json.loads(proc.stdout)["error"]
        assert error["pointer"] == pointer and error["reason"] == "unreadable_payload"
