"""``grep``'s walk of a folder and its search of one file (the tool itself is :func:`.files.grep`).

The walk goes by directory fds and never follows a symbolic link met on the way (like ``grep -r``
and ripgrep): each step opens one name with ``O_NOFOLLOW`` from the fd of the folder holding it.
What it holds is bounded: names per folder (:data:`MAX_GREP_DIR_ENTRIES`) and in all across the
folders it is inside (:data:`MAX_GREP_HELD_ENTRIES`), matches and their characters
(:data:`MAX_GREP_MATCHES`, :data:`MAX_GREP_OUTPUT_CHARS`), one file a block at a time
(:mod:`.text_lines`). What it did not search is counted and said (:class:`Skipped`), never left out
silently. docs/guarantees.md FT1.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterator

from . import text_lines
from .context import ToolContext
from .names import shown_name
from .workspace import MAX_TEXT_FILE_BYTES

MAX_GREP_MATCHES = 200
MAX_GREP_LINE_CHARS = 2000  # of a matching line; a longer one is cut around its first match, saying so
MAX_GREP_OUTPUT_CHARS = 100_000  # of grep's matches in all; it stops there, saying so
MAX_GREP_FILE_BYTES = MAX_TEXT_FILE_BYTES  # larger files are skipped, and the answer says so
MAX_GREP_DEPTH = 64  # folders deeper than this below the searched one are not searched
MAX_GREP_DIR_ENTRIES = 100_000  # of a folder, searched; the rest are counted and said
# names held at once by the folders grep is inside (each keeps its sorted names while grep walks
# below it): a deeper folder gets what is left, the rest counted and said (64 nested folders of
# 50,000 long names held 620 MiB; now about 100 bytes + its length per name held)
MAX_GREP_HELD_ENTRIES = 200_000
NOTE_NAMES = 5  # names listed per kind of skipped file
GREP_SEPARATORS = (":",)  # of grep's 'file:line:text': a path holding one is quoted


def read_dir(dir_fd: int, limit: int) -> tuple[list[os.DirEntry[str]], int]:
    """Up to ``limit`` entries of a folder, in the order the file system gives them, and how many
    it holds: the rest are counted, not kept (a million names made by run_command must not all be
    held)."""
    kept: list[os.DirEntry[str]] = []
    total = 0
    with os.scandir(dir_fd) as it:
        for entry in it:
            total += 1
            if len(kept) < limit:
                kept.append(entry)
    return kept, total


class Found:
    """grep's matches, within :data:`MAX_GREP_MATCHES` and :data:`MAX_GREP_OUTPUT_CHARS`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.chars = 0
        self.stopped = ""  # why grep stopped before the end, once it did

    def add(self, shown: str, number: int, source: str, end: int, match: re.Match[str]) -> bool:
        """Keep one match, in the line ``source[:end]``; False once grep must stop."""
        entry = f"{shown}:{number}:{clipped(source, end, match)}"
        if self.chars + len(entry) > MAX_GREP_OUTPUT_CHARS:
            self.stopped = (f"[stopped after {len(self.lines)} matches: grep's output reached its "
                            f"{MAX_GREP_OUTPUT_CHARS}-character limit; narrow the pattern, path or glob]")
            return False
        self.lines.append(entry)
        self.chars += len(entry) + 1
        if len(self.lines) >= MAX_GREP_MATCHES:
            self.stopped = f"[stopped at {MAX_GREP_MATCHES} matches; narrow the pattern or path]"
            return False
        return True


