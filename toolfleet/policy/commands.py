"""Reading a shell command the way bash will run it, with a real parser (bashlex), and saying what
cannot be accounted for.

This is not the boundary: the kernel sandbox of ``run_command`` stops writes outside the workspace
and stray processes whatever the text says. :func:`analyse` serves the policy, which decides what
needs a person, and it fails closed: what it cannot follow becomes a :class:`Concern` (the engine
asks a person, whatever the patterns say), never a silent pass.

It finds:

- *segments*: every simple command, through ``&&``, ``||``, ``;``, ``|``, ``&``, newlines,
  subshells, groups, ``if``/``for``/``while`` and function bodies, command and process
  substitutions, ``bash -c STRING`` (with any shell options before ``-c``), ``eval``, wrappers
  (``env``, ``timeout``, ``nice``, ``sudo``, ``xargs``, ...), ``find -exec``; and, as *probes* used
  only to match deny rules, the words after a program the policy does not model (``flock F rm x``);
- *writes*: output redirections and the files that writing programs write (``tee``, ``cp``,
  ``mv``, ``install``, ``ln``, ``touch``, ``rm``, ``chmod``, ``dd of=``, ``sort -o``, ``sed -i``,
  ``find -delete``, ``git diff --output``, ...), with every directory the shell may be in at that
  point (a ``cd`` may fail, so the set only grows; a ``cd`` in a loop or function, ``pushd``/``popd``,
  ``CDPATH`` or ``cd $X`` add "unknown");
- *mentions*: paths given to other programs, which may write there (``tar -C /x``);
- *concerns*: constructs whose effect the text does not show (see :mod:`.programs`).

A syntax error or a construct bashlex does not implement (``case``, ``[[ ]]``, ``$(( ))``,
``time``), or a command substitution hidden in ``${...}`` or an unquoted here-document, sets
``problem``: such a command cannot be checked at all and is refused.
"""

from __future__ import annotations

import posixpath
from typing import Any

from .. import forksafe
from . import shellmodel as model
from .command_types import (  # noqa: F401 - re-exported: the shapes of an analysis
    MAX_DEPTH,
    MAX_PROBES,
    MAX_SEGMENTS,
    WRITE_REDIRECTS,
    CommandAnalysis,
    Concern,
    Found,
    Segment,
    Unanalysable,
    Word,
    Write,
)
from .shellwords import (
    brace_expand,
    dequote,
    glob_target,
    has_brace,
    has_glob,
    is_plain,
    may_be_git_dir,
    normalise_heredocs,
)

Cwds = frozenset[str | None]
MAX_CWDS = 64  # more places the shell may be in than this: it may be anywhere (None); each ``cd`` may
# fail, so each one doubled the set: ``cd d0; cd d1; ...`` 20 times took minutes to analyse


def _bounded(cwds: Cwds) -> Cwds:
    """``cwds``, or "anywhere" (``{None}``) once they are more than :data:`MAX_CWDS`."""
    return cwds if len(cwds) <= MAX_CWDS else frozenset({None})


