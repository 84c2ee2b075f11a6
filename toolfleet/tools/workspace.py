"""Confining paths to a workspace root: ``..``, absolute paths and symlinks that leave it are
refused with ``PERMISSION_DENIED``."""

from __future__ import annotations

from pathlib import Path

from ..errors import PermissionDenied, ToolFailure
from .context import ToolContext


def workspace_of(ctx: ToolContext) -> Path:
    """The turn's workspace root, resolved. Raises ToolFailure if the turn has none."""
    if ctx.workspace is None:
        raise ToolFailure(
            "this tool needs a workspace and the turn has none",
            "submit the turn with workspace=<directory>",
        )
    return Path(ctx.workspace).resolve()


def resolve_path(ctx: ToolContext, path: str) -> Path:
    """Absolute, symlink-resolved path of ``path`` inside the workspace.

    Raises :class:`PermissionDenied` when it lies outside (after resolving ``..`` and symlinks).
    """
    root = workspace_of(ctx)
    candidate = (root / path).resolve()
    if candidate != root and not candidate.is_relative_to(root):
        raise PermissionDenied(
            f"path {path!r} is outside the workspace",
            "use a path relative to the workspace root, without '..' leaving it",
        )
    return candidate


def relative(ctx: ToolContext, path: Path) -> str:
    """``path`` as the model should see it: relative to the workspace root, '/'-separated."""
    rel = path.relative_to(workspace_of(ctx)).as_posix()
    return rel or "."
