"""The plan rule (docs/design.md, "The path of one batch", step 3), checked on its own: no Redis needed."""

from __future__ import annotations

import itertools
import random

from toolfleet.dispatcher.plan import PlanItem, Planner, conflicts, make_plan
from toolfleet.tools.resources import EVERYTHING, overlaps, path_resource


def item(cid: str, access: str, *resources: str) -> PlanItem:
    return PlanItem(cid, access, frozenset(resources))


def test_paths_conflict_by_whole_component_prefix():
    assert overlaps("fs:notes", "fs:notes/a.md")
    assert overlaps("fs:", "fs:src/x.py")
    assert not overlaps("fs:notes", "fs:notes2/a.md")
    assert not overlaps("fs:a", "key:a")
    assert overlaps(EVERYTHING, "key:a")


def test_path_resource_is_lexical_and_maps_escapes_to_the_root():
    assert path_resource("./src/../src/a.py") == "fs:src/a.py"
    assert path_resource(".") == "fs:"
    assert path_resource("../etc/passwd") == "fs:"
    assert path_resource("/etc/passwd") == "fs:"


def test_reads_run_together_and_writes_chain_per_resource():
    plan = make_plan(
        [
            item("r1", "read", "fs:a"),
            item("r2", "read", "fs:b"),
            item("w1", "write", "fs:a"),
            item("r3", "read", "fs:a"),
            item("w2", "write", "fs:b/x"),
            item("ls", "read", "fs:b"),
            item("free", "read", "fs:c"),
        ]
    )
    assert plan.parallel_group == ["r1", "r2", "free"]
    assert plan.deps["w1"] == {"r1"}
    assert plan.deps["r3"] == {"w1"}
    assert plan.deps["w2"] == {"r2"}
    assert plan.deps["ls"] == {"w2"}
    assert plan.waves() == [["r1", "r2", "free"], ["w1", "w2"], ["r3", "ls"]]


def test_a_tool_that_declares_nothing_is_a_write_on_everything():
    plan = make_plan([item("a", "read", "fs:x"), item("cmd", "write", EVERYTHING), item("b", "read", "key:y")])
    assert plan.deps["cmd"] == {"a"} and plan.deps["b"] == {"cmd"}


def test_every_conflicting_pair_is_ordered_in_model_order():
    """For random batches: whenever calls i < j conflict, j waits for i (directly or through others),
    and no call waits for a call it does not conflict with. That is what makes every result equal
    to one-at-a-time execution in model order while everything else runs at once."""
    rng = random.Random(7)
    paths = ["", "a", "a/b", "a/b/c", "a/d", "e", "e/f"]
    for _ in range(300):
        items = [
            item(f"c{i}", rng.choice(["read", "write"]), *{f"fs:{rng.choice(paths)}" for _ in range(rng.randint(1, 2))})
            for i in range(rng.randint(1, 12))
        ]
        plan = make_plan(items)
        reach = {c: set(plan.deps[c]) for c in plan.order}
        for c in plan.order:  # transitive closure, model order is topological
            for d in list(reach[c]):
                reach[c] |= reach[d]
        for a, b in itertools.combinations(items, 2):
            if conflicts(a, b):
                assert a.call_id in reach[b.call_id]
            else:
                assert a.call_id not in plan.deps[b.call_id]
        assert all(int(d[1:]) < int(c[1:]) for c in plan.order for d in plan.deps[c])  # only earlier calls


def test_rank_counts_the_longest_chain_a_call_heads_and_orders_priorities():
    from toolfleet.dispatcher.submit import priority_of

    items = [
        item("r", "read", "key:a"),
        item("w1", "write", "key:x"),
        item("w2", "write", "key:x"),
        item("rx", "read", "key:x"),
        item("w3", "write", "key:x"),
    ]
    plan = make_plan(items)
    assert plan.rank == {"r": 1, "w1": 4, "w2": 3, "rx": 2, "w3": 1}
    planner = Planner()  # streamed: a call's rank counts the calls taken so far
    for it in items[:3]:
        planner.add(it)
    assert planner.ranks(["w1", "r"]) == {"w1": 2, "r": 1}
    # Redis serves priority 0 first: the head of the longest chain goes first
    assert [priority_of(plan.rank[c], "redis://h/0") for c in ("w1", "w2", "rx", "r")] == [0, 3, 6, 9]
    assert priority_of(7, "redis://h/0") == 0 and priority_of(4, "amqp://h//") == 9


def test_writes_after_a_write_on_everything_are_widened_to_the_workspace():
    """A command may make links the plan could not see: writes after it conflict with every file call."""
    plan = make_plan([item("cmd", "write", EVERYTHING), item("w", "write", "fs:alias/x.txt", "key:k"),
                      item("r", "read", "fs:sub/x.txt"), item("r2", "read", "key:other")])
    assert plan.deps["w"] == {"cmd"} and plan.deps["r"] == {"w"} and plan.deps["r2"] == {"cmd"}  # r: cmd through w
    plain = make_plan([item("w", "write", "fs:alias/x.txt"), item("r", "read", "fs:sub/x.txt")])
    assert plain.deps["r"] == frozenset()  # without a command before, resources are taken as given