class Walker:
    """Walks bashlex trees of one command text; ``cwds`` are the directories the shell may be in."""

    def __init__(self, source: str, found: Found, cwds: Cwds, depth: int = 0,
                 quoted: frozenset[int] = frozenset(), probe: bool = False) -> None:
        self.source, self.found, self.cwds, self.depth = source, found, cwds, depth
        self.quoted, self.probe = quoted, probe
        self.moved: Cwds | None = None

    # ---- structure ----
    def walk(self, node: Any) -> None:
        kind = node.kind
        if kind == "list":
            self.walk_list(node.parts)
        elif kind == "pipeline":
            for part in node.parts:
                if part.kind != "pipe":  # each part runs in a subshell
                    saved = self.cwds
                    self.walk(part)
                    self.cwds = saved
        elif kind == "compound":
            subshell = bool(node.list) and getattr(node.list[0], "word", "") == "("
            saved = self.cwds
            for part in node.list:
                if part.kind != "reservedword":
                    self.walk(part)
            if subshell:
                self.cwds = saved
            for redirect in getattr(node, "redirects", None) or ():
                self.redirect(redirect, self.text(node))
        elif kind == "if":
            self.body(node)
        elif kind in ("for", "while", "until"):
            saved = self.cwds
            self.body(node)
            if self.cwds != saved:  # a cd in a loop: the next round starts elsewhere
                self.cwds = self.cwds | {None}
                self.body(node)
        elif kind == "function":
            self.concern(self.text(node), "defines a shell function: what runs when it is called cannot be followed")
            saved = self.cwds
            for part in node.parts[1:]:
                if part.kind not in ("reservedword", "word"):
                    self.walk(part)
            if self.cwds != saved:
                self.cwds = saved | self.cwds | {None}
        elif kind == "command":
            self.command(node)
        elif kind not in ("reservedword", "operator", "pipe"):
            raise Unanalysable(f"the shell construct {kind!r} is not supported")

    def walk_list(self, parts: list[Any]) -> None:
        """``a && b || c; d``: where the shell may be when each part runs. A ``cd`` that
        succeeded moved the shell, one that failed did not; ``&&`` runs its right side only after
        a success of its left, ``||`` only after a failure."""
        success = failure = self.cwds
        op = ";"
        for i, part in enumerate(parts):
            if part.kind == "operator":
                op = part.op
                continue
            if part.kind in ("pipe", "reservedword"):
                continue
            if op == "&&":
                start, skipped = success, failure
            elif op == "||":
                start, skipped = failure, success
            else:
                start, skipped = success | failure, frozenset()
            background = i + 1 < len(parts) and getattr(parts[i + 1], "op", "") == "&"
            self.cwds, self.moved = start, None
            self.walk(part)
            if background:  # runs in a subshell
                self.cwds = start
            moved = self.moved if part.kind == "command" else None
            success, failure = (moved, start) if moved is not None else (self.cwds, self.cwds)
            if op == "&&":
                failure = failure | skipped
            elif op == "||":
                success = success | skipped
        self.cwds = _bounded(success | failure)

    def body(self, node: Any) -> None:
        for part in node.parts:
            if part.kind == "word":
                self.expansions(part)
            elif part.kind not in ("reservedword", "operator"):
                self.walk(part)

    def command(self, node: Any) -> None:
        words: list[Word] = []
        assignments: list[str] = []
        redirects = []
        for part in node.parts:
            if part.kind == "assignment":
                self.expansions(part)
                assignments.append(dequote(self.text(part)) or part.word)
            elif part.kind == "word":
                words.extend(self.shell_words(part.word, self.text(part), self.expansions(part), not words))
            elif part.kind == "redirect":
                redirects.append(part)
            else:
                raise Unanalysable(f"the shell construct {part.kind!r} is not supported")
        text = self.text(node)
        for assignment in assignments:
            self.assignment(assignment, text, exported=bool(words))
        for redirect in redirects:
            self.redirect(redirect, text)
        if words:
            from .programs import run  # the program table uses this module's types

            run(self, words, text, tuple(assignments))

    def shell_words(self, word: str, raw: str, dynamic: bool, first: bool) -> list[Word]:
        """What one parsed word becomes: quotes removed from ``raw`` (its source text) by
        :func:`dequote`, brace expansion done, patterns and expansions marked."""
        plain = dequote(raw)
        if plain is None:
            return [Word(word, True)]
        if dynamic and not ("<(" in raw or ">(" in raw):
            dynamic = False  # bashlex reads $'..' and $".." as parameters; dequote found no expansion
        if dynamic:
            return [Word(word, True)]
        word = plain
        if has_brace(raw):
            if not first and is_plain(raw):
                expanded = brace_expand(word)
                if expanded is not None:
                    return [Word(w, False, has_glob(w), len(expanded) > 1) for w in expanded]
            return [Word(word, True)]
        glob = has_glob(raw)
        return [Word(word, True)] if first and glob else [Word(word, False, glob)]

    def assignment(self, word: str, text: str, exported: bool) -> None:
        """``NAME=value``; ``exported``: programs started later see it (a prefix assignment,
        ``export``, ``env``). See :func:`.shellmodel.harmless_var`."""
        name = model.var_name(word)
        if name == "CDPATH":
            self.found.cdpath = True
        if not model.harmless_var(name, exported):
            self.concern(text, f"sets {name}, which may change what later commands run or where they write "
                               "(only an allow-list of variables is known to be harmless)")

    def redirect(self, node: Any, text: str) -> None:
        output = node.output
        if not hasattr(output, "kind"):  # a file descriptor number: 2>&1, >&2
            return
        heredoc = getattr(node, "heredoc", None)
        if heredoc is not None:
            quoted = any(node.pos[0] <= q < output.pos[0] for q in self.quoted)
            if not quoted and ("$(" in heredoc.value or "`" in heredoc.value):
                raise Unanalysable("a here-document holds a command substitution, which cannot be checked")
            return
        dynamic = self.expansions(output)
        if node.type in WRITE_REDIRECTS and output.word != "-":
            for word in self.shell_words(output.word, self.text(output), dynamic, False):
                self.add_write(word, text)

    def expansions(self, node: Any) -> bool:
        """Walk the substitutions inside a word; True if its value is known only at run time."""
        dynamic = False
        for part in getattr(node, "parts", None) or ():
            if part.kind in ("commandsubstitution", "processsubstitution"):
                dynamic = True
                saved, moved = self.cwds, self.moved  # a substitution runs in a subshell: its cd does not leak
                self.walk(part.command)
                self.cwds, self.moved = saved, moved
            elif part.kind == "parameter":
                dynamic = True
                if "$(" in part.value or "`" in part.value:
                    raise Unanalysable("a command substitution inside a ${...} expansion cannot be checked; "
                                       "run the command on its own first")
            elif part.kind != "tilde":
                raise Unanalysable(f"the shell construct {part.kind!r} is not supported")
        return dynamic

    # ---- what commands do ----
    def add_write(self, word: Word, text: str, mention: bool = False) -> None:
        """Record that ``word`` names a file written (or, with ``mention``, maybe written)."""
        target, dynamic = word.text, word.dynamic
        if may_be_git_dir(target) or any(may_be_git_dir(cwd or "") for cwd in self.cwds):
            self.concern(text, f"{'names' if mention else 'writes'} a path that is or may be in .git, whose hooks "
                               "and configuration later git commands run")
        if word.glob and not dynamic:
            if not mention:
                self.concern(text, f"writes to `{target}`, a file-name pattern: which files it names is known "
                                   "only at run time")
            stand_in = glob_target(target)
            dynamic = stand_in is None
            target = stand_in or target
        into = self.found.mentions if mention else self.found.writes
        relative = not (dynamic or target.startswith(("/", "~")))
        for cwd in sorted(self.cwds, key=lambda c: (c is None, c or "")) if relative else [None]:
            into.append(Write(target, text, cwd if relative else ".", dynamic, target.startswith("~")))

    def change_dir(self, name: str, words: list[Word]) -> None:
        if name == "popd":
            self.cwds = self.cwds | {None}
            return
        args = [w for w in words[1:] if w.dynamic or not (w.text.startswith(("-", "+")) and len(w.text) > 1)]
        target: str | None = None
        if args and not (args[0].dynamic or args[0].glob or args[0].text.startswith("~") or args[0].text == "-"):
            target = args[0].text
            if self.found.cdpath and not target.startswith(("/", "./", "../")) and target not in (".", ".."):
                target = None
        moved = _bounded(frozenset(_resolve(cwd, target) for cwd in self.cwds))
        self.moved = moved  # where a successful cd leaves the shell (see walk_list)
        self.cwds = _bounded(self.cwds | moved)  # a cd may fail: the shell may still be where it was

    def nested(self, command: str, strict: bool, leak: bool, probe: bool = False) -> None:
        """Walk ``command``, a string the shell runs (``bash -c``, ``eval``); ``leak``: its ``cd``
        changes this shell; ``strict``: a string that does not parse makes the whole unanalysable."""
        if self.depth >= MAX_DEPTH:
            raise Unanalysable(f"commands nested more than {MAX_DEPTH} levels deep")
        try:
            trees, source, quoted = parse(command)
            child = Walker(source, self.found, self.cwds, self.depth + 1, quoted, probe or self.probe)
            for tree in trees:
                child.walk(tree)
        except Unanalysable:
            if strict:
                raise
            return
        if leak:
            self.cwds = child.cwds

    def concern(self, text: str, why: str) -> None:
        self.found.concerns.append(Concern(text, why))

    def segment(self, segment: Segment) -> None:
        if len(self.found.segments) >= MAX_SEGMENTS:
            raise Unanalysable("the command is too large to check")
        self.found.segments.append(segment)

    def text(self, node: Any) -> str:
        start, end = node.pos
        return self.source[start:end]


