"""The shapes :mod:`.commands` reads a shell command into (docs/policy.md): segments, writes,
concerns, the analysis, and the walk's own bookkeeping. Limits of the walk are here too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})
MAX_DEPTH = 8
MAX_SEGMENTS = 10_000
MAX_PROBES = 300  # guesses at what unmodelled programs run; past it, probing stops (the call asks anyway)
MAX_PROBE_WORDS = 20_000  # ... and the words those guesses look at in all (each tail of a long command
# is as long as the command: 300 of them made a 10 KB command take 6 s)


@dataclass(frozen=True)
class Segment:
    """One simple command. ``words`` as the shell splits them (quotes removed, braces expanded),
    without the leading ``assignments``; ``dynamic[i]`` is True when word ``i`` is known only at
    run time (``$VAR``, ``$(...)``, a pattern or brace in the command name). ``wrapped_by`` names
    the wrapper when this segment is the command a wrapper runs; ``probe`` marks a guess at what a
    program the policy does not model runs (checked against deny rules only)."""

    words: tuple[str, ...]
    text: str
    assignments: tuple[str, ...] = ()
    dynamic: tuple[bool, ...] = ()
    wrapped_by: str | None = None
    probe: bool = False


@dataclass(frozen=True)
class Write:
    """A path the command writes to. ``cwd`` is the shell's directory at that point, relative to
    the workspace (``"."``), absolute, or ``None`` when unknown. ``unknown`` says why the target
    cannot be known even if the path looks fine (a symbolic link made by the same command)."""

    target: str
    text: str
    cwd: str | None = "."
    dynamic: bool = False
    tilde: bool = False
    unknown: str | None = None


@dataclass(frozen=True)
class Concern:
    """Something the policy cannot account for: ``text`` is the command part, ``why`` a sentence
    for the person asked."""

    text: str
    why: str


@dataclass(frozen=True)
class CommandAnalysis:
    """What :func:`analyse` found; ``problem`` set means the command cannot be checked at all."""

    command: str
    segments: tuple[Segment, ...] = ()
    writes: tuple[Write, ...] = ()
    concerns: tuple[Concern, ...] = ()
    mentions: tuple[Write, ...] = ()
    problem: str | None = None


class Unanalysable(Exception):
    """Raised inside the walk when the command cannot be checked at all."""


class Word(NamedTuple):
    """One word after expansion: its text, whether it is known only at run time, and whether it
    holds unquoted glob characters."""

    text: str
    dynamic: bool = False
    glob: bool = False
    brace: bool = False  # one of several words a brace expansion made


@dataclass
class Found:
    """What the walk collects (shared by nested walkers)."""

    segments: list[Segment] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    mentions: list[Write] = field(default_factory=list)
    concerns: list[Concern] = field(default_factory=list)
    links: list[tuple[str, bool]] = field(default_factory=list)  # (text, made a symbolic link for sure)
    cdpath: bool = False
    probes: int = 0
    probe_words: int = 0
