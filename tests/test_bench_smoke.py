"""A smoke run of the benchmark suite (bench/): not a benchmark, no speed is asserted.

The plan-efficiency measurement runs with 4 short calls on a real worker, and the report writer
renders every section from it; the lower-bound arithmetic is checked on the issue's 16-call batch.
"""

from __future__ import annotations

import pytest
import redis

from bench import plan_efficiency
from bench.report import SECTIONS, render
from bench.stack import ToolfleetFleet, bench_registry
from toolfleet.dispatcher import PlanItem, make_plan
from toolfleet.tools.resources import resolve
from toolfleet.tools.validation import parse_arguments


def _plan_of_mixed_batch():
    registry = bench_registry()
    items = []
    for call in plan_efficiency.mixed_batch():
        spec = registry.get(call.name)
        items.append(PlanItem(call.id, spec.access, resolve(spec.resources, parse_arguments(call))))
    return make_plan(items)


def test_the_mixed_batch_has_the_lower_bound_the_report_claims():
    plan = _plan_of_mixed_batch()
    durations = {c: 0.1 for c in plan.order}
    assert plan_efficiency.critical_path_s(plan, durations) == pytest.approx(0.5)  # w x, w x, r x, w x, r x
    assert plan_efficiency.lower_bound_s(plan, durations, 2) == pytest.approx(0.8)  # work / slots dominates
    assert plan_efficiency.lower_bound_s(plan, durations, 8) == pytest.approx(0.5)  # the critical path does
    assert plan_efficiency.simulate_s(plan, durations, 8, by_rank=False) == pytest.approx(0.5)
    # 4 slots: one FIFO queue starts the chains late; critical path first reaches the bound
    assert plan_efficiency.simulate_s(plan, durations, 4, by_rank=False) == pytest.approx(0.6)
    assert plan_efficiency.simulate_s(plan, durations, 4, by_rank=True) == pytest.approx(0.5)


def test_the_mixed_batch_is_a_forest_a_celery_canvas_can_say():
    """bench.plan_raw: each call's one parent in the transitive reduction; a join is refused."""
    from bench.plan_raw import canvas, forest

    parents = forest(_plan_of_mixed_batch())
    assert parents["c05"] == "c02" and parents["c06"] == "c05" and parents["c09"] == "c06"
    assert parents["c13"] == "c09" and parents["c11"] == parents["c15"] == "c10"
    assert [c for c, p in parents.items() if p is None] == ["c00", "c01", "c02", "c03", "c04", "c08", "c12", "c14"]
    from celery import Celery

    app = Celery("canvas-shape", set_as_current=False)

    @app.task(name="tests.canvas_shape.sleep", shared=False)
    def sleep(seconds: float, label: str = "") -> str:
        return label

    work, ids = canvas(_plan_of_mixed_batch(), sleep, 0.1)
    assert sorted(ids) == [f"c{i:02d}" for i in range(16)] and len(set(ids.values())) == 16
    heads = {t.tasks[0].args[1] if hasattr(t, "tasks") else t.args[1]: t for t in work.tasks}
    assert sorted(heads) == ["c00", "c01", "c02", "c03", "c04", "c08", "c12", "c14"]
    y = heads["c03"].tasks  # c03 -> c07 -> c10 -> (c11 | c15): a group at the chain's end
    assert [t.args[1] for t in y[:3]] == ["c03", "c07", "c10"]
    assert sorted(t.args[1] for t in y[3].tasks) == ["c11", "c15"]
    assert all(t.options["task_id"] == ids[t.args[1]] for t in (*y[:3], *y[3].tasks))
    join = make_plan([PlanItem("w1", "write", ["key:x"]), PlanItem("w2", "write", ["key:y"]),
                      PlanItem("w3", "write", ["key:x", "key:y"])])
    with pytest.raises(ValueError, match="a join"):
        forest(join)


