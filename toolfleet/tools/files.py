"""Built-in file tools over the turn's workspace. Reads are ``read`` on their path, writes
``write`` on theirs. Every path is resolved by the kernel beneath the workspace
(:mod:`.workspace`, :mod:`.beneath`): links inside are followed, anything leading outside is
``PERMISSION_DENIED``. Writes replace the file with a new one (:mod:`.writes`), so they never go
through a link or into a hard-linked file. ``grep`` and ``list_dir`` walk by directory fds and
never follow a symbolic link met on the way (like ``grep -r`` and ripgrep): ``grep`` skips them,
``list_dir`` shows them as ``name -> target``; a link given as the ``path`` itself is followed
when it stays inside. ``read_file`` and ``grep`` stream a file a block at a time (:mod:`.text_lines`)
and ``grep``'s output is bounded (a long matching line cut around its match, all matches within
:data:`MAX_GREP_OUTPUT_CHARS`); names that could forge an entry are printed quoted (:mod:`.names`)."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterator
from typing import Annotated

from pydantic import Field

from ..errors import ToolFailure
from . import text_lines
from .beneath import open_beneath
from .context import ToolContext
from .names import shown_name
from .resources import paths
from .spec import tool
from .workspace import (
    MAX_TEXT_FILE_BYTES,
    canonical_parts,
    open_directory,
    open_file,
    open_root,
    os_failure,
    spelling,
    too_large,
)
from .writes import replace_file

MAX_GREP_MATCHES = 200
MAX_GREP_LINE_CHARS = 2000  # of a matching line; a longer one is cut around its first match, saying so
MAX_GREP_OUTPUT_CHARS = 100_000  # of grep's matches in all; it stops there, saying so
MAX_GREP_FILE_BYTES = MAX_TEXT_FILE_BYTES  # larger files are skipped, and the answer says so
MAX_GREP_DEPTH = 64  # folders deeper than this below the searched one are not searched
MAX_GREP_DIR_ENTRIES = 100_000  # of a folder, searched; the rest are counted and said
MAX_LIST_ENTRIES = 10_000  # of a folder, listed by list_dir; the rest are counted and said
NOTE_NAMES = 5  # names listed per kind of skipped file
LINK_ARROW = " -> "  # list_dir's 'name -> target'
GREP_SEPARATORS = (":",)  # of grep's 'file:line:text': a path holding one is quoted


@tool(access="read", resources=paths("path"), timeout_s=30)
def read_file(
    path: str,
    ctx: ToolContext,
    offset: Annotated[int, Field(ge=1)] = 1,
    limit: Annotated[int, Field(ge=1, le=10_000)] = 2000,
) -> str:
    """Read a text file of the workspace (up to 20 MiB; read parts of a larger one with run_command).

    Args:
        path: File path relative to the workspace root.
        offset: First line to return, counting from 1.
        limit: Largest number of lines to return.
    """
    start, stop = offset - 1, offset - 1 + limit
    chunk: list[str] = []
    total = read = 0  # lines, bytes
    with open_file(ctx, path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_TEXT_FILE_BYTES:
            raise too_large(path, size)
        for block in text_lines.blocks(handle, MAX_TEXT_FILE_BYTES + 1):  # streamed: text_lines says why
            if text_lines.is_binary(block, read):
                raise ToolFailure(f"{path} is a binary file", "only text files can be read")
            read += len(block)
            count = text_lines.lines_in(block)
            if total < stop and total + count > start:
                pieces = text_lines.split(text_lines.decode(block), keepends=True)
                chunk.extend(text_lines.window(pieces, max(start - total, 0), stop - total))
            total += count
    if read > MAX_TEXT_FILE_BYTES:  # it grew while being read
        raise too_large(path, read)
    text = "".join(chunk)
    last = offset - 1 + len(chunk)
    if last < total:
        text += f"\n[lines {offset}-{last} of {total}; read on with offset={last + 1}]"
    return text


@tool(access="read", resources=paths("path"), timeout_s=30)
def list_dir(ctx: ToolContext, path: str = ".") -> str:
    """List a directory of the workspace: one entry per line, directories ending in '/', symbolic
    links as 'name -> target'; a name holding a control character or ' -> ' is quoted as $'...'.

    Args:
        path: Directory path relative to the workspace root.
    """
    rel = spelling(ctx, path)
    root_fd = open_root(ctx)
    try:
        fd = open_directory(root_fd, rel, path)
        try:
            entries, total = _read_dir(fd, MAX_LIST_ENTRIES)
            lines = []
            for entry in sorted(entries, key=lambda e: (not e.is_dir(follow_symlinks=False), e.name)):
                if entry.is_symlink():
                    lines.append(_link_line(root_fd, fd, rel, entry.name))
                else:
                    lines.append(_entry(entry.name) + ("/" if entry.is_dir(follow_symlinks=False) else ""))
            if total > len(entries):
                lines.append(f"[{len(entries)} of {total} entries shown: the first the file system gave, sorted; "
                             "list a subfolder, or narrow with run_command, e.g. ls | grep PATTERN]")
        finally:
            os.close(fd)
    finally:
        os.close(root_fd)
    return "\n".join(lines)


def _read_dir(dir_fd: int, limit: int) -> tuple[list[os.DirEntry[str]], int]:
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


def _entry(name: str) -> str:
    """A name as ``list_dir`` prints it: quoted when it holds a control character or `` -> ``."""
    return shown_name(name, (LINK_ARROW,))


def _link_line(root_fd: int, dir_fd: int, rel: str, name: str) -> str:
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return f"{_entry(name)}{LINK_ARROW}?"
    try:
        canonical_parts(root_fd, f"{rel}/{name}")
    except OSError:
        return f"{_entry(name)}{LINK_ARROW}{shown_name(target)} (outside the workspace or unresolvable: not followed)"
    return f"{_entry(name)}{LINK_ARROW}{shown_name(target)}"


@tool(access="read", resources=paths("path"), timeout_s=60)
def grep(ctx: ToolContext, pattern: str, path: str = ".", glob: str | None = None) -> str:
    """Search files for a regular expression (Python syntax); prints `file:line:text` per match
    (a file name holding ':' or a control character quoted as $'...'; lines past 2000 characters cut).

    Args:
        pattern: Regular expression to look for.
        path: File or directory to search, relative to the workspace root.
        glob: Only search files whose name matches this wildcard, e.g. "*.py".
    """
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolFailure(
            f"pattern {pattern!r} is not a valid regular expression: {exc}",
            "escape special characters such as ( [ . * with a backslash",
            code="INVALID_ARGUMENT",
        ) from exc
    rel = spelling(ctx, path)
    root_fd = open_root(ctx)
    try:
        try:
            top = open_beneath(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            shown = "/".join(canonical_parts(root_fd, rel))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise ToolFailure(f"path not found: {path}", "check the path with list_dir") from exc
            raise os_failure(exc, path) from exc
    finally:
        os.close(root_fd)
    skipped = _Skipped()
    found = _Found()
    try:
        mode = os.fstat(top).st_mode
        if stat.S_ISDIR(mode):
            files = _files(ctx, top, f"{shown}/" if shown else "", glob, skipped, 0)
        elif stat.S_ISREG(mode):
            files = iter([(shown, os.dup(top))])
        else:
            raise ToolFailure(f"{path} is not a regular file or directory", "give a file or directory")
        for file_name, fd in files:
            if not _search(fd, file_name, regex, found, skipped):
                return "\n".join([*found.lines, found.stopped, *skipped.notes()])
    finally:
        os.close(top)
    out = found.lines or [f"no match for {pattern!r} in {path}"]
    return "\n".join(out + skipped.notes())


class _Found:
    """grep's matches, within :data:`MAX_GREP_MATCHES` and :data:`MAX_GREP_OUTPUT_CHARS`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.chars = 0
        self.stopped = ""  # why grep stopped before the end, once it did

    def add(self, shown: str, number: int, source: str, end: int, match: re.Match[str]) -> bool:
        """Keep one match, in the line ``source[:end]``; False once grep must stop."""
        entry = f"{shown}:{number}:{_clipped(source, end, match)}"
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