def _resolve(cwd: str | None, target: str | None) -> str | None:
    if target is None:
        return None
    if target.startswith("/"):
        return posixpath.normpath(target)
    return None if cwd is None else posixpath.normpath(posixpath.join(cwd, target))


_BASHLEX: list[Any] = []
_BASHLEX_LOCK = forksafe.lock()


def _bashlex() -> Any:
    """The bashlex module, imported on the first parse (it builds its LR tables at import: ~0.1 s
    that `toolfleet run` without command rules need not pay; issue 15, point 8), with its
    ``${`` scan bounded (:func:`_patched_bashlex`)."""
    with _BASHLEX_LOCK:
        if not _BASHLEX:
            _BASHLEX.append(_patched_bashlex())
    return _BASHLEX[0]


def _patched_bashlex() -> Any:
    import bashlex
    import bashlex.errors
    import bashlex.subst

    original = bashlex.subst._paramexpand

    def _bounded_paramexpand(parserobj: Any, string: str, sindex: int) -> Any:
        """bashlex 0.18 loops forever on a word holding ``${`` without a ``}`` (``'${'x<}``: its
        ``str.find`` returns -1 and the scan restarts); such a word is a bad substitution to bash."""
        if string[sindex + 1 : sindex + 2] == "{" and string.find("}", sindex + 2) < 0:
            raise bashlex.errors.ParsingError("bad substitution: no closing `}`", string, sindex)
        return original(parserobj, string, sindex)

    bashlex.subst._paramexpand = _bounded_paramexpand
    return bashlex


