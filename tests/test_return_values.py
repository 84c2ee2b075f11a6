"""Issue 11, case 3: any value a handler returns becomes a result at once (never a 65 s
WORKER_LOST), and nothing a handler returns can crash `toolfleet run --json`."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import pytest

from toolfleet import ErrorCode, ToolResult
from toolfleet.worker.execute import storable
from toolfleet.worker.values import MAX_BYTES, BinaryTooLarge, safe_text, to_content_and_data

from .conftest import ROOT, TEST_TOOLS
from .faults import call
from .tools_for_tests import PNG_1PX, odd_value

KINDS = ["png", "big_bytes", "surrogate", "pair", "model", "dataclass", "dict", "set", "tuple", "opaque",
         "unprintable", "nan", "huge_int", "big_int", "none", "decimal", "uuid", "cycle", "generator"]
BOUND_S = 20.0  # every one of these calls has its result within this (a handler that returns at once)


def test_safe_text_replaces_lone_surrogates_and_joins_pairs():
    assert safe_text("Launch day \ud83d") == "Launch day \ufffd"
    assert safe_text("party \ud83c\udf89") == "party \U0001f389"
    assert safe_text("plain é") == "plain é"


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "big_bytes"])
def test_every_kind_converts_to_encodable_json(kind):
    content, data = to_content_and_data(odd_value(kind))
    content.encode("utf-8")
    json.dumps(data, allow_nan=False).encode("utf-8")
    ToolResult(call_id="c", name="t", status="ok", content=content or "-", data=data).model_dump_json()


def test_conversion_rules():
    content, data = to_content_and_data(PNG_1PX)
    assert "image/png" in content and base64.b64decode(data["bytes_base64"]) == PNG_1PX
    assert data["size_bytes"] == len(PNG_1PX)
    assert to_content_and_data(float("nan"))[1] == "NaN"
    assert to_content_and_data({"f": float("-inf")})[1] == {"f": "-Infinity"}
    assert to_content_and_data(2**70)[1] == str(2**70)
    assert "bits" in to_content_and_data(10**5000)[1]
    assert to_content_and_data({3, 1, 2})[1] == [1, 2, 3]
    assert to_content_and_data(odd_value("dataclass"))[1] == {"x": 1.5, "y": "NaN", "tags": ["a", "b"]}
    assert to_content_and_data(odd_value("model"))[1]["name"] == "m\ufffd"
    assert to_content_and_data(odd_value("cycle"))[1] == [1, "<cycle>"]
    with pytest.raises(BinaryTooLarge):
        to_content_and_data(b"x" * (MAX_BYTES + 1))


def test_storable_fixes_a_result_that_cannot_be_serialised():
    bad = ToolResult.failure("c", "t\ud800", ErrorCode.EXECUTION_ERROR, "boom \udc80", "hint \ud800")
    bad = bad.model_copy(update={"data": {"b": b"\xff", "o": object()}})
    fixed = storable(bad)
    fixed.model_dump_json()
    assert "\ufffd" in fixed.error.message and fixed.name == "t\ufffd"


def test_every_return_value_becomes_a_result_at_once(dispatcher, worker, workspace):
    began = time.monotonic()
    results = dispatcher.run([call(k, "returns", kind=k) for k in KINDS], workspace=str(workspace),
                             timeout_s=BOUND_S)
    elapsed = time.monotonic() - began
    by_id = {r.call_id: r for r in results}
    print(f"\n{len(KINDS)} kinds of return value: every one a result in {elapsed:.2f} s (bound {BOUND_S:g} s)")
    for kind in KINDS:
        r = by_id[kind]
        r.model_dump_json()
        if kind == "big_bytes":
            assert r.code is ErrorCode.EXECUTION_ERROR and "1048577 bytes" in r.error.message, r.content
        else:
            assert r.ok, (kind, r.content)
        assert r.attempts == 1 and r.worker and r.run_ms is not None
    assert base64.b64decode(by_id["png"].data["bytes_base64"]) == PNG_1PX
    assert by_id["surrogate"].content == "Launch day \ufffd"


def test_cli_json_survives_every_return_value(settings, worker, workspace, tmp_path):
    response = {"id": "r", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason":
                "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{k}", "type": "function",
                     "function": {"name": "returns", "arguments": json.dumps({"kind": k})}} for k in KINDS]}}]}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(response))
    argv = [sys.executable, "-m", "toolfleet", "run", str(path), "--workspace", str(workspace), "--json",
            "--redis-url", settings.redis_url, "--namespace", settings.namespace, "--tools", TEST_TOOLS,
            "--timeout", str(BOUND_S)]
    proc = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["results"]) == len(KINDS)
    assert all(m["content"] for m in doc["messages"])