def _clipped(source: str, end: int, match: re.Match[str]) -> str:
    """The line ``source[:end]``, or its :data:`MAX_GREP_LINE_CHARS` characters around the start
    of ``match`` with the characters cut before and after counted."""
    if end <= MAX_GREP_LINE_CHARS:
        return source[:end]
    start = min(max(match.start() - MAX_GREP_LINE_CHARS // 4, 0), end - MAX_GREP_LINE_CHARS)
    stop = start + MAX_GREP_LINE_CHARS
    before = f"[... {start} characters of the line cut ...]" if start else ""
    after = f"[... {end - stop} characters of the line cut ...]" if stop < end else ""
    return before + source[start:stop] + after


def _search(fd: int, shown: str, regex: re.Pattern[str], found: _Found, skipped: _Skipped) -> bool:
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


def _files(ctx: ToolContext, dir_fd: int, prefix: str, glob: str | None, skipped: _Skipped,
           depth: int) -> Iterator[tuple[str, int]]:
    """``(shown path, O_RDONLY fd)`` of the regular files below ``dir_fd``, by name, hidden
    folders left out. Each step opens one name with ``O_NOFOLLOW`` from the fd of the folder
    holding it, so no link is ever followed and no rename can lead the walk out."""
    ctx.check_cancelled()
    entries, total = _read_dir(dir_fd, MAX_GREP_DIR_ENTRIES)
    if total > len(entries):
        skipped.add(f"past the first {MAX_GREP_DIR_ENTRIES} entries of a folder",
                    f"{prefix or './'} ({total - len(entries)} of {total})", total - len(entries))
    for entry in sorted(entries, key=lambda e: e.name):
        name = entry.name
        if entry.is_symlink():
            skipped.add("symbolic links, not followed", prefix + name)
        elif entry.is_dir(follow_symlinks=False):
            if name.startswith("."):
                continue
            if depth >= MAX_GREP_DEPTH:
                skipped.add(f"folders deeper than {MAX_GREP_DEPTH} levels", prefix + name)
                continue
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError:  # replaced by a link or removed since it was listed
                continue
            try:
                yield from _files(ctx, sub, f"{prefix}{name}/", glob, skipped, depth + 1)
            finally:
                os.close(sub)
        elif glob is None or fnmatch.fnmatch(name, glob):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                             dir_fd=dir_fd)
            except OSError:
                continue
            if stat.S_ISREG(os.fstat(fd).st_mode):
                yield prefix + name, fd
            else:
                os.close(fd)


class _Skipped:
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


@tool(access="write", resources=paths("path"), timeout_s=30)
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Write a text file of the workspace, replacing it if it exists; parent folders are created.

    Args:
        path: File path relative to the workspace root.
        content: The whole new content of the file.
    """
    data = _encode(content, "content")
    info = replace_file(ctx, path, lambda old: data, needs_old=False)
    return f"wrote {info['bytes']} bytes to {path}" + _links_note(info)


@tool(access="write", resources=paths("path"), timeout_s=30)
def edit_file(ctx: ToolContext, path: str, old_string: str, new_string: str) -> str:
    """Replace the one occurrence of old_string in a file with new_string.

    Args:
        path: File path relative to the workspace root.
        old_string: Exact text to replace; it must occur exactly once in the file.
        new_string: Text to put in its place.
    """

    def edited(old: bytes | None) -> bytes:
        if old is None:
            raise ToolFailure(f"file not found: {path}", "check the path with list_dir or grep")
        if text_lines.is_binary(old):
            raise ToolFailure(f"{path} is a binary file", "only text files can be edited")
        text = old.decode("utf-8", errors="surrogateescape")  # bytes that are not UTF-8 stay as they were
        count = text.count(old_string) if old_string else 0
        if count == 0:
            raise ToolFailure(
                f"old_string was not found in {path}",
                "read the file first and copy the text exactly, including spaces and indentation",
            )
        if count > 1:
            raise ToolFailure(
                f"old_string occurs {count} times in {path}; it must occur exactly once",
                "include more surrounding lines in old_string to make it unique",
            )
        return _encode(text.replace(old_string, new_string, 1), "new_string", "surrogateescape")

    info = replace_file(ctx, path, edited, create_parents=False)
    return f"edited {path}: 1 replacement" + _links_note(info)


def _encode(text: str, field: str, errors: str = "strict") -> bytes:
    try:
        return text.encode("utf-8", errors=errors)
    except UnicodeEncodeError as exc:
        raise ToolFailure(f"{field} holds a character UTF-8 cannot encode (a lone surrogate) at {exc.start}",
                          "send valid Unicode text", code="INVALID_ARGUMENT") from exc


def _links_note(info: dict) -> str:
    n = info["other_links"]
    if not n:
        return ""
    return f" (the file it replaced had {n} other hard link(s); they keep the old content)"
