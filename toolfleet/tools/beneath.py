"""Opening a path beneath a directory with the kernel doing the confinement (docs/design.md,
"Boundaries enforced by the kernel").

:func:`open_beneath` is ``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`` (Linux 5.6+):
the kernel resolves the whole path, symbolic links included, and fails with ``EXDEV`` the moment
any step would leave the directory (``..`` past it, an absolute path, an absolute symbolic link,
a relative one that climbs out), so the check and the open are one system call and no rename or
link swapped in between can escape. Python has no wrapper for ``openat2`` and the one maintained
library that does (``pathrs``, over the Rust libpathrs) needs a native library Debian does not
ship, so this calls the system call through ctypes (``syscall(437, ...)``, the number every Linux
architecture shares for it).

Where ``openat2`` is missing (``ENOSYS`` on kernels before 5.6, or ``EPERM`` from a container's
seccomp profile), :func:`walk` does the same resolution in user space: one ``openat(O_PATH |
O_NOFOLLOW)`` per component, starting from the directory's fd, reading each symbolic link with
``readlinkat`` on its own fd and resolving its target from the fd of the directory holding it;
``..`` goes back to an fd already held, never through the file system. No step ever names a path
the kernel could resolve outside, so the same races cannot escape; it only costs a few more system
calls. ``TOOLFLEET_BENEATH=walk`` in the environment forces it (for tests and diagnosis).

Both give the same answers: ``EXDEV`` for anything outside (absolute symbolic links too, even
ones that point back inside: they are refused, write relative links), ``ELOOP`` after 40 links,
``ENOENT``/``ENOTDIR`` as ``openat`` would. ``EAGAIN`` (the kernel saw a rename race while
resolving ``..``) is retried a bounded number of times.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections import deque

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
SYS_OPENAT2 = 437  # the same on every architecture since 5.6 (unified numbering)
MAX_LINKS = 40  # the kernel's MAXSYMLINKS
EAGAIN_TRIES = 64
RACE_RETRIES = 8  # the walk looks again at a name that changed between two system calls
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)  # includes O_DIRECTORY: test all its bits


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_syscall = None
_available: bool | None = None


def _libc_syscall():
    global _syscall
    if _syscall is None:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_OpenHow), ctypes.c_size_t]
        _syscall = fn
    return _syscall


def openat2(dirfd: int, path: str, flags: int, mode: int = 0,
            resolve: int = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) -> int:
    """``openat2(dirfd, path, {flags | O_CLOEXEC, mode, resolve})``: a new fd.

    Raises ``OSError`` with the kernel's errno (``ENOSYS`` where the kernel lacks it); ``EAGAIN``
    is retried up to :data:`EAGAIN_TRIES` times first."""
    takes_mode = flags & os.O_CREAT or (_O_TMPFILE and flags & _O_TMPFILE == _O_TMPFILE)
    how = _OpenHow(flags | os.O_CLOEXEC, mode if takes_mode else 0, resolve)
    raw = os.fsencode(path)
    call = _libc_syscall()
    for _ in range(EAGAIN_TRIES):
        fd = call(SYS_OPENAT2, dirfd, raw, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.EINTR):
            break
    raise OSError(code, os.strerror(code), path)


def have_openat2() -> bool:
    """True when ``openat2`` works here (probed once) and ``TOOLFLEET_BENEATH`` is not ``walk``."""
    global _available
    if os.environ.get("TOOLFLEET_BENEATH", "").lower() == "walk":
        return False
    if _available is None:
        root = os.open("/", os.O_PATH | os.O_CLOEXEC)
        try:
            os.close(openat2(root, ".", os.O_PATH))
            _available = True
        except (OSError, AttributeError):  # ENOSYS, EPERM (seccomp), no libc syscall
            _available = False
        finally:
            os.close(root)
    return _available


def open_beneath(dirfd: int, path: str, flags: int, mode: int = 0o666, *, follow: bool = True) -> int:
    """Open ``path`` (relative to the directory fd ``dirfd``) confined beneath that directory.

    ``flags`` are ``os.open`` flags (``O_CLOEXEC`` is always added); ``follow=False`` refuses a
    symbolic link as the last component (``ELOOP``, like ``O_NOFOLLOW``; with ``O_PATH`` the link
    itself is opened). Symbolic links inside are followed while they stay beneath. ``""`` means
    ``dirfd`` itself. Returns a new fd the caller closes. Raises ``OSError``: ``EXDEV`` when the
    path leaves the directory, ``ELOOP`` for too many links (or a refused last link), else as
    ``openat``.
    """
    path = path or "."
    if not follow:
        flags |= os.O_NOFOLLOW
    if have_openat2():
        return openat2(dirfd, path, flags, mode)
    fd, _ = walk(dirfd, path, flags, mode, follow=follow)
    return fd


def walk(dirfd: int, path: str, flags: int = os.O_PATH, mode: int = 0o666, *, follow: bool = True,
         partial: bool = False) -> tuple[int | None, list[str]]:
    """Resolve ``path`` beneath ``dirfd`` one component at a time; see the module docstring.

    Returns ``(fd, names)``: the opened fd (``flags`` as for :func:`open_beneath`) and the
    canonical names from ``dirfd`` to it (no ``.``, ``..`` or links). With ``partial=True`` a
    missing component is no error: ``fd`` is ``None`` and ``names`` is the canonical path of the
    deepest existing directory followed by the rest, normalised lexically (what the kernel would
    create). Raises ``OSError`` as :func:`open_beneath`.
    """
    if path.startswith("/"):
        raise OSError(errno.EXDEV, "absolute path refused beneath the directory", path)
    todo: deque[str] = deque(p for p in (path or ".").split("/") if p not in ("", "."))
    want_dir = path.endswith("/") or path.endswith("/.") or path.endswith("/..")
    fds: list[int] = []  # owned fds of the directories on the way; dirfd itself is not owned
    names: list[str] = []
    links = races = 0
    try:
        while todo:
            name = todo.popleft()
            last = not todo
            here = fds[-1] if fds else dirfd
            if name == "..":
                if not fds:
                    raise OSError(errno.EXDEV, "'..' leaves the directory", path)
                os.close(fds.pop())
                names.pop()
                continue
            final_flags = (flags | os.O_NOFOLLOW | (os.O_DIRECTORY if want_dir else 0)) if last else 0
            try:
                if last and not flags & os.O_PATH:
                    fd = os.open(name, final_flags | os.O_CLOEXEC, mode, dir_fd=here)
                else:
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
            except FileNotFoundError:
                if partial:
                    return None, _lexical(names, [name, *todo], path)
                raise
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                target = _readlink_or_none(name, here)  # a link as the last component?
                if target is None:
                    if races >= RACE_RETRIES:  # (a file opened as a folder ends here too, after a few looks)
                        raise
                    races += 1  # it was a link a moment ago (or is a plain file): look again
                    todo.appendleft(name)
                    continue
                if not follow:
                    raise OSError(errno.ELOOP, "the last component is a symbolic link", path) from None
                links = _follow(target, todo, links, path)
                continue
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                if last and not follow and flags & os.O_PATH and not want_dir:
                    return fd, [*names, name]  # O_PATH | O_NOFOLLOW: the link itself
                target = os.readlink("", dir_fd=fd)
                os.close(fd)
                if last and not follow:
                    raise OSError(errno.ELOOP, "the last component is a symbolic link", path)
                links = _follow(target, todo, links, path)
                continue
            if last:
                if flags & os.O_PATH and (flags & os.O_DIRECTORY or want_dir) and not stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
                return fd, [*names, name]
            if not stat.S_ISDIR(st.st_mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            fds.append(fd)
            names.append(name)
        # the path ended on a directory already held (or on dirfd itself): open it with the flags
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=fds[-1] if fds else dirfd), names
    finally:
        for fd in fds:
            os.close(fd)


def _follow(target: str, todo: deque[str], links: int, path: str) -> int:
    """Put a link's target in front of the components still to resolve; count the link."""
    links += 1
    if links > MAX_LINKS:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
    if target.startswith("/"):
        raise OSError(errno.EXDEV, "a symbolic link with an absolute target is refused beneath the directory", path)
    if not target:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    todo.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
    return links


def _readlink_or_none(name: str, dir_fd: int) -> str | None:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None


def _lexical(names: list[str], rest: list[str], path: str) -> list[str]:
    out = list(names)
    for part in rest:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise OSError(errno.EXDEV, "'..' leaves the directory", path)
            out.pop()
        else:
            out.append(part)
    return out
