"""Confining paths to the turn's workspace, with the kernel as the boundary (docs/design.md,
"Boundaries enforced by the kernel"; docs/guarantees.md, "Workspace confinement").

Every open of a workspace path goes through :func:`toolfleet.tools.beneath.open_beneath` from an
fd of the workspace directory: ``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`` (or
the ``O_NOFOLLOW`` walk where that is missing), so the check and the open are one system call.
``..`` past the root, absolute paths outside it, and symbolic links that leave it (or have
absolute targets) give ``PERMISSION_DENIED``; links that stay inside are followed.

An absolute path argument is accepted when it names the workspace (as given, or resolved)
followed by a relative path: the prefix is cut as text and the rest is resolved beneath the
root like any relative path, so ``/ws/../etc`` is still refused by the kernel.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ..errors import PermissionDenied, ToolFailure
from .beneath import open_beneath, walk
from .context import ToolContext

OUTSIDE_HINT = ("use a path relative to the workspace root; '..' that leaves it, and symbolic links that point "
                "outside it or have absolute targets, are refused")


def workspace_of(ctx: ToolContext) -> Path:
    """The turn's workspace root, resolved. Raises ToolFailure if the turn has none."""
    if ctx.workspace is None:
        raise ToolFailure(
            "this tool needs a workspace and the turn has none",
            "submit the turn with workspace=<directory>",
        )
    return Path(ctx.workspace).resolve()


def open_root(ctx: ToolContext) -> int:
    """A new ``O_RDONLY | O_DIRECTORY`` fd of the workspace root (the caller closes it). Raises
    ToolFailure when the turn has no workspace or this machine has no such directory."""
    root = workspace_of(ctx)
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ToolFailure(f"the workspace {str(root)!r} cannot be opened on this worker: {exc.strerror}",
                          "check that the workspace directory exists where the workers run") from exc


def spelling(ctx: ToolContext, path: str) -> str:
    """``path`` relative to the workspace root, as text (not yet resolved). Raises
    :class:`PermissionDenied` for an absolute path outside the workspace, ToolFailure
    (``INVALID_ARGUMENT``) for a path with a NUL byte."""
    if ctx.workspace is None:
        workspace_of(ctx)  # raises: no workspace
    return spelling_in(str(ctx.workspace), str(path))


def spelling_in(workspace: str, path: str) -> str:
    """:func:`spelling` for a workspace given as text (the dispatcher has no context)."""
    if "\0" in path:
        raise ToolFailure(f"path {path!r} contains a NUL byte", "give a plain file path", code="INVALID_ARGUMENT")
    if not path.startswith("/"):
        return path or "."
    for base in dict.fromkeys((workspace.rstrip("/"), os.path.realpath(workspace).rstrip("/"))):
        if path.rstrip("/") == base:
            return "."
        if base and path.startswith(base + "/"):
            return path[len(base) + 1:] or "."
    raise PermissionDenied(f"path {path!r} is outside the workspace", OUTSIDE_HINT)


def os_failure(exc: OSError, path: str) -> ToolFailure:
    """The tool error for an ``OSError`` met while resolving or opening ``path``."""
    code = exc.errno
    if code == errno.EXDEV:
        return PermissionDenied(f"path {path!r} is outside the workspace", OUTSIDE_HINT)
    if code == errno.ELOOP:
        return PermissionDenied(f"path {path!r} goes through too many symbolic links or a /proc magic link",
                                "give the path of the file itself")
    if code in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"the file system refused access to {path!r} ({exc.strerror})", "")
    if code == errno.ENOENT:
        return ToolFailure(f"file not found: {path}", "check the path with list_dir or grep")
    if code == errno.ENOTDIR:
        return ToolFailure(f"a component of {path!r} is not a directory", "check the path with list_dir")
    if code == errno.EISDIR:
        return ToolFailure(f"{path} is a directory, not a file", "use list_dir to see what it holds")
    if code == errno.ENAMETOOLONG:
        return ToolFailure(f"path {path!r} is too long", "use a shorter path", code="INVALID_ARGUMENT")
    return ToolFailure(f"{path}: {exc.strerror or exc}", "")


def canonical_parts(root_fd: int, rel: str) -> list[str]:
    """The names from the root to what ``rel`` names, with every link resolved beneath the root
    (no ``.``, ``..`` or links left). A path that does not exist yet: the deepest existing
    directory's names followed by the rest, normalised lexically. Raises ``OSError`` (``EXDEV``
    when it leads outside)."""
    fd, names = walk(root_fd, rel, os.O_PATH, partial=True)
    if fd is not None:
        os.close(fd)
    return names


