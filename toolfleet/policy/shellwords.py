"""What the shell does to a word's raw text that bashlex leaves undone: quoted here-document
delimiters, unquoted glob characters and brace expansion.

bashlex gives each word with its quotes removed, so ``'{a,b}'`` and ``{a,b}`` look the same; these
helpers read the raw source text of the word (``source[node.pos[0]:node.pos[1]]``) to tell them
apart. They never raise.
"""

from __future__ import annotations

import posixpath
import re
from fnmatch import fnmatchcase

# `<<'EOF'`, `<<"EOF"`, `<<\EOF`, `<<-'EOF'`: bashlex wants the delimiter unquoted
_QUOTED_HEREDOC = re.compile(r"<<(-?)([ \t]*)(?:'([\w.-]+)'|\"([\w.-]+)\"|\\([\w.-]+))")
MAX_BRACE_WORDS = 64


def normalise_heredocs(command: str) -> tuple[str, frozenset[int]]:
    """``command`` with quoted here-document delimiters unquoted (same length, so every position
    bashlex reports still points into the original text) and the positions of the ``<<`` of those
    here-documents, whose bodies the shell does not expand."""
    quoted: set[int] = set()

    def unquote(match: re.Match[str]) -> str:
        quoted.add(match.start())
        delimiter = match.group(3) or match.group(4) or match.group(5)
        padding = len(match.group(0)) - 2 - len(match.group(1)) - len(match.group(2)) - len(delimiter)
        return f"<<{match.group(1)}{match.group(2)}{' ' * padding}{delimiter}"

    return _QUOTED_HEREDOC.sub(unquote, command), frozenset(quoted)


def unquoted(raw: str) -> str:
    """The characters of ``raw`` outside quotes and not escaped, in order (``$'...'`` counts as
    quoted)."""
    out: list[str] = []
    i, quote = 0, ""
    while i < len(raw):
        ch = raw[i]
        if quote == "'":
            if ch == "'":
                quote = ""
        elif quote == '"':
            if ch == "\\":
                i += 1
            elif ch == '"':
                quote = ""
        elif ch == "\\":
            i += 1
        elif ch in "'\"":
            quote = ch
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def has_glob(raw: str) -> bool:
    """True when the shell may expand ``raw`` as a file-name pattern (unquoted ``*``, ``?``, ``[``)."""
    bare = unquoted(raw)
    return "*" in bare or "?" in bare or ("[" in bare and "]" in bare[bare.index("[") + 2 :])


def has_brace(raw: str) -> bool:
    """True when ``raw`` holds an unquoted ``{...,...}`` or ``{a..b}`` the shell expands."""
    bare = unquoted(raw)
    start = bare.find("{")
    return start >= 0 and "}" in bare[start:] and ("," in bare[start:] or ".." in bare[start:])


def is_plain(raw: str) -> bool:
    """True when ``raw`` has no quotes, escapes or expansions, so its text is what the shell sees."""
    return not any(ch in raw for ch in "'\"\\$`")


def brace_expand(word: str) -> list[str] | None:
    """The words ``word`` (plain text, see :func:`is_plain`) expands to, or ``None`` when there
    would be more than :data:`MAX_BRACE_WORDS`. Sequences ``{a..b}`` give their two ends."""
    results = [word]
    done: list[str] = []
    while results:
        current = results.pop()
        parts = _first_brace(current)
        if parts is None:
            done.append(current)
        else:
            prefix, alternatives, suffix = parts
            results.extend(prefix + alt + suffix for alt in alternatives)
        if len(done) + len(results) > MAX_BRACE_WORDS:
            return None
    return list(reversed(done))


_SEQUENCE = re.compile(r"(-?\w+)\.\.(-?\w+)(\.\.-?\d+)?")  # a brace body bash expands as a sequence


def _first_brace(word: str) -> tuple[str, list[str], str] | None:
    """The first brace expression of ``word`` that bash expands (the one whose ``{`` comes first
    among those that close and hold a comma at their own depth, or are a sequence ``a..b``):
    ``(before, alternatives, after)``, or ``None``. One pass with a stack (one scan per ``{`` was
    quadratic: ``{`` repeated 4,000 times took a second)."""
    best: tuple[int, int, list[int], re.Match[str] | None] | None = None  # the first valid one so far
    opened: list[tuple[int, list[int]]] = []  # the open braces: (start, commas directly inside)
    for at, ch in enumerate(word):
        if ch == "{":
            opened.append((at, []))
        elif ch == "," and opened:
            opened[-1][1].append(at)
        elif ch == "}" and opened:
            start, commas = opened.pop()
            if best is not None and start > best[0]:
                continue
            seq = None if commas else _SEQUENCE.fullmatch(word, start + 1, at)
            if commas or seq:
                best = (start, at, commas, seq)
    if best is None:
        return None
    start, end, commas, seq = best
    if seq is not None:
        return word[:start], [seq.group(1), seq.group(2)], word[end + 1 :]
    cuts = [start, *commas, end]
    return word[:start], [word[a + 1 : b] for a, b in zip(cuts, cuts[1:], strict=False)], word[end + 1 :]


