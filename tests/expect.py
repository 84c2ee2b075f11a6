"""Checking a run against a case's ``.expect.json`` (shared by every provider's case tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def check_call(call_id: str, result: dict[str, Any], want: dict[str, Any]) -> None:
    assert result["status"] == want["status"], f"{call_id}: {result['status']} != {want['status']}: {result['content']}"
    if "code" in want:
        assert result["error"]["code"] == want["code"], f"{call_id}: {result['error']} != {want['code']}"
    for text in want.get("contains", []):
        assert text in result["content"], f"{call_id}: {text!r} not in {result['content']!r}"
    for text in want.get("not_contains", []):
        assert text not in result["content"], f"{call_id}: {text!r} unexpectedly in {result['content']!r}"


def check_run(doc: dict[str, Any], expect: dict[str, Any], workspace: Path, cancelled: bool = False) -> None:
    """``doc`` is the ``toolfleet run --json`` output."""
    results = doc["results"]
    assert [r["call_id"] for r in results] == expect["order"], "results not in model order"
    assert len({r["call_id"] for r in results}) == len(results), "a call has two results"
    by_id = {r["call_id"]: r for r in results}
    calls = expect["cancel"]["expect"] if cancelled else expect["calls"]
    for call_id, want in calls.items():
        check_call(call_id, by_id[call_id], want)
    if cancelled:
        assert doc["final_after_cancel_s"] <= expect["cancel"]["within_s"], doc["final_after_cancel_s"]
    # the run's time counts from the submit: it holds each call's time from its send to its end
    # (it began after the submit returned, so a fast case read 0.029 s for calls that took 55 ms)
    spans = [r["queued_ms"] + r["run_ms"] for r in results if r["queued_ms"] is not None and r["run_ms"] is not None]
    assert not spans or doc["elapsed_s"] * 1000 >= max(spans) - 5, (doc["elapsed_s"], max(spans))
    for rel, want in expect.get("files_after", {}).items():
        text = (workspace / rel).read_text()
        for snippet in want.get("contains", []):
            assert snippet in text, f"{rel}: {snippet!r} missing"
    if "plan" in expect and "parallel" in expect["plan"]:
        assert doc["plan"]["waves"][0] == expect["plan"]["parallel"]
