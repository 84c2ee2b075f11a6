"""Built-in file tools over the turn's workspace. Reads are ``read`` on their path, writes
``write`` on theirs. Every path is resolved by the kernel beneath the workspace
(:mod:`.workspace`, :mod:`.beneath`): links inside are followed, anything leading outside is
``PERMISSION_DENIED``. Writes replace the file with a new one (:mod:`.writes`), so they never go
through a link or into a hard-linked file. ``grep`` and ``list_dir`` walk by directory fds and
never follow a symbolic link met on the way (like ``grep -r`` and ripgrep): ``grep`` skips them,
``list_dir`` shows them as ``name -> target``; a link given as the ``path`` itself is followed
when it stays inside. ``read_file`` and ``grep`` stream a file a block at a time (:mod:`.text_lines`)
and ``grep``'s output is bounded (a long matching line cut around its match, all matches within
:data:`.grep_walk.MAX_GREP_OUTPUT_CHARS`; the walk is :mod:`.grep_walk`); names that could forge
an entry are printed quoted (:mod:`.names`)."""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Annotated

from pydantic import Field

from ..errors import ToolFailure
from . import text_lines
from .beneath import open_beneath
from .context import ToolContext
from .grep_walk import Found, Skipped, read_dir, search_file, walk
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

MAX_LIST_ENTRIES = 10_000  # of a folder, listed by list_dir; the rest are counted and said
LINK_ARROW = " -> "  # list_dir's 'name -> target'


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
            entries, total = read_dir(fd, MAX_LIST_ENTRIES)
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
    skipped = Skipped()
    found = Found()
    try:
        mode = os.fstat(top).st_mode
        if stat.S_ISDIR(mode):
            files = walk(ctx, top, f"{shown}/" if shown else "", glob, skipped, 0, [0])
        elif stat.S_ISREG(mode):
            files = iter([(shown, os.dup(top))])
        else:
            raise ToolFailure(f"{path} is not a regular file or directory", "give a file or directory")
        for file_name, fd in files:
            if not search_file(fd, file_name, regex, found, skipped):
                return "\n".join([*found.lines, found.stopped, *skipped.notes()])
    finally:
        os.close(top)
    out = found.lines or [f"no match for {pattern!r} in {path}"]
    return "\n".join(out + skipped.notes())


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
