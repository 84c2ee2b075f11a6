"""Resources a call touches, and when two of them conflict (DESIGN.md, "Plan").

A resource is a string ``"<kind>:<path>"``, for example ``"fs:src/inventory/store.py"``, or
``"*"`` (everything). Two resources overlap when either is ``"*"``, or they have the same kind and
one path is a prefix of the other by whole components: ``fs:notes`` overlaps ``fs:notes/a.md``,
not ``fs:notes2``. ``fs:`` (the workspace root) overlaps every ``fs:`` path.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import Any

EVERYTHING = "*"


def path_resource(path: str, kind: str = "fs") -> str:
    """``"fs:<normalised path>"``; paths that are absolute or climb out map to the root ``fs:``.

    Normalisation is lexical (no file system access): the dispatcher plans without the workspace.
    """
    norm = posixpath.normpath(str(path).replace("\\", "/"))
    if norm in (".", "") or norm.startswith("/") or norm == ".." or norm.startswith("../"):
        return f"{kind}:"
    return f"{kind}:{norm}"


def overlaps(a: str, b: str) -> bool:
    """True when resources ``a`` and ``b`` may touch the same thing."""
    if a == EVERYTHING or b == EVERYTHING:
        return True
    kind_a, _, path_a = a.partition(":")
    kind_b, _, path_b = b.partition(":")
    if kind_a != kind_b:
        return False
    if not path_a or not path_b or path_a == path_b:
        return True
    return path_b.startswith(path_a + "/") or path_a.startswith(path_b + "/")


def paths(*arg_names: str, default: str = ".") -> Callable[[Mapping[str, Any]], list[str]]:
    """Resource function for tools whose arguments ``arg_names`` are workspace paths.

    This declares what a call touches, for planning; it does not confine the path. The handler
    does that with ``ctx.resolve_path(path)`` (``PERMISSION_DENIED`` outside the workspace)."""

    def resources(arguments: Mapping[str, Any]) -> list[str]:
        return [path_resource(str(arguments.get(name) or default)) for name in arg_names]

    resources.declared = [f"fs:{{{name}}}" for name in arg_names]  # type: ignore[attr-defined]
    return resources


def resolve(
    resources: Callable[[Mapping[str, Any]], Iterable[str]] | None, arguments: Mapping[str, Any]
) -> frozenset[str]:
    """The resources of one call. A tool that declares no resource function, or whose function
    fails, touches everything (the safe default); one that returns no resources touches nothing."""
    if resources is None:
        return frozenset({EVERYTHING})
    try:
        found = frozenset(str(r) for r in resources(arguments))
    except Exception:  # a broken resource function must not break planning
        return frozenset({EVERYTHING})
    return found
