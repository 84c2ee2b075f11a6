"""Writing workspace files without ever writing through a link (docs/guarantees.md, "Workspace
confinement").

A write never opens the file it replaces for writing. It resolves the file's canonical path
beneath the workspace (links inside followed, see :mod:`.workspace`), opens the parent directory
beneath the root (``openat2``), creating missing parents with ``mkdirat`` from the fd of the one
above, writes a new temporary file in that directory (``O_CREAT | O_EXCL | O_NOFOLLOW``), calls
``ctx.check_fence()``, and renames it over the name (``renameat`` on the same directory fd). So:

- a symbolic link swapped in for the name or for a parent cannot redirect the write (the rename
  replaces the directory entry; the parent fd was opened beneath the root);
- a file with other hard links (``ln /outside/f hl``) is replaced by a new file: the other links,
  wherever they are, keep the old content;
- readers see the old content or the new one, never a mix.

The replaced file's permission bits are kept but for set-user-ID and set-group-ID (and its owner,
when the worker runs as root); a new file gets ``0o666`` less the process's umask, as ``open(2)``
would. The temporary file is ``0o600`` until its content is complete and its mode set: another
local user cannot open it in between (a breaker read a 0600 ``.env``'s content that way). Data
is not fsynced: the rename is atomic for readers, not a promise across a power cut.
A directory fd held here could be moved outside the workspace by someone who can write outside it;
the command sandbox denies that to commands, and a process outside it is out of scope.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any

from ..errors import PermissionDenied, ToolFailure
from .beneath import open_beneath
from .context import ToolContext
from .workspace import canonical_parts, open_regular, open_root, os_failure, read_whole, spelling

NAME_MAX = 255


def replace_file(ctx: ToolContext, path: str, produce: Callable[[bytes | None], bytes], *,
                 create_parents: bool = True, needs_old: bool = True, after_old: bool = False) -> dict[str, Any]:
    """Replace the file ``path`` with ``produce(old)`` (``old`` is its content, ``None`` when it
    does not exist; with ``needs_old=False``, always ``None``: the old content is not read),
    atomically, as the module docstring says. Missing parents are created (with
    ``create_parents=False`` they give ``file not found``). An old content over
    :data:`~.workspace.MAX_TEXT_FILE_BYTES` is not read: ToolFailure (``INVALID_ARGUMENT``).
    With ``after_old=True`` (and ``needs_old=False``) the new file is the old content, copied by
    the kernel in chunks whatever its size, then ``produce(None)``: an append.

    Returns ``{"path": canonical path relative to the root, "bytes": size written, "other_links":
    how many other hard links the replaced file had (they keep the old content)}``. Raises
    ToolFailure (``PERMISSION_DENIED`` for paths leading outside), or whatever ``produce`` or
    ``ctx.check_fence()`` raise (nothing is changed then).
    """
    rel = spelling(ctx, path)
    if rel.endswith("/") or rel.rsplit("/", 1)[-1] in (".", ".."):  # open(2) would say EISDIR
        raise ToolFailure(f"{path} ends with '/', '/.' or '/..': that names a folder", "give a file path")
    root_fd = open_root(ctx)
    try:
        try:
            parts = canonical_parts(root_fd, rel)
        except OSError as exc:
            raise os_failure(exc, path) from exc
        if not parts:
            raise ToolFailure(f"{path} is the workspace root, a directory", "give a file path")
        parent = _open_parent(root_fd, parts[:-1], path, create_parents)
    finally:
        os.close(root_fd)
    try:
        return _replace_in(ctx, parent, parts, path, produce, needs_old, after_old)
    finally:
        os.close(parent)


def _replace_in(ctx: ToolContext, parent: int, parts: list[str], path: str,
                produce: Callable[[bytes | None], bytes], needs_old: bool, after_old: bool = False) -> dict[str, Any]:
    name = parts[-1]
    try:
        st: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise os_failure(exc, path) from exc
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ToolFailure(f"{path} is a directory", "give a file path")
        if stat.S_ISLNK(st.st_mode):  # it was not a link when resolved a moment ago
            raise PermissionDenied(f"{path} changed into a symbolic link while being written; nothing was written",
                                   "write to the link's target instead")
        if not stat.S_ISREG(st.st_mode):
            raise ToolFailure(f"{path} is not a regular file (a FIFO, device or socket)", "give a regular file")
    old = None
    old_fd = None
    if st is not None and needs_old:
        fd = open_regular(parent, name, path, follow=False)  # a link swapped in since is refused
        with os.fdopen(fd, "rb") as handle:
            old = read_whole(handle, path)
    elif st is not None and after_old:
        old_fd = open_regular(parent, name, path, follow=False)
    try:
        data = produce(old)
    except BaseException:
        if old_fd is not None:
            os.close(old_fd)
        raise
    tmp = _temp_name(name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    except BaseException as exc:
        if old_fd is not None:
            os.close(old_fd)
        if isinstance(exc, OSError):
            raise os_failure(exc, path) from exc
        raise
    copied = 0
    try:
        try:
            if old_fd is not None:  # the old content first, in kernel-sized chunks: never all in memory
                while chunk := os.sendfile(fd, old_fd, None, 1 << 20):
                    copied += chunk
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, _new_mode() if st is None else stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            if st is not None:
                if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                    try:
                        os.fchown(fd, st.st_uid, st.st_gid)
                    except PermissionError:  # ids not mapped in this user namespace
                        pass
        finally:
            os.close(fd)
            if old_fd is not None:
                os.close(old_fd)
        ctx.check_fence()
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=parent)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise os_failure(exc, path) from exc
        raise
    return {"path": "/".join(parts), "bytes": copied + len(data), "other_links": (st.st_nlink - 1) if st else 0}


def _temp_name(name: str) -> str:
    """``.<name, cut>.tf-<token>.tmp``, at most :data:`NAME_MAX` *bytes* (a name of multi-byte
    characters is cut by its encoded length; a character cut in two stays as its bytes)."""
    token = secrets.token_hex(6)
    stem = os.fsencode(name)[: NAME_MAX - len(token) - 12]
    return f".{os.fsdecode(stem)}.tf-{token}.tmp"


def _new_mode() -> int:
    """The mode ``open(2)`` gives a new file asked for with ``0o666``: less the process's umask,
    read from ``/proc/self/status`` (setting it to read it would race with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def _open_parent(root_fd: int, parts: list[str], path: str, create: bool) -> int:
    """An fd of the directory ``parts`` beneath the root, creating what is missing with
    ``mkdirat`` from the fd of the directory above (each step beneath that fd)."""
    flags = os.O_RDONLY | os.O_DIRECTORY
    try:
        return open_beneath(root_fd, "/".join(parts), flags)
    except OSError as exc:
        if exc.errno != errno.ENOENT or not create:
            raise os_failure(exc, path) from exc
    current = open_beneath(root_fd, ".", flags)
    try:
        for name in parts:
            try:
                nxt = open_beneath(current, name, flags)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o777, dir_fd=current)
                except FileExistsError:
                    pass
                nxt = open_beneath(current, name, flags)
            os.close(current)
            current = nxt
    except OSError as exc:
        os.close(current)
        raise os_failure(exc, path) from exc
    return current