def clipped(source: str, end: int, match: re.Match[str]) -> str:
    """The line ``source[:end]``, or its :data:`MAX_GREP_LINE_CHARS` characters around the start
    of ``match`` with the characters cut before and after counted."""
    if end <= MAX_GREP_LINE_CHARS:
        return source[:end]
    start = min(max(match.start() - MAX_GREP_LINE_CHARS // 4, 0), end - MAX_GREP_LINE_CHARS)
    stop = start + MAX_GREP_LINE_CHARS
    before = f"[... {start} characters of the line cut ...]" if start else ""
    after = f"[... {end - stop} characters of the line cut ...]" if stop < end else ""
    return before + source[start:stop] + after


def search_file(fd: int, shown: str, regex: re.Pattern[str], found: Found, skipped: Skipped) -> bool:
    """Search one open file, a block at a time (tools/text_lines.py); False once grep must stop."""
    with os.fdopen(fd, "rb") as handle:
        if os.fstat(handle.fileno()).st_size > MAX_GREP_FILE_BYTES:
            skipped.add(f"larger than {MAX_GREP_FILE_BYTES // 2**20} MiB", shown)
            return True
        quoted = shown_name(shown, GREP_SEPARATORS)
        number = read = 0
        try:
            for block in text_lines.blocks(handle, MAX_GREP_FILE_BYTES + 1):
                if text_lines.is_binary(block, read):
                    skipped.add("binary", shown)
                    return True
                read += len(block)
                text = text_lines.decode(block)
                if len(text) <= text_lines.SPLIT_WHOLE_CHARS:  # the common case, at full speed
                    for line in text.splitlines():
                        number += 1
                        match = regex.search(line)
                        if match and not found.add(quoted, number, line, len(line), match):
                            return False
                    continue
                for source, end in text_lines.spans(text):
                    number += 1
                    match = regex.search(source, 0, end)  # the line source[:end], not copied
                    if match and not found.add(quoted, number, source, end, match):
                        return False
        except OSError:
            skipped.add("unreadable", shown)
    return True


def walk(ctx: ToolContext, dir_fd: int, prefix: str, glob: str | None, skipped: Skipped,
           depth: int, held: list[int]) -> Iterator[tuple[str, int]]:
    """``(shown path, O_RDONLY fd)`` of the regular files below ``dir_fd``, by name, hidden
    folders left out. Each step opens one name with ``O_NOFOLLOW`` from the fd of the folder
    holding it, so no link is ever followed and no rename can lead the walk out. ``held[0]``: the
    names the folders above hold (:data:`MAX_GREP_HELD_ENTRIES` in all). A file or folder that
    cannot be opened (but for one removed since it was listed) is said, never left out silently."""
    ctx.check_cancelled()
    limit = min(MAX_GREP_DIR_ENTRIES, MAX_GREP_HELD_ENTRIES - held[0])
    listed, total = read_dir(dir_fd, limit)
    if total > len(listed):
        why = (f"past the first {MAX_GREP_DIR_ENTRIES} entries of a folder" if limit == MAX_GREP_DIR_ENTRIES else
               f"past the first {limit} entries of a folder: grep holds {MAX_GREP_HELD_ENTRIES} names at once "
               "across the folders it is inside")
        skipped.add(why, f"{prefix or './'} ({total - len(listed)} of {total})", total - len(listed))
    # names and kinds only (a DirEntry holds more), sorted; the folder's share of the bound until it is done
    entries = sorted((e.name, "l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False) else "f")
                     for e in listed)
    del listed
    held[0] += len(entries)
    try:
        for name, kind in entries:
            if kind == "l":
                skipped.add("symbolic links, not followed", prefix + name)
            elif kind == "d":
                if name.startswith("."):
                    continue
                if depth >= MAX_GREP_DEPTH:
                    skipped.add(f"folders deeper than {MAX_GREP_DEPTH} levels", prefix + name)
                    continue
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError as exc:
                    _not_opened(exc, prefix + name, skipped)
                    continue
                try:
                    yield from walk(ctx, sub, f"{prefix}{name}/", glob, skipped, depth + 1, held)
                finally:
                    os.close(sub)
            elif glob is None or fnmatch.fnmatch(name, glob):
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                                 dir_fd=dir_fd)
                except OSError as exc:
                    _not_opened(exc, prefix + name, skipped)
                    continue
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    yield prefix + name, fd
                else:
                    os.close(fd)
    finally:
        held[0] -= len(entries)


def _not_opened(exc: OSError, shown: str, skipped: Skipped) -> None:
    """A name listed a moment ago that would not open: removed since (said nowhere: it is gone),
    replaced by a link (``ELOOP``, ``ENOTDIR``: not followed), or refused (a lease held on it,
    ``EAGAIN``; its mode, ``EACCES``): said as unreadable."""
    if exc.errno == errno.ENOENT:
        return
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        skipped.add("symbolic links, not followed", shown)
    else:
        skipped.add("unreadable", shown)


class Skipped:
    """What grep did not search, by kind: how many, and the first :data:`NOTE_NAMES` names (not
    all of them: a folder of a million links must not make a list of a million names)."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[int, int, list[str]]] = {}  # kind: (count, names given, names kept)

    def add(self, kind: str, name: str, count: int = 1) -> None:
        before, given, names = self.kinds.get(kind, (0, 0, []))
        if len(names) < NOTE_NAMES:
            names.append(name)
        self.kinds[kind] = (before + count, given + 1, names)

    def notes(self) -> list[str]:
        notes = []
        for kind, (count, given, names) in self.kinds.items():
            more = f", and {given - len(names)} more" if given > len(names) else ""
            listed = ", ".join(shown_name(name) for name in names)
            notes.append(f"[{count} not searched ({kind}): {listed}{more}]")
        return notes