def test_plan_efficiency_smoke_run_and_every_report_section(redis_url, namespace):
    from bench.stack import RawFleet

    with ToolfleetFleet(redis_url, 2, namespace=namespace) as fleet, RawFleet(redis_url, 2) as raw:
        result = plan_efficiency.measure(fleet.dispatcher, 2, n_calls=7, duration_s=0.01, trials=1, warmup=0,
                                         raw=raw)
    assert result["n_calls"] == 7 and len(result["makespans_ms"]) == 1
    # the same plan (a chain of writes of x among the reads) as a raw Celery canvas, measured after it
    assert len(result["raw_celery"]["makespans_ms"]) == 1 and result["raw_celery"]["efficiency"] > 0
    # the canvas keeps the dependencies: the chain c02 -> c05 -> c06 runs one call after another
    assert result["raw_celery"]["makespans_ms"][0] >= result["critical_path_ms"] >= 3 * 10
    assert result["lower_bound_ms"] > 0 and result["efficiency"] > 0
    b = result["breakdown_ms"]  # from the ledger's events: its parts add up to the run's makespan
    parts_ms = b["submit_ms"] + b["first_start_ms"] + b["runs_ms"] + b["waits_ms"] + b["collect_ms"]
    assert parts_ms == pytest.approx(b["makespan_ms"], abs=5)
    report = render({"meta": {"cpu_count": 2}, "plan_efficiency": [result]})
    for title in SECTIONS:
        assert f"## {title}" in report
    assert "plan efficiency, 2 worker slots" in report and "Where the makespan goes" in report
    assert "the same plan as a Celery canvas (measured" in report
    assert "_Not measured in this run._" in report  # the sections this smoke run skipped


def test_the_report_shows_the_command_with_redis_passwords_masked():
    """The bench command line goes into the report: a Redis URL in it (``--redis-url URL`` or
    ``--redis-url=URL``, an ACL user's password) is shown masked."""
    from bench.run import _masked

    assert _masked("rediss://bench:s3cret@redis.internal:6380/0?ssl_ca_certs=/ca.pem") == \
        "rediss://bench:**@redis.internal:6380/0"
    assert _masked("--redis-url=redis://:s3cret@h:6379/0") == "--redis-url=redis://:**@h:6379/0"
    assert _masked("--quick") == "--quick"


def test_monitor_split_tells_script_inner_commands_from_client_commands():
    """bench.redis_stats: MONITOR tags a script's commands; INFO counts them with the client's."""
    from bench import redis_stats
    from bench.cluster import binaries
    from bench.stack import PrivateRedis

    found = binaries()
    if found is None:
        pytest.skip("redis-server and redis-cli are needed")
    server = PrivateRedis()  # a server of its own: nobody else's commands in its MONITOR
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)

        def load() -> int:
            for _ in range(3):  # per "call": 1 EVAL running 2 commands inside, and 1 GET
                client.eval("redis.call('set', KEYS[1], 'v'); return redis.call('get', KEYS[1])", 1, "k")
                client.get("k")
            return 3

        before = redis_stats.counters(client)
        split = redis_stats.monitor_split(found[1], "127.0.0.1", server.port, load)
        d = redis_stats.per_call(redis_stats.delta(before, redis_stats.counters(client)), 3)
        client.close()
    finally:
        server.stop()
    assert split == {"calls": 3, "client_per_call": 2.0, "script_inner_per_call": 2.0}
    assert d["script_calls_per_call"] == 1.0 and d["cmdstats_per_call"]["get"] == 2.0  # 1 from the script
    assert d["commands_per_call"] >= 4.0  # INFO counts the inner commands too (and the echo marker, INFO)


