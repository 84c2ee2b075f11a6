"""Helpers the report's sections share: number and table formatting, throughput ratios by round."""

from __future__ import annotations

import statistics
from typing import Any

# issue 16's targets (raised from issue 5's 0.90 / 1.15 / 10 / 0.90); Redis commands per call is new
TARGETS = {"plan": 0.95, "a_b": 1.00, "c_a": 15.0, "throughput": 0.95, "commands": 20.0}


def ms(x: float | None) -> str:
    return "n/a" if x is None else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def change(ratio: float) -> str:
    return f"{'loses' if ratio < 1 else 'gains'} {abs(1 - ratio):.0%} of its throughput (ratio {ratio:.3f})"


def round_median(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float]:
    """Median, min and max over the rounds of a's calls/s / b's (adjacent segments, same load)."""
    rounds = [x / y for x, y in zip(a.get("segment_calls_per_s", []), b.get("segment_calls_per_s", []), strict=True)]
    if not rounds:
        total = a["calls_per_s"] / b["calls_per_s"]
        return total, total, total
    return statistics.median(rounds), min(rounds), max(rounds)


def throughput_ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per worker-process count: toolfleet / raw Celery as the median of the rounds' ratios (the
    figure judged), their range, the ratio of the totals, and, when the run had them, the split
    through raw Celery with toolfleet's settings (``settings_ratio``, ``own_path_ratio``) and through
    that with a claim round trip per call (``claim_ratio``: the floor of a fenced runtime, against
    raw Celery; ``beyond_claim_ratio``: toolfleet against that floor)."""
    rows = results.get("throughput") or []
    out = []
    for n in sorted({r["worker_processes"] for r in rows}):
        by = {r["system"]: r for r in rows if r["worker_processes"] == n}
        if "toolfleet" not in by or "raw_celery" not in by:
            continue
        tf, raw, like = by["toolfleet"], by["raw_celery"], by.get("raw_celery_toolfleet_settings")
        ratio, lo, hi = round_median(tf, raw)
        entry = {"worker_processes": n, "ratio": ratio, "round_min": lo, "round_max": hi,
                 "total_ratio": tf["calls_per_s"] / raw["calls_per_s"], "toolfleet": tf, "raw": raw}
        if like is not None:
            entry["like"] = like
            entry["settings_ratio"] = round_median(like, raw)[0]
            entry["own_path_ratio"] = round_median(tf, like)[0]
        claim = by.get("raw_celery_toolfleet_settings_claim")
        if claim is not None:  # the floor of a runtime that claims each call before running it
            entry["claim"] = claim
            entry["claim_ratio"] = round_median(claim, raw)[0]
            entry["beyond_claim_ratio"] = round_median(tf, claim)[0]
        out.append(entry)
    return out
