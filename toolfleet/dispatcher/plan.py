"""Planning a batch (docs/design.md, step 3).

Two calls conflict when they share a resource (by path prefix, :func:`toolfleet.tools.overlaps`)
and at least one of them writes. Each call waits only for the *earlier* calls in model order that
it conflicts with. So every result equals the result of running the batch one call at a time in
model order, and everything else runs at once: reads with no earlier conflicting write form the
parallel group; writes form serial chains per resource.

``deps[c]`` holds the immediate ones (:mod:`.plan_index`): every earlier call ``c`` conflicts
with is in ``deps[c]`` or waited for by one of those, transitively, and none it does not conflict
with is. A chain of writes is a chain (each waits for the one before), not a triangle. So a call
may start once its deps are *finished*: they have their results and so have the calls they wait
for (a call denied while those ran has its result early; turn_driver.py counts it later).

When more calls are ready than there are free worker processes, the order they start in decides
the makespan: each call's ``rank`` (the calls on the longest chain from it to the end of the plan,
itself included) lets the submitter start the calls that head long chains first, the classic
highest-level-first list schedule (critical path first). In a streamed turn the rank counts the
calls taken so far, so it is computed when a call is submitted.

Paths are canonicalised before they get here (links resolved beneath the workspace,
:func:`toolfleet.tools.resources.resolve`), as the file system stands when the call is planned.
A write on everything (``*``, e.g. ``run_command``) can change the links before the later calls
run, so every write planned after one has its ``fs:`` resources widened to ``fs:`` (the whole
workspace): it then conflicts with every file call around it, whichever spelling they use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..tools.resources import EVERYTHING, overlaps
from .plan_index import ConflictIndex


@dataclass(frozen=True)
class PlanItem:
    """One runnable call as the planner sees it."""

    call_id: str
    access: str  # "read" | "write"
    resources: frozenset[str]


def conflicts(a: PlanItem, b: PlanItem) -> bool:
    """True when ``a`` and ``b`` must not overlap in time."""
    if a.access != "write" and b.access != "write":
        return False
    return any(overlaps(x, y) for x in a.resources for y in b.resources)


@dataclass(frozen=True)
class Plan:
    """``order``: runnable calls in model order; ``deps[c]``: the earlier calls ``c`` waits for
    (its immediate conflicting predecessors: with theirs, transitively, every earlier call it conflicts with);
    ``rank[c]``: the number of calls on the longest chain from ``c`` on (1 for a call nothing waits for)."""

    order: tuple[str, ...]
    deps: Mapping[str, frozenset[str]]
    dependents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rank: Mapping[str, int] = field(default_factory=dict)

    def ready(self, finished: set[str] | frozenset[str]) -> list[str]:
        """Calls not in ``finished`` whose every dependency is in ``finished``, in model order."""
        return [c for c in self.order if c not in finished and self.deps[c] <= finished]

    @property
    def parallel_group(self) -> list[str]:
        """Calls that wait for nothing: they all start at once."""
        return [c for c in self.order if not self.deps[c]]

    def waves(self) -> list[list[str]]:
        """Calls by the earliest step they can start at (0 = at once), for display."""
        level: dict[str, int] = {}
        for c in self.order:
            level[c] = 1 + max((level[d] for d in self.deps[c]), default=-1)
        out: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
        for c in self.order:
            out[level[c]].append(c)
        return out


class Planner:
    """Plans calls one at a time, as they arrive (a streamed response).

    The rule only looks backwards (a call waits for earlier calls it conflicts with), so adding
    calls in model order gives exactly the plan of the whole batch: ``add`` never changes what an
    earlier call waits for. Not thread-safe; the turn calls it under its lock.
    """

    def __init__(self) -> None:
        self._items: list[PlanItem] = []
        self._position: dict[str, int] = {}
        self.deps: dict[str, frozenset[str]] = {}
        self.dependents: dict[str, list[str]] = {}
        self._links_may_change = False  # a write on everything was added
        self._index = ConflictIndex()
        self._rank_from = 0  # _rank holds the ranks of the calls from this position on ...
        self._rank: dict[str, int] = {}  # ... until the next add (which may lengthen every chain)

    def add(self, item: PlanItem) -> frozenset[str]:
        """Plan ``item`` after every call added so far; returns the calls it waits for."""
        if item.access == "write":
            if self._links_may_change:
                item = widened(item)
            self._links_may_change |= EVERYTHING in item.resources
        waits = self._index.add(item.call_id, item.access, item.resources)
        self._rank = {}
        self._position[item.call_id] = len(self._items)
        self._items.append(item)
        self.deps[item.call_id] = waits
        self.dependents[item.call_id] = []
        for d in waits:
            self.dependents[d].append(item.call_id)
        return waits

    def item(self, call_id: str) -> PlanItem:
        """The planned item of ``call_id`` (widened as it was planned); ``KeyError`` if never added."""
        return self._items[self._position[call_id]]

    def position(self, call_id: str) -> int:
        """``call_id``'s place in model order among the planned calls (0 first)."""
        return self._position[call_id]

    def ranks(self, call_ids: Iterable[str]) -> dict[str, int]:
        """For each of ``call_ids``: the calls on the longest chain from it through the calls added
        so far, itself included (1 when nothing waits for it). One pass over the plan's tail, kept
        until the next :meth:`add`: a batch whose calls start one after another (a chain, each
        sent when the one before has its result) sweeps the plan once, not once per call."""
        call_ids = list(call_ids)
        if not call_ids:
            return {}
        start = min(self._position[c] for c in call_ids)
        if not self._rank or start < self._rank_from:
            self._rank, self._rank_from = self._ranks(start), start
        return {c: self._rank[c] for c in call_ids}

    def _ranks(self, start: int = 0) -> dict[str, int]:
        rank: dict[str, int] = {}
        for item in reversed(self._items[start:]):  # dependents are always later in model order
            rank[item.call_id] = 1 + max((rank[d] for d in self.dependents[item.call_id]), default=0)
        return rank

    def plan(self) -> Plan:
        """The plan so far, as an immutable :class:`Plan`."""
        return Plan(
            order=tuple(item.call_id for item in self._items),
            deps=dict(self.deps),
            dependents={k: tuple(v) for k, v in self.dependents.items()},
            rank=self._ranks(),
        )


def widened(item: PlanItem) -> PlanItem:
    """``item`` with every ``fs:`` resource replaced by ``fs:`` (the whole workspace)."""
    if not any(r.startswith("fs:") for r in item.resources):
        return item
    return PlanItem(item.call_id, item.access, frozenset("fs:" if r.startswith("fs:") else r for r in item.resources))


def make_plan(items: Sequence[PlanItem]) -> Plan:
    """Plan ``items`` (given in model order)."""
    planner = Planner()
    for item in items:
        planner.add(item)
    return planner.plan()