def parse(command: str) -> tuple[list[Any], str, frozenset[int]]:
    """bashlex trees of ``command``, the text their positions point into, and the positions of
    quoted here-documents. Raises :class:`Unanalysable`."""
    if not command.strip():
        raise Unanalysable("the command is empty")
    if "\x00" in command:
        raise Unanalysable("the command holds a NUL byte, which no shell command can")
    source, quoted = normalise_heredocs(command)
    bashlex = _bashlex()
    try:
        return list(bashlex.parse(source)), source, quoted
    except bashlex.errors.ParsingError as exc:
        raise Unanalysable(f"shell syntax error: {exc.message} (position {exc.position})") from exc
    except NotImplementedError as exc:
        raise Unanalysable(f"the parser does not support {exc}") from exc
    except Exception as exc:  # bashlex raises plain errors on some malformed input
        raise Unanalysable(f"{type(exc).__name__}: {exc}") from exc


def analyse(command: str) -> CommandAnalysis:
    """Segments, writes, mentions and concerns of ``command`` (see the module docstring). Never
    raises: what cannot be analysed comes back with ``problem`` set."""
    found = Found()
    try:
        trees, source, quoted = parse(command)
        walker = Walker(source, found, frozenset({"."}), quoted=quoted)
        for tree in trees:
            walker.walk(tree)
    except Unanalysable as exc:
        return CommandAnalysis(command, problem=str(exc))
    except RecursionError:
        return CommandAnalysis(command, problem="the command is nested too deeply to check")
    writes = list(found.writes)
    # each write, once, with a link made by another part of the command (one pass per link over the
    # writes was quadratic: `ln -s a b; ` 4,000 times made 16 million)
    written = {w.text for w in found.writes}
    certain = list(dict.fromkeys(text for text, sure in found.links if sure))
    for w in found.writes if certain else ():
        link_text = next((t for t in certain[:2] if t != w.text), None)  # unique: one of two differs
        if link_text is not None:
            why = f"is written after `{link_text}` made a symbolic link in the same command, so where it lands " \
                  "cannot be known here; make links in a separate call"
            writes.append(Write(w.target, w.text, w.cwd, w.dynamic, w.tilde, why))
    for link_text in dict.fromkeys(text for text, sure in found.links if not sure):
        if len(written) > 1 or (written and link_text not in written):  # a write by another part
            found.concerns.append(Concern(link_text, "copies symbolic links, and this command writes after it "
                                                     "through paths that may be links"))
    concerns = tuple(dict.fromkeys(found.concerns))
    return CommandAnalysis(command, tuple(found.segments), tuple(writes), concerns, tuple(found.mentions))