def glob_target(path: str) -> str | None:
    """A stand-in for a write target holding glob characters, good for a lexical inside/outside
    check: each pattern component becomes a plain name, or ``None`` when a component could match
    ``.`` or ``..`` (so the pattern could climb out)."""
    out = []
    for part in path.split("/"):
        if any(ch in part for ch in "*?["):
            if fnmatchcase("..", part) or fnmatchcase(".", part):
                return None
            out.append("__glob__")
        else:
            out.append(part)
    joined = "/".join(out)
    return posixpath.normpath(joined) if joined else joined


_ANSI_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
_EXPANSION_START = re.compile(r"[A-Za-z0-9_{(\[@*#?$!-]")


def dequote(raw: str) -> str | None:
    """The word the shell makes of ``raw`` (one word's source text) after quote removal, or
    ``None`` when it holds an expansion (``$X``, ``${..}``, ``$(..)``, backquotes), whose value is
    known only at run time. Follows bash 5 (manual, "Quoting"): any concatenation of unquoted,
    ``'..'``, ``".."``, ``$'..'`` (ANSI-C escapes decoded, cut at a NUL) and ``$".."`` pieces;
    a backslash quotes the next character (``\\<newline>`` is removed). bashlex gets some of
    these wrong (``"r"'m'`` comes back as ``r'm'``), so the policy uses this instead."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        ch = raw[i]
        if ch == "\\":
            if i + 1 < n and raw[i + 1] != "\n":
                out.append(raw[i + 1])
            i += 2
        elif ch == "'":
            end = raw.find("'", i + 1)
            if end < 0:
                return None
            out.append(raw[i + 1 : end])
            i = end + 1
        elif ch == "$" and raw[i + 1 : i + 2] == "'":
            decoded, i = _ansi_c(raw, i + 2)
            if decoded is None:
                return None
            out.append(decoded)
        elif ch == "$" and raw[i + 1 : i + 2] == '"':
            i += 1  # $"..." is a translated string: the same text as "..." here
        elif ch == '"':
            i += 1
            while i < n and raw[i] != '"':
                if raw[i] == "\\" and i + 1 < n and raw[i + 1] in '$`"\\\n':
                    if raw[i + 1] != "\n":
                        out.append(raw[i + 1])
                    i += 2
                    continue
                if raw[i] == "`" or (raw[i] == "$" and _EXPANSION_START.match(raw, i + 1)):
                    return None
                out.append(raw[i])
                i += 1
            if i >= n:
                return None
            i += 1
        elif ch == "`" or (ch == "$" and _EXPANSION_START.match(raw, i + 1)):
            return None
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _ansi_c(raw: str, i: int) -> tuple[str | None, int]:
    """Decode a ``$'...'`` body starting at ``raw[i]``; returns (text or None, index after the
    closing quote). A NUL ends the word's text, as in bash."""
    out: list[str] = []
    n = len(raw)
    while i < n and raw[i] != "'":
        ch = raw[i]
        if ch != "\\" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt in _ANSI_SIMPLE:
            out.append(_ANSI_SIMPLE[nxt])
            i += 2
        elif nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", raw[i + 1 :]).group(0)  # type: ignore[union-attr]
            out.append(chr(int(digits, 8) & 0xFF))
            i += 1 + len(digits)
        elif nxt in "xuU":
            size = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = re.match(f"[0-9a-fA-F]{{1,{size}}}", raw[i + 2 :])
            if digits is None:
                out.append("\\" + nxt)
                i += 2
            else:
                try:
                    out.append(chr(int(digits.group(0), 16)))
                except (ValueError, OverflowError):
                    return None, n
                i += 2 + len(digits.group(0))
        elif nxt == "c" and i + 2 < n:
            out.append(chr(ord(raw[i + 2]) & 0x1F))
            i += 3
        else:
            out.append("\\" + nxt)
            i += 2
    if i >= n:
        return None, n
    text = "".join(out)
    return text.split("\x00", 1)[0], i + 1


def may_be_git_dir(path: str) -> bool:
    """True when a component of ``path`` is, or as a pattern may match, ``.git`` (any case: git
    on a case-insensitive file system reads ``.GIT`` too). Used to flag writes that may plant
    hooks or configuration (``core.fsmonitor``, ``core.hooksPath``) that later git commands run."""
    for part in path.split("/"):
        lowered = part.lower()
        if lowered == ".git" or (any(ch in part for ch in "*?[") and fnmatchcase(".git", lowered)):
            return True
    return False
