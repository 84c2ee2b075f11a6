"""Measurement 5, streaming: stream start to the first result, early dispatch against waiting.

Recorded provider streams (``examples/cases/*_stream/*.jsonl``) are replayed at a model's pace
(``chunks_per_s``, default 50). Two ways to run their calls:

- ``early``: ``Dispatcher.open_stream`` fed each event as it arrives: a call is validated, planned
  and submitted the moment its arguments are complete, while the rest of the stream is coming;
- ``after_stream``: read the whole stream first, then ``Dispatcher.submit_stream`` it at once
  (what a runtime without streaming dispatch does).

A synthetic Chat Completions stream (4 calls, arguments in 3-character fragments, as models emit
them) is added because the recordings are short: a short stream leaves little to gain.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolfleet import Dispatcher, Turn
from toolfleet.dispatcher.adapters import get_adapter

from .stack import ROOT
from .stats import median

CASES = ROOT / "examples" / "cases"
RECORDED = {
    "openai_chat_08_parallel_reads": ("openai_chat_stream", CASES / "openai_chat_stream" / "08_parallel_reads.jsonl"),
    "anthropic_09_two_reads": ("anthropic_stream", CASES / "anthropic_stream" / "09_two_reads.jsonl"),
    "openai_responses_10_parallel_reads": ("openai_responses_stream",
                                           CASES / "openai_responses_stream" / "10_parallel_reads.jsonl"),
}


def synthetic_openai_stream(fragment_chars: int = 3) -> list[dict[str, Any]]:
    """A Chat Completions stream of 4 read calls on the example workspace, arguments fragmented."""
    calls = [
        ("call_s1", "read_file", {"path": "README.md"}),
        ("call_s2", "grep", {"pattern": "WARN slow", "path": "logs/app.log"}),
        ("call_s3", "list_dir", {"path": "src/inventory"}),
        ("call_s4", "read_file", {"path": "config/settings.toml"}),
    ]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-synthetic", "object": "chat.completion.chunk", "created": 0, "model": "synthetic",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": None})]
    for index, (cid, name, args) in enumerate(calls):
        out.append(chunk({"tool_calls": [{"index": index, "id": cid, "type": "function",
                                          "function": {"name": name, "arguments": ""}}]}))
        text = json.dumps(args)
        for at in range(0, len(text), fragment_chars):
            piece = text[at:at + fragment_chars]
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(chunk({}, "tool_calls"))
    return out


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay(chunks: list[dict[str, Any]], chunks_per_s: float) -> Iterator[dict[str, Any]]:
    """Yield chunk ``i`` at ``i / chunks_per_s`` seconds after the first (a steady model pace)."""
    start = time.perf_counter()
    for i, chunk in enumerate(chunks):
        delay = start + i / chunks_per_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield chunk


def first_complete_chunk(chunks: list[dict[str, Any]], fmt: str) -> int:
    """Index of the chunk that completes the stream's first call (toolfleet's stream parser)."""
    parser = get_adapter(fmt).parser()
    for i, chunk in enumerate(chunks):
        if parser.feed(chunk):
            return i
    return len(chunks) - 1


class _FirstResult:
    """Records when the first result of a turn arrives (a watcher thread on ``as_completed``)."""

    def __init__(self, turn: Turn) -> None:
        self.at: float | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(turn,), daemon=True)
        self._thread.start()

    def _run(self, turn: Turn) -> None:
        for result in turn.as_completed(timeout_s=30):
            if self.at is None:
                self.at = time.perf_counter()
            if not result.ok:
                self.error = result.content

    def join(self) -> float:
        self._thread.join(timeout=30)
        if self.error:
            raise RuntimeError(f"a streamed call failed: {self.error}")
        if self.at is None:
            raise RuntimeError("no result arrived")
        return self.at


def _one(dispatcher: Dispatcher, chunks: list[dict[str, Any]], fmt: str, workspace: str, *,
         early: bool, chunks_per_s: float) -> float:
    """Seconds from the stream's first chunk to the first result."""
    t0 = time.perf_counter()
    if early:
        stream = dispatcher.open_stream(format=fmt, workspace=workspace)
        first = _FirstResult(stream.turn)
        with stream:
            for chunk in replay(chunks, chunks_per_s):
                stream.feed(chunk)
    else:
        whole = list(replay(chunks, chunks_per_s))
        first = _FirstResult(dispatcher.submit_stream(whole, format=fmt, workspace=workspace))
    return first.join() - t0


def measure(dispatcher: Dispatcher, workspace: str, *, chunks_per_s: float = 50.0, trials: int = 5) -> dict[str, Any]:
    sources = {name: (fmt, load(path)) for name, (fmt, path) in RECORDED.items()}
    sources["synthetic_openai_chat_4_calls"] = ("openai_chat_stream", synthetic_openai_stream())
    rows = []
    for name, (fmt, chunks) in sources.items():
        early, late = [], []
        for _ in range(trials):  # interleaved
            early.append(_one(dispatcher, chunks, fmt, workspace, early=True, chunks_per_s=chunks_per_s))
            late.append(_one(dispatcher, chunks, fmt, workspace, early=False, chunks_per_s=chunks_per_s))
        e, w = median(early) * 1000, median(late) * 1000
        rows.append({
            "stream": name,
            "format": fmt,
            "chunks": len(chunks),
            "stream_ms": (len(chunks) - 1) / chunks_per_s * 1000,
            "first_call_complete_at_chunk": first_complete_chunk(chunks, fmt),
            "early_first_result_ms": e,
            "after_stream_first_result_ms": w,
            "saved_ms": w - e,
        })
    return {"chunks_per_s": chunks_per_s, "trials": trials, "rows": rows,
            "seam": "Dispatcher.open_stream / TurnStream.feed (early), Dispatcher.submit_stream (after the stream)"}