def resolve_path(ctx: ToolContext, path: str) -> Path:
    """Absolute path of ``path`` inside the workspace, links resolved by a walk beneath the root.

    A **check** at one moment, not a safe way to open: the file system can change between this
    and a later ``open(result)``. Use :meth:`ToolContext.open` (or :func:`open_beneath` from
    :func:`open_root`) to open. Raises :class:`PermissionDenied` when it leads outside.
    """
    rel = spelling(ctx, path)
    root_fd = open_root(ctx)
    try:
        parts = canonical_parts(root_fd, rel)
    except OSError as exc:
        raise os_failure(exc, path) from exc
    finally:
        os.close(root_fd)
    return workspace_of(ctx).joinpath(*parts)


def open_regular(root_fd: int, rel: str, path: str, *, follow: bool = True) -> int:
    """An ``O_RDONLY`` fd of the regular file ``rel`` beneath the root (links inside followed;
    with ``follow=False`` a link as the last component is refused). FIFOs, devices and sockets
    are refused (a FIFO would block the call). Raises ToolFailure."""
    try:
        fd = open_beneath(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY, follow=follow)
    except OSError as exc:
        raise os_failure(exc, path) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise ToolFailure(f"{path} is a directory, not a file", "use list_dir to see what it holds")
        raise ToolFailure(f"{path} is not a regular file (a FIFO, device or socket)", "only regular files are read")
    os.set_blocking(fd, True)
    return fd


def open_directory(root_fd: int, rel: str, path: str) -> int:
    """An ``O_RDONLY | O_DIRECTORY`` fd of ``rel`` beneath the root. Raises ToolFailure."""
    try:
        return open_beneath(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise ToolFailure(f"not a directory: {path}", "give a directory path; list_dir '.' shows the root") from exc
        if exc.errno == errno.ENOENT:
            raise ToolFailure(f"path not found: {path}", "check the path with list_dir") from exc
        raise os_failure(exc, path) from exc


MAX_TEXT_FILE_BYTES = 20 * 1024 * 1024
"""Largest file read_file and edit_file take whole (grep skips larger ones and says so)."""


def read_bytes(ctx: ToolContext, path: str, max_bytes: int = MAX_TEXT_FILE_BYTES) -> bytes:
    """The whole content of the regular file ``path`` of the workspace, at most ``max_bytes``.
    Raises ToolFailure (a larger file: :func:`read_whole`)."""
    with open_file(ctx, path) as handle:
        return read_whole(handle, path, max_bytes)


def open_file(ctx: ToolContext, path: str) -> BinaryIO:
    """The regular file ``path`` of the workspace, open for reading (buffered; the caller closes
    it). Raises ToolFailure."""
    rel = spelling(ctx, path)
    root_fd = open_root(ctx)
    try:
        fd = open_regular(root_fd, rel, path)
    finally:
        os.close(root_fd)
    return os.fdopen(fd, "rb")


def read_whole(handle: BinaryIO, path: str, max_bytes: int = MAX_TEXT_FILE_BYTES) -> bytes:
    """All of the open file ``handle`` if it holds at most ``max_bytes``, else ToolFailure
    (``INVALID_ARGUMENT``): the file tools hold a file in the worker's memory, so a file of
    gigabytes (a sparse one costs no disk) must not reach them. Its size is checked before reading
    and by the read itself (a file that grows meanwhile)."""
    size = os.fstat(handle.fileno()).st_size
    data = handle.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        raise too_large(path, max(size, len(data)), max_bytes)
    return data


def too_large(path: str, size: int, max_bytes: int = MAX_TEXT_FILE_BYTES) -> ToolFailure:
    """The error for a file of ``size`` bytes, past what the file tools read or edit whole."""
    return ToolFailure(
        f"{path} is larger than the file tools read or edit whole ({size} bytes; at most {max_bytes})",
        "read parts of it with run_command (sed -n '1,200p', head, tail) or search it with grep",
        code="INVALID_ARGUMENT")


def relative(ctx: ToolContext, path: Path) -> str:
    """``path`` as the model should see it: relative to the workspace root, '/'-separated."""
    rel = path.relative_to(workspace_of(ctx)).as_posix()
    return rel or "."
