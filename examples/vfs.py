"""A simulated file system whose methods are tools, one per session (README, "Stateful tools").

Serve it: ``toolfleet worker --tools examples/vfs.py`` (from the repository root). Open a session for it:
``dispatcher.open_session(state={"vfs": VirtualFS(rng=random.Random(7))})``.
"""

from __future__ import annotations

import posixpath
import random
from dataclasses import dataclass, field

from toolfleet.tools.from_class import method, tools_from_class
from toolfleet.tools.state import JsonRandom


@dataclass
class VirtualFS:
    """A file system in memory: folders, text files, a current folder and a random generator."""

    cwd: str = "/"
    dirs: set[str] = field(default_factory=lambda: {"/"})
    files: dict[str, str] = field(default_factory=dict)
    rng: JsonRandom = field(default_factory=lambda: random.Random(0))

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path)) if path else self.cwd

    def _need_dir(self, path: str) -> str:
        full = self._abs(path)
        if full not in self.dirs:
            raise ValueError(f"no such folder: {full}")
        return full

    @method(access="read", loop_check=False)
    def pwd(self) -> str:
        """Print the current folder."""
        return self.cwd

    def cd(self, path: str) -> str:
        """Change the current folder.

        Args:
            path: folder, relative to the current one or absolute ("..", "/a/b").
        """
        self.cwd = self._need_dir(path)
        return self.cwd

    @method(access="read")
    def ls(self, path: str = "") -> list[str]:
        """List a folder (default: the current one); folders end with "/".

        Args:
            path: the folder to list.
        """
        full = self._need_dir(path)
        prefix = full.rstrip("/") + "/"
        names = {p[len(prefix):].split("/")[0] + ("/" if "/" in p[len(prefix):] or p in self.dirs else "")
                 for p in (*self.dirs, *self.files) if p.startswith(prefix) and p != full}
        return sorted(names)

    def mkdir(self, path: str) -> str:
        """Make a folder and its parents.

        Args:
            path: the folder to make.
        """
        full = self._abs(path)
        if full in self.files:
            raise ValueError(f"a file is in the way: {full}")
        while full not in self.dirs:
            self.dirs.add(full)
            full = posixpath.dirname(full)
        return self._abs(path)

    def echo(self, text: str, path: str, append: bool = False) -> str:
        """Write text to a file (echo text > path, or >> with append).

        Args:
            text: what to write.
            path: the file.
            append: add to the end instead of replacing.
        """
        full = self._abs(path)
        self._need_dir(posixpath.dirname(full))
        if full in self.dirs:
            raise ValueError(f"is a folder: {full}")
        self.files[full] = (self.files.get(full, "") if append else "") + text
        return f"{len(self.files[full])} bytes in {full}"

    @method(access="read")
    def cat(self, path: str) -> str:
        """Print a file.

        Args:
            path: the file.
        """
        full = self._abs(path)
        if full not in self.files:
            raise ValueError(f"no such file: {full}")
        return self.files[full]

    def mv(self, source: str, target: str) -> str:
        """Move or rename a file.

        Args:
            source: the file to move.
            target: its new path, or a folder to move it into.
        """
        src, dst = self._abs(source), self._abs(target)
        if src not in self.files:
            raise ValueError(f"no such file: {src}")
        if dst in self.dirs:
            dst = posixpath.join(dst, posixpath.basename(src))
        self._need_dir(posixpath.dirname(dst))
        self.files[dst] = self.files.pop(src)
        return dst

    def rm(self, path: str) -> str:
        """Remove a file, or an empty folder.

        Args:
            path: what to remove.
        """
        full = self._abs(path)
        if full in self.files:
            del self.files[full]
        elif full in self.dirs and full != "/" and not any(p.startswith(full + "/") for p in (*self.dirs, *self.files)):
            self.dirs.discard(full)
        else:
            raise ValueError(f"cannot remove {full}")
        return full

    @method(access="read")
    def find(self, name: str = "", path: str = "") -> list[str]:
        """Find files below a folder whose name contains a text.

        Args:
            name: part of the file name ("" for all).
            path: the folder to search (default: the current one).
        """
        full = self._need_dir(path)
        prefix = "/" if full == "/" else full + "/"
        return sorted(p for p in self.files if p.startswith(prefix) and name in posixpath.basename(p))

    @method(access="read")
    def wc(self, path: str) -> dict[str, int]:
        """Count the lines, words and characters of a file.

        Args:
            path: the file.
        """
        text = self.cat(path)
        return {"lines": text.count("\n"), "words": len(text.split()), "chars": len(text)}

    @method(access=lambda args: "write" if args.get("save_as") else "read")
    def du(self, save_as: str = "") -> int:
        """Total size of all files in characters; with save_as, also write it to that file.

        Args:
            save_as: a file to write the total to (then the call writes).
        """
        total = sum(len(t) for t in self.files.values())
        if save_as:
            self.echo(str(total), save_as)
        return total

    def roll(self, sides: int = 6) -> int:
        """Roll a die from the session's own random generator (a write: the generator moves on).

        Args:
            sides: how many sides.
        """
        return self.rng.randint(1, sides)


TOOLS = tools_from_class(VirtualFS, state_name="vfs", prefix="fs_")
