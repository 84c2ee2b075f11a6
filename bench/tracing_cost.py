"""What tracing costs per call, off and on, side by side in one run (issue 17).

Each round drives the hooks one turn of 16 calls goes through, in this process, as the real code
calls them: the dispatcher's (``observe_turn``; per call ``sent`` with its W3C headers and
``finished``; the turn's ``end``) and the worker's (``running`` around the execution, extracting the
context from the message headers; ``result_recorded``). *off*: no OpenTelemetry SDK (the API's
proxy provider: the hooks find no tracer and do nothing). *on*: an SDK ``TracerProvider`` with a
``BatchSpanProcessor`` whose exporter drops the spans (the cost of making and queueing them, not of
a network). The result log is silenced for both (it is not tracing). Rounds alternate off/on so
machine load hits both alike. Per-call figures are a round's time / 16; the median over rounds.

``python -m bench.tracing_cost [--rounds N]``; writes bench/results/tracing_cost.json.
Target (issue 17): off <= 0.05 ms per call.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from toolfleet.models import CallEnvelope, ToolResult
from toolfleet.observe import set_tracer_provider
from toolfleet.observe.results import result_recorded, running
from toolfleet.observe.turns import observe_turn

from .stats import summary_ms

CALLS = 16
TARGET_OFF_MS = 0.05
OUT = Path(__file__).resolve().parent / "results" / "tracing_cost.json"


class Drop(SpanExporter):
    def export(self, spans):  # noqa: ANN001, ANN201
        return SpanExportResult.SUCCESS


def one_turn(n: int, round_no: int) -> float:
    """Seconds for the hooks of one turn of ``n`` calls (dispatcher and worker side)."""
    tid = f"t{round_no}"
    envelopes = [CallEnvelope(turn_id=tid, call_id=f"c{i}", name="noop", time_limit_s=10, idempotency_key=f"{tid}:c{i}",
                              submitted_at=time.time()) for i in range(n)]
    payloads = [e.model_dump(mode="json") for e in envelopes]
    results = [ToolResult(call_id=f"c{i}", name="noop", status="ok", content="ok", queued_ms=1.0, run_ms=1.0,
                          attempts=1, worker="w@h") for i in range(n)]
    t0 = time.perf_counter()
    obs = observe_turn(tid)
    for env, payload, result in zip(envelopes, payloads, results, strict=True):
        headers = obs.sent(env.call_id, env.name) if obs is not None else None
        request = SimpleNamespace(hostname="w@h", **(headers or {}))
        with running(request, payload):
            result_recorded(env, result)
        if obs is not None:
            obs.finished(result)
    if obs is not None:
        obs.end("ok")
    return time.perf_counter() - t0


def measure(rounds: int) -> dict:
    logging.getLogger("toolfleet.results").setLevel(logging.WARNING)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=1 << 16))
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds + 20):  # the first 20 warm up
        for mode in ("off", "on"):
            set_tracer_provider(provider if mode == "on" else None)
            elapsed = one_turn(CALLS, r) / CALLS
            if r >= 20:
                samples[mode].append(elapsed)
    set_tracer_provider(None)
    provider.shutdown()
    out = {mode: summary_ms(s) for mode, s in samples.items()}
    out["calls_per_round"] = CALLS
    out["target_off_ms"] = TARGET_OFF_MS
    out["off_meets_target"] = out["off"]["median_ms"] <= TARGET_OFF_MS
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    out = measure(args.rounds)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for mode in ("off", "on"):
        s = out[mode]
        print(f"tracing {mode:3}: median {s['median_ms']:.4f} ms/call (p10 {s['p10_ms']:.4f}, p90 {s['p90_ms']:.4f}; "
              f"{s['n']} rounds of {CALLS} calls)")
    print(f"target off <= {TARGET_OFF_MS} ms/call: {'met' if out['off_meets_target'] else 'NOT met'}")


if __name__ == "__main__":
    main()
