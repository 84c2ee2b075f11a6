"""Reading a shell command the way bash will run it, with a real parser (bashlex), never a regex.

:func:`analyse` splits a command line into the simple commands it runs (*segments*) and the files
it writes:

- chained commands (``&&``, ``||``, ``;``, ``|``, ``&``, newlines), subshells, ``{ ...; }`` groups,
  ``if``/``for``/``while`` bodies and function bodies are walked; every simple command is a segment;
- command substitutions (``$(...)``, backticks) and process substitutions (``<(...)``, ``>(...)``)
  are analysed recursively, wherever they appear (words, assignments, redirection targets);
- ``bash -c STRING`` / ``sh -c STRING`` / ``eval WORDS`` are analysed recursively as the commands
  they run (a string built at run time cannot be, and is a problem);
- a command run through a wrapper (``sudo``, ``env``, ``timeout``, ``nice``, ``nohup``, ``xargs``,
  ``find -exec``, ...) yields a second segment for the wrapped command, so both are checked;
- writes are output redirections (``>``, ``>>``, ``&>``, ``>|``, ``<>``, ``>& file``) and the path
  arguments of common file-writing commands (``tee``, ``cp``, ``mv``, ``ln``, ``touch``, ``mkdir``,
  ``rm``, ``rmdir``, ``chmod``, ``chown``, ``truncate``, ``dd of=``), each with the directory the
  shell is in at that point (``cd`` is followed; an unknown ``cd`` makes later relative paths
  unknown).

Anything the parser cannot read (a syntax error, or a construct bashlex does not implement:
``case``, ``[[ ]]``, ``$(( ))``, ``time``), and command text hidden where it cannot be followed (a
substitution inside ``${...}`` or inside a here-document), sets ``problem``: the command must be
refused, because it cannot be checked.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

import bashlex
import bashlex.errors

SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh"})
# wrapper -> its options that take a value (so the value is not taken for the wrapped command)
WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group"}),
    "doas": frozenset({"-u", "-C"}),
    "env": frozenset({"-u", "-C", "-S", "--unset", "--chdir"}),
    "nohup": frozenset(),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "-p", "--class", "--classdata"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "xargs": frozenset({"-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a", "--max-args", "--max-procs"}),
    "exec": frozenset({"-a"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "setsid": frozenset(),
    "chrt": frozenset(),
    "unbuffer": frozenset(),
    "watch": frozenset({"-n", "--interval", "-d"}),
}
# the first positional argument of these wrappers is not the command (a duration, a priority...)
WRAPPER_POSITIONALS = {"timeout": 1, "chrt": 1}
WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})
# command -> how its path arguments are written to
WRITERS_ALL = frozenset({"tee", "touch", "mkdir", "rm", "rmdir", "truncate", "shred", "unlink"})
WRITERS_LAST = frozenset({"cp", "mv", "ln", "install", "rsync", "scp"})
WRITERS_AFTER_FIRST = frozenset({"chmod", "chown", "chgrp"})


@dataclass(frozen=True)
class Segment:
    """One simple command. ``words`` as the shell splits them (quotes removed), without the
    leading ``assignments``; ``dynamic[i]`` is True when word ``i`` holds an expansion whose value
    is known only at run time (``$VAR``, ``$(...)``). ``wrapped_by`` names the wrapper when this
    segment is the command a wrapper runs."""

    words: tuple[str, ...]
    text: str
    assignments: tuple[str, ...] = ()
    dynamic: tuple[bool, ...] = ()
    wrapped_by: str | None = None


@dataclass(frozen=True)
class Write:
    """A path the command writes to. ``cwd`` is the shell's directory at that point, relative to
    the workspace (``"."``), absolute, or ``None`` when unknown (after ``cd $X``)."""

    target: str
    text: str
    cwd: str | None = "."
    dynamic: bool = False
    tilde: bool = False


@dataclass(frozen=True)
class CommandAnalysis:
    """What :func:`analyse` found; ``problem`` set means the command cannot be checked."""

    command: str
    segments: tuple[Segment, ...] = ()
    writes: tuple[Write, ...] = ()
    problem: str | None = None


class _Unanalysable(Exception):
    pass


@dataclass
class _Walker:
    source: str
    cwd: str | None = "."
    segments: list[Segment] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    depth: int = 0

    # ---- nodes ----
    def walk(self, node: Any) -> None:
        kind = node.kind
        if kind in ("list", "pipeline"):
            for part in node.parts:
                if part.kind not in ("operator", "pipe", "reservedword"):
                    self.walk(part)
        elif kind == "compound":
            for part in node.list:
                if part.kind != "reservedword":
                    self.walk(part)
            for redirect in getattr(node, "redirects", None) or ():
                self.redirect(redirect, self.text(node))
        elif kind in ("if", "for", "while", "until"):
            for part in node.parts:
                if part.kind == "word":
                    self.expansions(part)
                elif part.kind not in ("reservedword", "operator"):
                    self.walk(part)
        elif kind == "function":
            for part in node.parts[1:]:
                if part.kind not in ("reservedword", "word"):
                    self.walk(part)
        elif kind == "command":
            self.command(node)
        elif kind in ("reservedword", "operator", "pipe"):
            return
        else:
            raise _Unanalysable(f"the shell construct {kind!r} is not supported")

    def command(self, node: Any) -> None:
        words: list[str] = []
        dynamic: list[bool] = []
        assignments: list[str] = []
        redirects = []
        for part in node.parts:
            if part.kind == "assignment":
                assignments.append(part.word)
                self.expansions(part)
            elif part.kind == "word":
                words.append(part.word)
                dynamic.append(self.expansions(part))
            elif part.kind == "redirect":
                redirects.append(part)
            else:
                raise _Unanalysable(f"the shell construct {part.kind!r} is not supported")
        text = self.text(node)
        for redirect in redirects:
            self.redirect(redirect, text)
        if not words:
            return
        name = posixpath.basename(words[0])
        if name in SHELLS and "-c" in words[1:]:
            self.nested_shell(words, dynamic, text)
            return
        if name == "eval":
            self.nested(words[1:], dynamic[1:], text, "eval")
            return
        segment = Segment(tuple(words), text, tuple(assignments), tuple(dynamic))
        self.segments.append(segment)
        self.after(segment)

    def after(self, segment: Segment) -> None:
        """Follow ``cd``, record the writes of file-writing commands, unwrap wrappers."""
        words, dynamic = segment.words, segment.dynamic
        name = posixpath.basename(words[0])
        if name in ("cd", "pushd"):
            self.change_dir(words[1:], dynamic[1:])
        self.writer_targets(segment)
        inner = _unwrap(words)
        if inner is not None:
            start, wrapper = inner
            if start < len(words):
                if posixpath.basename(words[start]) in SHELLS and "-c" in words[start + 1 :]:
                    self.nested_shell(list(words[start:]), list(dynamic[start:]), segment.text)
                    return
                wrapped = Segment(words[start:], segment.text, (), dynamic[start:], wrapped_by=wrapper)
                self.segments.append(wrapped)
                self.after(wrapped)
        if name == "find":
            self.find_exec(segment)

    def find_exec(self, segment: Segment) -> None:
        words = segment.words
        for i, word in enumerate(words):
            if word in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((k for k in range(i + 1, len(words)) if words[k] in (";", "+")), len(words))
                if end > i + 1:
                    inner = Segment(words[i + 1 : end], segment.text, (), segment.dynamic[i + 1 : end], "find")
                    self.segments.append(inner)
                    self.after(inner)

    def nested_shell(self, words: list[str], dynamic: list[bool], text: str) -> None:
        at = words.index("-c", 1)
        if at + 1 >= len(words):
            raise _Unanalysable(f"{words[0]} -c without a command string")
        self.nested([words[at + 1]], [dynamic[at + 1]], text, words[0])

    def nested(self, words: list[str], dynamic: list[bool], text: str, via: str) -> None:
        if any(dynamic):
            raise _Unanalysable(f"`{text}` runs a command string built at run time ({via}), which cannot be checked")
        if self.depth >= 8:
            raise _Unanalysable("commands nested more than 8 levels deep")
        inner = " ".join(words)
        child = _Walker(inner, self.cwd, self.segments, self.writes, self.depth + 1)
        for tree in _parse(inner):
            child.walk(tree)
        self.cwd = child.cwd

    def change_dir(self, args: tuple[str, ...], dynamic: tuple[bool, ...]) -> None:
        positional = [(a, d) for a, d in zip(args, dynamic, strict=True) if not a.startswith("-")]
        if not positional or positional[0][1] or positional[0][0].startswith("~"):
            self.cwd = None  # home, $VAR or ~user: not known here
            return
        target = positional[0][0]
        if target.startswith("/"):
            self.cwd = posixpath.normpath(target)
        elif self.cwd is not None:
            self.cwd = posixpath.normpath(posixpath.join(self.cwd, target))

    def writer_targets(self, segment: Segment) -> None:
        words, dynamic = segment.words, segment.dynamic
        name = posixpath.basename(words[0])
        args = [(w, d) for w, d in zip(words[1:], dynamic[1:], strict=True)]
        targets: list[tuple[str, bool]] = []
        if name == "dd":
            targets = [(w[3:], d) for w, d in args if w.startswith("of=")]
        else:
            positional = _positional(args)
            if name in WRITERS_ALL:
                targets = positional
            elif name in WRITERS_AFTER_FIRST:
                targets = positional[1:]
            elif name in WRITERS_LAST:
                explicit = [(w.split("=", 1)[1], d) for w, d in args if w.startswith("--target-directory=")]
                for i, (w, _) in enumerate(args[:-1]):
                    if w == "-t":
                        explicit.append(args[i + 1])
                targets = explicit or (positional[-1:] if len(positional) >= 2 else [])
        for target, is_dynamic in targets:
            self.writes.append(Write(target, segment.text, self.cwd, is_dynamic, target.startswith("~")))

    def redirect(self, node: Any, text: str) -> None:
        output = node.output
        if not hasattr(output, "kind"):  # a file descriptor number: 2>&1, >&2
            return
        is_dynamic = self.expansions(output)
        heredoc = getattr(node, "heredoc", None)
        if heredoc is not None and ("$(" in heredoc.value or "`" in heredoc.value):
            raise _Unanalysable("a here-document holds a command substitution, which cannot be checked")
        if node.type in WRITE_REDIRECTS and output.word != "-":
            tilde = output.word.startswith("~") or any(p.kind == "tilde" for p in getattr(output, "parts", ()))
            self.writes.append(Write(output.word, text, self.cwd, is_dynamic, tilde))

    def expansions(self, node: Any) -> bool:
        """Analyse the substitutions inside a word; True if its value is known only at run time."""
        dynamic = False
        for part in getattr(node, "parts", None) or ():
            if part.kind in ("commandsubstitution", "processsubstitution"):
                dynamic = True
                saved = self.cwd  # a substitution runs in a subshell: its cd does not leak
                self.walk(part.command)
                self.cwd = saved
            elif part.kind == "parameter":
                dynamic = True
                if "$(" in part.value or "`" in part.value:
                    raise _Unanalysable(
                        "a command substitution inside a ${...} expansion cannot be checked; "
                        "run the command on its own first"
                    )
            elif part.kind == "tilde":
                continue
            else:
                raise _Unanalysable(f"the shell construct {part.kind!r} is not supported")
        return dynamic

    def text(self, node: Any) -> str:
        start, end = node.pos
        return self.source[start:end]


def _parse(command: str) -> list[Any]:
    if not command.strip():
        raise _Unanalysable("the command is empty")
    try:
        return list(bashlex.parse(command))
    except bashlex.errors.ParsingError as exc:
        raise _Unanalysable(f"shell syntax error: {exc.message} (position {exc.position})") from exc
    except NotImplementedError as exc:
        raise _Unanalysable(f"the parser does not support {exc}") from exc
    except Exception as exc:  # bashlex raises plain errors on some malformed input
        raise _Unanalysable(f"{type(exc).__name__}: {exc}") from exc


def _positional(args: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out, options_done = [], False
    for word, is_dynamic in args:
        if not options_done and word == "--":
            options_done = True
        elif options_done or not word.startswith("-") or word == "-":
            out.append((word, is_dynamic))
    return out


def _unwrap(words: tuple[str, ...]) -> tuple[int, str] | None:
    """(index of the wrapped command, wrapper name) when ``words`` starts with a wrapper."""
    name = posixpath.basename(words[0])
    if name not in WRAPPERS:
        return None
    takes_value = WRAPPERS[name]
    positionals = WRAPPER_POSITIONALS.get(name, 0)
    i = 1
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if word.startswith("-"):
            i += 2 if word in takes_value else 1
        elif name == "env" and "=" in word:
            i += 1
        elif positionals:
            positionals -= 1
            i += 1
        else:
            break
    return i, name


def analyse(command: str) -> CommandAnalysis:
    """Segments and writes of ``command`` (see the module docstring). Never raises: what cannot be
    analysed comes back with ``problem`` set."""
    walker = _Walker(command)
    try:
        for tree in _parse(command):
            walker.walk(tree)
    except _Unanalysable as exc:
        return CommandAnalysis(command, problem=str(exc))
    except RecursionError:
        return CommandAnalysis(command, problem="the command is nested too deeply to check")
    return CommandAnalysis(command, tuple(walker.segments), tuple(walker.writes))
