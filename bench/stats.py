"""Small statistics for the benchmark: medians and percentiles of one run's samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def percentile(samples: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by linear interpolation between closest ranks."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """n, median, p10, p90, p99, min and max of samples given in seconds, in milliseconds."""
    ms = [s * 1000 for s in samples_s]
    return {
        "n": len(ms),
        "median_ms": median(ms),
        "p10_ms": percentile(ms, 10),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }
