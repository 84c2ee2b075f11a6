"""Resources a call touches, and when two of them conflict (docs/design.md, "Plan").

A resource is a string ``"<kind>:<path>"``, for example ``"fs:src/inventory/store.py"``, or
``"*"`` (everything). Two resources overlap when either is ``"*"``, or they have the same kind and
one path is a prefix of the other by whole components: ``fs:notes`` overlaps ``fs:notes/a.md``,
not ``fs:notes2``. ``fs:`` (the workspace root) overlaps every ``fs:`` path.

Resources name files, not spellings: when the dispatcher can see the turn's workspace,
:func:`resolve` canonicalises every ``fs:`` path inside it (:func:`canonical_path_resource`:
links resolved by a walk beneath the workspace, a path that does not exist yet by its deepest
existing parent), so ``alias/x.txt`` and ``sub/x.txt`` with ``alias -> sub`` are one resource
and conflict. When it cannot (the workspace is on another machine), paths stay lexical
(:func:`path_resource`): two spellings of one file through a link are then two resources.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError, ToolFailure
from .workspace import canonical_parts, spelling_in

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


def fixed(*resources: str) -> Callable[[Mapping[str, Any]], list[str]]:
    """Resource function for a tool whose calls touch the same resources whatever their
    arguments; ``fixed()`` (or ``resources=[]`` on :func:`~toolfleet.tools.spec.tool`): calls that
    touch nothing of the workspace, which conflict with no call. Published in the catalog as is, so
    a dispatcher that knows the tool only from there plans it the same way."""
    kept = [str(r) for r in resources]

    def constant(arguments: Mapping[str, Any]) -> list[str]:
        return list(kept)

    constant.fixed_declared = tuple(kept)  # type: ignore[attr-defined]  # published form (tools/published.py)
    return constant


def resource_fn(value: Any, tool: str) -> Callable[[Mapping[str, Any]], Iterable[str]] | None:
    """A tool's ``resources`` option as a resource function: ``None`` (everything), a function of
    the arguments, or a list, tuple or set of resource strings (:func:`fixed`; ``[]``: nothing).
    Raises :class:`ConfigurationError` naming ``tool`` for anything else (a list used to be taken
    for a function that fails: every call a write on everything)."""
    if value is None or callable(value):
        return value
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(r, str) for r in value):
        return fixed(*sorted(value) if isinstance(value, (set, frozenset)) else value)
    raise ConfigurationError(f"tool {tool}: resources must be a function of the arguments (e.g. paths('path')) "
                             f"or a list of resource strings ([] touches nothing), not {type(value).__name__}")


def paths(*arg_names: str, default: str = ".") -> Callable[[Mapping[str, Any]], list[str]]:
    """Resource function for tools whose arguments ``arg_names`` are workspace paths.

    This declares what a call touches, for planning; it does not confine the path. The handler
    does that with ``ctx.resolve_path(path)`` (``PERMISSION_DENIED`` outside the workspace)."""

    def resources(arguments: Mapping[str, Any]) -> list[str]:
        return [path_resource(str(arguments.get(name) or default)) for name in arg_names]

    def spellings(arguments: Mapping[str, Any]) -> list[str]:
        return [str(arguments.get(name) or default) for name in arg_names]

    resources.declared = [f"fs:{{{name}}}" for name in arg_names]  # type: ignore[attr-defined]
    resources.spellings = spellings  # type: ignore[attr-defined]  # raw paths, for canonicalising
    resources.paths_declared = (arg_names, default)  # type: ignore[attr-defined]  # published form (tools/published.py)
    return resources


def resolve(
    resources: Callable[[Mapping[str, Any]], Iterable[str]] | None,
    arguments: Mapping[str, Any],
    workspace: str | None = None,
) -> frozenset[str]:
    """The resources of one call. A tool that declares no resource function, or whose function
    fails, touches everything (the safe default); one that returns no resources touches nothing.
    With ``workspace`` (the turn's, as the workers see it) the ``fs:`` resources are
    canonicalised when this machine can open it (module docstring)."""
    if resources is None:
        return frozenset({EVERYTHING})
    try:
        found = frozenset(str(r) for r in resources(arguments))
    except Exception:  # a broken resource function must not break planning
        return frozenset({EVERYTHING})
    if workspace is None or not any(r.startswith("fs:") for r in found):
        return found
    root_fd = _open_workspace(workspace)
    if root_fd is None:
        return found  # the workspace is not on this machine: lexical
    try:
        spellings = getattr(resources, "spellings", None)
        if spellings is not None:  # paths(): canonicalise what the model wrote, not its lexical form
            try:
                raw = list(spellings(arguments))
            except Exception:
                raw = None
            if raw is not None:
                rest = frozenset(r for r in found if not r.startswith("fs:"))
                return rest | {canonical_path_resource(p, root_fd, workspace) for p in raw}
        return frozenset(canonical_path_resource(r[3:], root_fd, workspace) if r.startswith("fs:") else r
                         for r in found)
    finally:
        os.close(root_fd)


def _open_workspace(workspace: str) -> int | None:
    try:
        return os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None


def canonical_path_resource(path: str, root_fd: int, workspace: str, kind: str = "fs") -> str:
    """``"fs:<canonical path>"`` of ``path`` inside the workspace open as ``root_fd``: links
    resolved beneath the root, a path that does not exist yet by its deepest existing parent and
    the rest. A path that leads outside (``..``, an absolute path elsewhere, a link out) is
    ``fs:``, the whole workspace: the call will be refused, and this plans it safely meanwhile.
    A path that cannot be resolved for another reason (a file used as a folder) stays lexical."""
    try:
        rel = spelling_in(workspace, str(path))
    except ToolFailure:
        return f"{kind}:"
    try:
        parts = canonical_parts(root_fd, rel)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.ELOOP):
            return f"{kind}:"
        return path_resource(rel, kind)
    except ValueError:
        return f"{kind}:"
    return f"{kind}:{'/'.join(parts)}"