def test_scale_projection_and_its_section_from_measured_rows():
    """bench.scale.project: the ceilings follow each server's net CPU per call; the report shows the split."""
    from bench.report_redis import scale_section
    from bench.scale import project

    def node(cpu_ms: float, share: float) -> dict:
        return {"cpu_ms_per_call": cpu_ms, "net_cpu_ms_per_call": cpu_ms, "idle_cpu_per_s": 0.0,
                "commands_per_call": 40 * share, "script_calls_per_call": 1.0, "share_of_commands": share,
                "share_of_own_commands": share, "cmdstats_per_call": {}, "port": 1}

    broker = {"cpu_ms_per_call": 0.25, "commands_per_call": 11.0, "script_calls_per_call": 0.0}
    rows = [
        {"ledger": "one_redis", "calls": 640, "calls_per_s": 300, "worker_processes": 2,
         "worker_cpu_ms_per_call": 4.0, "broker": broker, "ledger_nodes": [node(0.5, 1.0)],
         "ledger_cpu_ms_per_call": 0.5, "ledger_net_cpu_ms_per_call": 0.5, "ledger_commands_per_call": 40.0},
        {"ledger": "cluster", "calls": 640, "calls_per_s": 300, "worker_processes": 2,
         "worker_cpu_ms_per_call": 4.0, "broker": broker,
         "ledger_nodes": [node(0.2, 0.4), node(0.15, 0.3), node(0.15, 0.3)],
         "ledger_cpu_ms_per_call": 0.5, "ledger_net_cpu_ms_per_call": 0.5, "ledger_commands_per_call": 40.0},
    ]
    pr = project(rows, cores_per_host=2)
    assert pr["per_host_calls_per_s"] == pytest.approx(500)
    assert pr["broker_ceiling"] == pytest.approx(4000)
    assert pr["ledger_ceilings"]["one Redis for both"] == pytest.approx(1000 / 0.75)
    assert pr["ledger_ceilings"]["ledger on 1 Redis"] == pytest.approx(2000)
    assert pr["ledger_ceilings"]["ledger on 3 shards"] == pytest.approx(5000)  # the busiest shard, 0.2 ms
    assert pr["ledger_ceilings"]["ledger on 6 shards"] == pytest.approx(1000 / (0.5 * 1.2 / 6))
    by_hosts = {r["hosts"]: r["cells"] for r in pr["rows"]}
    assert by_hosts[1]["ledger on 3 shards"] == {"calls_per_s": pytest.approx(500), "limited_by": "workers"}
    assert by_hosts[64]["ledger on 12 shards"]["limited_by"] == "broker"
    assert by_hosts[64]["one Redis for both"]["limited_by"] == "redis"
    text = scale_section({"meta": {"cpu_count": 2},
                          "scale": {"rows": rows, "rounds": 6, "in_flight": 4, "projection": pr}})
    assert "Each shard's share of the ledger's commands: 40% / 30% / 30%" in text


def test_the_claim_floor_side_claims_every_call_before_its_body(redis_url):
    """bench.raw_celery with ``claim``: a real prefork worker sends one claim script per call
    (a fencing token, a start, a started event) and still answers "ok"; a cancelled flag makes
    every call refuse to run its body, as toolfleet's claim does."""
    from bench.overhead import run_raw
    from bench.stack import RawFleet

    with RawFleet(redis_url, 1, like_toolfleet=True, claim=True) as fleet:
        run_raw(fleet, n=4, interval_s=0.01)  # raises unless all four answered "ok"
        client = redis.Redis.from_url(redis_url)
        runs = client.hgetall(f"{fleet.namespace}:runs")
        assert sum(1 for k in runs if k.startswith(b"fence:")) == 4 and all(
            v == b"1" for k, v in runs.items() if k.startswith(b"fence:"))
        assert client.xlen(f"{fleet.namespace}:events") == 4
        client.hset(f"{fleet.namespace}:flags", "cancelled", "1")
        assert fleet.noop.delay().get(timeout=30) == "not claimed"
        client.close()


