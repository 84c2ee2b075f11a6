"""Built-in file tools over the turn's workspace. Reads are ``read`` on their path, writes
``write`` on theirs; every path is confined to the workspace (:mod:`.workspace`)."""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Annotated

from pydantic import Field

from ..errors import ToolFailure
from .context import ToolContext
from .resources import paths
from .spec import tool
from .workspace import relative, resolve_path

MAX_GREP_MATCHES = 200


def _text(ctx: ToolContext, path: str) -> str:
    target = resolve_path(ctx, path)
    if not target.exists():
        raise ToolFailure(f"file not found: {path}", "check the path with list_dir or grep")
    if target.is_dir():
        raise ToolFailure(f"{path} is a directory, not a file", "use list_dir to see what it holds")
    data = target.read_bytes()
    if b"\0" in data[:8192]:
        raise ToolFailure(f"{path} is a binary file", "only text files can be read")
    return data.decode("utf-8", errors="replace")


@tool(access="read", resources=paths("path"), timeout_s=30)
def read_file(
    path: str,
    ctx: ToolContext,
    offset: Annotated[int, Field(ge=1)] = 1,
    limit: Annotated[int, Field(ge=1, le=10_000)] = 2000,
) -> str:
    """Read a text file of the workspace.

    Args:
        path: File path relative to the workspace root.
        offset: First line to return, counting from 1.
        limit: Largest number of lines to return.
    """
    lines = _text(ctx, path).splitlines(keepends=True)
    chunk = lines[offset - 1 : offset - 1 + limit]
    text = "".join(chunk)
    last = offset - 1 + len(chunk)
    if last < len(lines):
        text += f"\n[lines {offset}-{last} of {len(lines)}; read on with offset={last + 1}]"
    return text


@tool(access="read", resources=paths("path"), timeout_s=30)
def list_dir(ctx: ToolContext, path: str = ".") -> str:
    """List a directory of the workspace: one entry per line, directories ending in '/'.

    Args:
        path: Directory path relative to the workspace root.
    """
    target = resolve_path(ctx, path)
    if not target.is_dir():
        raise ToolFailure(f"not a directory: {path}", "give a directory path; list_dir '.' shows the root")
    entries = sorted(target.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    return "\n".join(p.name + ("/" if p.is_dir() else "") for p in entries)


@tool(access="read", resources=paths("path"), timeout_s=60)
def grep(ctx: ToolContext, pattern: str, path: str = ".", glob: str | None = None) -> str:
    """Search files for a regular expression (Python syntax); prints `file:line:text` per match.

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
    target = resolve_path(ctx, path)
    if not target.exists():
        raise ToolFailure(f"path not found: {path}", "check the path with list_dir")
    files = [target] if target.is_file() else _walk(target, glob)
    matches: list[str] = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8", errors="strict")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if regex.search(line):
                matches.append(f"{relative(ctx, file)}:{number}:{line}")
                if len(matches) >= MAX_GREP_MATCHES:
                    matches.append(f"[stopped at {MAX_GREP_MATCHES} matches; narrow the pattern or path]")
                    return "\n".join(matches)
    return "\n".join(matches) if matches else f"no match for {pattern!r} in {path}"


def _walk(root: os.PathLike[str], glob: str | None) -> list:
    from pathlib import Path

    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if glob is None or fnmatch.fnmatch(name, glob):
                found.append(Path(folder) / name)
    return found


@tool(access="write", resources=paths("path"), timeout_s=30)
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Write a text file of the workspace, replacing it if it exists; parent folders are created.

    Args:
        path: File path relative to the workspace root.
        content: The whole new content of the file.
    """
    target = resolve_path(ctx, path)
    if target.is_dir():
        raise ToolFailure(f"{path} is a directory", "give a file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {path}"


@tool(access="write", resources=paths("path"), timeout_s=30)
def edit_file(ctx: ToolContext, path: str, old_string: str, new_string: str) -> str:
    """Replace the one occurrence of old_string in a file with new_string.

    Args:
        path: File path relative to the workspace root.
        old_string: Exact text to replace; it must occur exactly once in the file.
        new_string: Text to put in its place.
    """
    text = _text(ctx, path)
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
    resolve_path(ctx, path).write_text(text.replace(old_string, new_string, 1), encoding="utf-8")
    return f"edited {path}: 1 replacement"
