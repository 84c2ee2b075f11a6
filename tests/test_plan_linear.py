"""Planning is linear in the batch (toolfleet/dispatcher/plan_index.py), and plans what the
pairwise rule plans: no Redis needed.

The reference below is the rule as docs/design.md states it (step 3), compared pair by pair.
The planner keeps only the immediate dependencies, so the check is on what they mean: the same
calls waited for (transitive closure), never a call it does not conflict with, the same ranks and
waves."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.dispatcher.plan import Plan, PlanItem, Planner, conflicts, make_plan, widened
from toolfleet.dispatcher.plan_index import key
from toolfleet.tools.resources import EVERYTHING, overlaps

RESOURCES = ["*", "fs:", "fs", "fs:a", "fs:a/b", "fs:a/b/c", "fs:a/d", "fs:ab", "fs:a/", "fs:a//b", "fs:/a",
             "fs:e", "fs:e/f", "key:", "key:a", "key:a/b", "*:a", "a/b", "a/b:c"]


def reference_deps(items: list[PlanItem]) -> dict[str, set[str]]:
    """Every earlier call each call conflicts with, pair by pair (the rule, with the widening)."""
    out: dict[str, set[str]] = {}
    planned: list[PlanItem] = []
    widen = False
    for item in items:
        if item.access == "write":
            if widen:
                item = widened(item)
            widen |= EVERYTHING in item.resources
        out[item.call_id] = {e.call_id for e in planned if conflicts(e, item)}
        planned.append(item)
    return out


def closure(order: tuple[str, ...], deps: dict[str, set[str]] | Plan) -> dict[str, set[str]]:
    deps = deps.deps if isinstance(deps, Plan) else deps
    reach: dict[str, set[str]] = {}
    for c in order:  # model order is topological
        reach[c] = set(deps[c])
        for d in deps[c]:
            reach[c] |= reach[d]
    return reach


def reference_rank(order: tuple[str, ...], deps: dict[str, set[str]]) -> dict[str, int]:
    rank: dict[str, int] = {}
    for c in reversed(order):
        rank[c] = 1 + max((rank[d] for d in order if c in deps[d]), default=0)
    return rank


batches = st.lists(
    st.tuples(st.sampled_from(["read", "write"]), st.frozensets(st.sampled_from(RESOURCES), max_size=3)),
    max_size=30,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_the_plan_means_what_the_pairwise_rule_means(batch):
    items = [PlanItem(f"c{i}", access, res) for i, (access, res) in enumerate(batch)]
    full = reference_deps(items)
    plan = make_plan(items)
    reach = closure(plan.order, plan)
    assert reach == closure(plan.order, full)  # waits for what the rule waits for, through its deps
    assert all(full[c] <= reach[c] for c in plan.order)  # every conflicting earlier call among them
    assert all(plan.deps[c] <= full[c] for c in plan.order)  # and waits for no call it does not conflict with
    assert plan.rank == reference_rank(plan.order, full)
    level: dict[str, int] = {}
    for c in plan.order:
        level[c] = 1 + max((level[d] for d in full[c]), default=-1)
    waves = range(max(level.values(), default=-1) + 1)
    assert plan.waves() == [[c for c in plan.order if level[c] == w] for w in waves]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(RESOURCES), st.sampled_from(RESOURCES))
def test_keys_are_prefixes_exactly_when_resources_overlap(a, b):
    ka, kb = key(a), key(b)
    assert overlaps(a, b) == (ka[:len(kb)] == kb or kb[:len(ka)] == ka)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab/:*", max_size=7), st.text(alphabet="ab/:*", max_size=7))
def test_keys_match_overlaps_on_any_spelling(a, b):
    ka, kb = key(a), key(b)
    assert overlaps(a, b) == (ka[:len(kb)] == kb or kb[:len(ka)] == ka)


def test_a_write_chain_is_a_chain():
    plan = make_plan([PlanItem(f"w{i}", "write", frozenset({"fs:log.txt"})) for i in range(5)]
                     + [PlanItem("r", "read", frozenset({"fs:log.txt"}))])
    assert plan.deps == {"w0": frozenset(), "w1": {"w0"}, "w2": {"w1"}, "w3": {"w2"}, "w4": {"w3"}, "r": {"w4"}}


def test_ranks_asked_call_by_call_match_the_whole_plan():
    planner = Planner()
    for i in range(40):
        resources = frozenset({f"fs:d/{i % 4}", "fs:d" if i % 7 == 0 else "k:"})
        planner.add(PlanItem(f"c{i}", "write" if i % 3 else "read", resources))
    whole = planner.plan().rank
    assert {c: planner.ranks([c])[c] for c in reversed(list(whole))} == whole
    planner.add(PlanItem("last", "write", frozenset({"fs:"})))  # lengthens every chain: the kept ranks go
    assert planner.ranks(["c0"]) == {"c0": planner.plan().rank["c0"]}


def _time_plan(items: list[PlanItem]) -> float:
    started = time.perf_counter()
    plan = make_plan(items)
    for c in plan.order:  # a chain started one call at a time asks each call's rank
        plan_rank = plan.rank[c]
        assert plan_rank >= 1
    return time.perf_counter() - started


def test_planning_grows_about_linearly():
    """2,500 writes to one path took ~2.9 s (every pair compared, every earlier write a dependency),
    2,500 distinct paths ~2.5 s. 20,000 of each now: well under the bound even on a loaded machine."""
    n = 20_000
    one_path = [PlanItem(f"w{i}", "write", frozenset({"fs:notes.md"})) for i in range(n)]
    assert _time_plan(one_path) < 5.0
    distinct = [PlanItem(f"w{i}", "write", frozenset({f"fs:src/f{i}.py"})) for i in range(n)]
    assert _time_plan(distinct) < 5.0
    mixed = [PlanItem(f"c{i}", "read" if i % 4 else "write",
                      frozenset({f"fs:src/f{i % 50}.py", "fs:src" if i % 97 == 0 else "k:x"})) for i in range(n)]
    plan = make_plan(mixed)
    assert sum(len(d) for d in plan.deps.values()) < 4 * n  # immediate dependencies only


def test_a_chain_sent_one_by_one_sweeps_its_ranks_once():
    planner = Planner()
    n = 20_000
    for i in range(n):
        planner.add(PlanItem(f"w{i}", "write", frozenset({"fs:a"})))
    started = time.perf_counter()
    ranks = [planner.ranks([f"w{i}"])[f"w{i}"] for i in range(n)]  # as the driver asks, one result at a time
    assert time.perf_counter() - started < 5.0  # was one sweep of the tail per call: quadratic
    assert ranks == list(range(n, 0, -1))