class AtomicFile(io.IOBase):
    """A file opened for writing by :meth:`ToolContext.open`: writes go to a buffer; ``close()``
    (or leaving the ``with`` block normally) replaces the file at once through
    :func:`replace_file`; leaving it by an exception, or :meth:`discard`, changes nothing."""

    def __init__(self, ctx: ToolContext, path: str, *, text: bool, append: bool, encoding: str | None,
                 errors: str | None, newline: str | None) -> None:
        self._ctx, self._path, self._append = ctx, path, append
        self._raw = io.BytesIO()
        self._text = io.TextIOWrapper(self._raw, encoding=encoding or "utf-8", errors=errors,
                                      newline=newline, write_through=True) if text else None
        self._done = False
        self.result: dict[str, Any] | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._done:
            raise ValueError("I/O operation on closed file")
        return (self._text or self._raw).write(data)

    def discard(self) -> None:
        """Close without changing the file."""
        self._done = True
        super().close()

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        if self._text is not None:
            self._text.flush()
        data = self._raw.getvalue()
        try:
            self.result = replace_file(self._ctx, self._path, lambda old: data, needs_old=False,
                                       after_old=self._append)
        finally:
            super().close()

    def __exit__(self, kind: Any, value: Any, trace: Any) -> None:
        if kind is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:  # never committed implicitly by the garbage collector
        self._done = True


def open_in_workspace(ctx: ToolContext, path: str, mode: str = "r", *, encoding: str | None = None,
                      errors: str | None = None, newline: str | None = None) -> Any:
    """Implementation of :meth:`ToolContext.open`; see there."""
    kind = mode.replace("t", "")
    if kind in ("r", "rb"):
        root_fd = open_root(ctx)
        try:
            fd = open_regular(root_fd, spelling(ctx, path), path)
        finally:
            os.close(root_fd)
        if kind == "rb":
            return os.fdopen(fd, "rb")
        return os.fdopen(fd, "r", encoding=encoding or "utf-8", errors=errors, newline=newline)
    if kind in ("w", "wb", "a", "ab"):
        return AtomicFile(ctx, path, text=not kind.endswith("b"), append=kind.startswith("a"),
                          encoding=encoding, errors=errors, newline=newline)
    raise ValueError(f"mode {mode!r} is not supported: use 'r', 'rb', 'w', 'wb', 'a' or 'ab'")