def test_the_throughput_section_shows_the_claim_floor():
    """The summary and section 3 give the fourth side's figures: the claim floor against raw
    Celery, and toolfleet against that floor (medians of the rounds' ratios)."""
    from bench.report_redis import throughput_section
    from bench.report_summary import summary_section

    def row(system: str, rates: list[float]) -> dict:
        return {"system": system, "worker_processes": 1, "in_flight": 4, "rounds": 2, "calls": 320,
                "wall_s": 1.0, "calls_per_s": sum(rates) / 2, "segment_calls_per_s": rates,
                "worker_cpu_ms_per_call": 1.0, "client_cpu_ms_per_call": 1.0, "redis_cpu_ms_per_call": 0.3,
                "redis_commands_per_call": 19.0, "redis_monitor_sample": None}

    results = {"meta": {"cpu_count": 2}, "throughput": [
        row("toolfleet", [400, 400]), row("raw_celery", [600, 600]),
        row("raw_celery_toolfleet_settings", [570, 570]), row("raw_celery_toolfleet_settings_claim", [500, 500])]}
    summary = summary_section(results)
    assert "0.950 raw Celery with toolfleet's Celery settings; 0.833 with a claim round trip" in summary
    assert "toolfleet is 0.800 of it" in summary
    assert "it reaches **0.833** of raw Celery, and toolfleet 0.800 of it" in throughput_section(results)


def test_the_overhead_rows_show_the_fenced_floor_e():
    """Section 2's (e), raw Celery with toolfleet's settings and a claim per call: the summary gives
    e/b (the floor of a/b for a runtime that fences each call) and a/e, the section a/e."""
    from bench.report_sections import overhead_section
    from bench.report_summary import summary_section

    def stat(median_ms: float) -> dict:
        return {"n": 4, "median_ms": median_ms, "p10_ms": median_ms, "p90_ms": median_ms}

    ov = {"batch": 16, "worker_processes": 2, "ratio_a_over_b": 1.1, "ratio_c_over_a": 12.5, "ratio_a_over_e": 0.88,
          "stats": {"toolfleet": stat(44.0), "raw_poll_5ms": stat(40.0), "raw_default_get": stat(550.0),
                    "in_process": stat(1.0), "raw_claim_poll_5ms": stat(50.0)}}
    summary = summary_section({"meta": {"cpu_count": 2}, "overhead": ov})
    assert "e/b **1.250**" in summary and "a/e 0.880" in summary and "c/e 11.0" in summary
    assert "(e) raw Celery with toolfleet's settings and a claim per call" in overhead_section({"overhead": ov})


def test_the_throughput_section_splits_worker_cpu_into_main_and_pool():
    """Section 3 gives each side's worker CPU per call as main process / pool, and toolfleet's CPU
    beyond the claim floor's by process; a results file from before the split still renders."""
    from bench.report_redis import throughput_section

    def row(system: str, main_ms: float | None, pool_ms: float | None) -> dict:
        r = {"system": system, "worker_processes": 1, "in_flight": 4, "rounds": 2, "calls": 320, "wall_s": 1.0,
             "calls_per_s": 320.0, "segment_calls_per_s": [320.0, 320.0],
             "worker_cpu_ms_per_call": (main_ms or 0.5) + (pool_ms or 0.5), "client_cpu_ms_per_call": 1.0,
             "redis_cpu_ms_per_call": 0.3, "redis_commands_per_call": 19.0, "redis_monitor_sample": None}
        if main_ms is not None:
            r.update(worker_main_cpu_ms_per_call=main_ms, worker_pool_cpu_ms_per_call=pool_ms)
        return r

    split = {"meta": {"cpu_count": 2}, "throughput": [
        row("toolfleet", 0.88, 0.69), row("raw_celery", 0.6, 0.4),
        row("raw_celery_toolfleet_settings", 0.62, 0.42), row("raw_celery_toolfleet_settings_claim", 0.64, 0.46)]}
    text = throughput_section(split)
    assert "| of which main / pool |" in text and "| 0.88 / 0.69 |" in text
    assert "1 process(es): +0.47 ms, of which main process +0.24 ms and pool +0.23 ms" in text
    before = {"meta": {"cpu_count": 2}, "throughput": [row(r["system"], None, None) for r in split["throughput"]]}
    text = throughput_section(before)
    assert "| n/a |" in text and "beyond the claim floor's" not in text
