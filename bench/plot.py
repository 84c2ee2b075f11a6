"""The report's figure: one PNG, a panel per measurement (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .report import throughput_ratios  # noqa: E402


def plot(results: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    fig.suptitle(f"toolfleet benchmark ({results.get('meta', {}).get('cpu_count', '?')} cores, "
                 f"{results.get('meta', {}).get('date', '')})")
    panels = (_plan, _overhead, _throughput, _cancel, _streaming, _scale)
    for ax, panel in zip(axes.flat, panels, strict=True):
        if not panel(ax, results):
            ax.set_title(panel.__name__.strip("_").replace("_", " "))
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax: Any, labels: list[str], series: dict[str, list[float]], legend: str = "best") -> None:
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels)
    ax.legend(fontsize=8, loc=legend)


def _plan(ax: Any, results: dict[str, Any]) -> bool:
    runs = results.get("plan_efficiency")
    if not runs:
        return False
    _bars(ax, [f"{p['slots']} slots\neff {p['efficiency']:.2f}" for p in runs], {
        "lower bound": [p["lower_bound_ms"] for p in runs],
        "FIFO simulated": [p["fifo_simulated_ms"] for p in runs],
        "rank-first simulated": [p.get("rank_first_simulated_ms", 0) for p in runs],
        "measured makespan": [p["median_makespan_ms"] for p in runs],
        **({"raw Celery canvas, measured": [p["raw_celery"]["median_makespan_ms"] for p in runs]}
           if all(p.get("raw_celery") for p in runs) else {}),
    })
    ax.set_title("1. Plan efficiency (16 x 100 ms calls)")
    ax.set_ylabel("ms")
    return True


def _overhead(ax: Any, results: dict[str, Any]) -> bool:
    ov = results.get("overhead")
    if not ov:
        return False
    s = ov["stats"]
    labels = ["(a) toolfleet", "(b) raw,\n5 ms poll", "(c) raw,\ndefault get", "(d) in-\nprocess"]
    values = [s[k]["median_ms"] for k in ("toolfleet", "raw_poll_5ms", "raw_default_get", "in_process")]
    if "raw_claim_poll_5ms" in s:
        labels.append("(e) raw,\na claim per call")
        values.append(s["raw_claim_poll_5ms"]["median_ms"])
    ax.bar(labels, values, color=["C0", "C1", "C3", "C2", "C4"][:len(values)])
    ax.set_yscale("log")
    for x, v in enumerate(values):
        ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_title(f"2. 16 no-op calls, median ms (a/b {ov['ratio_a_over_b']:.2f}, c/a {ov['ratio_c_over_a']:.0f})")
    ax.tick_params(axis="x", labelsize=8)
    return True


def _throughput(ax: Any, results: dict[str, Any]) -> bool:
    ratios = throughput_ratios(results)
    if not ratios:
        return False
    series = {
        "toolfleet": [t["toolfleet"]["calls_per_s"] for t in ratios],
        "raw Celery": [t["raw"]["calls_per_s"] for t in ratios],
    }
    if all("like" in t for t in ratios):
        series["raw Celery, toolfleet's settings"] = [t["like"]["calls_per_s"] for t in ratios]
    if all("claim" in t for t in ratios):
        series["... and a claim per call"] = [t["claim"]["calls_per_s"] for t in ratios]
    _bars(ax, [f"{t['worker_processes']} process(es)\nratio {t['ratio']:.2f}" for t in ratios], series,
          legend="lower center")
    ax.set_title("3. Throughput, no-op calls/s")
    return True


def _cancel(ax: Any, results: dict[str, Any]) -> bool:
    cl = results.get("cancel_latency")
    if not cl:
        return False
    cases = cl["cases"]
    _bars(ax, [c["case"].replace("_", "\n") for c in cases], {
        "p50": [c["p50_ms"] for c in cases],
        "p99": [c["p99_ms"] for c in cases],
    })
    ax.axhline(50, color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(250, color="grey", linestyle=":", linewidth=0.8)
    ax.set_title("4. Cancel to all results final, ms (targets 50 / 250)")
    return True


def _streaming(ax: Any, results: dict[str, Any]) -> bool:
    st = results.get("streaming")
    if not st:
        return False
    rows = st["rows"]
    _bars(ax, [r["stream"].replace("_", "\n", 2) for r in rows], {
        "early dispatch": [r["early_first_result_ms"] for r in rows],
        "after the stream": [r["after_stream_first_result_ms"] for r in rows],
    })
    ax.set_title(f"5. Stream start to first result, ms ({st['chunks_per_s']:g} chunks/s)")
    ax.tick_params(axis="x", labelsize=7)
    return True


def _scale(ax: Any, results: dict[str, Any]) -> bool:
    sc = results.get("scale")
    if not sc:
        return False
    pr = sc.get("projection") or {}
    if "ledger_ceilings" not in pr:  # a results.json from before the measured scale section
        return False
    hosts = [r["hosts"] for r in pr["rows"]]
    ax.plot(hosts, [h * pr["per_host_calls_per_s"] for h in hosts], "--", label="workers alone")
    for name in pr["ledger_ceilings"]:
        ax.plot(hosts, [r["cells"][name]["calls_per_s"] for r in pr["rows"]], "o-", markersize=3, label=name)
    ax.axhline(pr["broker_ceiling"], color="C3", linewidth=0.8, label="broker Redis ceiling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"worker hosts ({pr['cores_per_host']} cores each)")
    ax.set_title("6. Projected no-op calls/s")
    ax.legend(fontsize=8)
    return True
