"""Deciding one call: ``allow``, ``ask`` or ``deny`` (the same code on the dispatcher and the worker).

The policy decides what needs a person; it is not the boundary (the sandbox and the kernel-resolved
file tools are, docs/policy.md "Which layer stops what"), and it fails closed: what it cannot
account for asks, never allows.

Order of the decision for a call of tool ``T``:

1. The tool's verdict from the policy (``tools`` entry, else ``risk`` level, else ``default``).
   ``deny`` ends it.
2. For a tool with a command argument (``run_command``), when the policy has command rules or the
   tool's verdict is ``ask``: the command is analysed (:mod:`.commands`). Unparsable → deny. Any
   segment (wrapped commands and probes included) matching a ``deny`` pattern → deny. Any write
   outside the workspace or whose place cannot be known → deny. Any concern (a construct the
   analysis cannot follow) or a path outside given to an unmodelled program → ask, and neither
   patterns nor remembered allows answer it. Then each segment: an ``ask`` pattern → ask, else an
   ``allow`` pattern → allow, else ``commands.unmatched`` (default: the tool's verdict).
3. What is still ``ask`` (without concerns) is answered by the remembered rules of the workspace
   (:mod:`.rules`): a matching remembered deny → deny, a matching remembered allow → allow.
   Remembered rules never override a configured deny.

Command text quoted in a reason is masked with :func:`toolfleet.tools.redact.redact_text`.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any

from ..tools.redact import redact_text
from ..tools.spec import ToolSpec
from .commands import CommandAnalysis, Segment, Write, analyse
from .config import Action, CommandRules, Policy
from .rules import Rule

SAFE_WRITE_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_FD_PATH = re.compile(r"^/dev/fd/\d+$")
UNPARSABLE_HINT = (
    "write it as plain commands joined by &&, ||, ; or | (no case, [[ ]], $(( )) or time), "
    "or split it into several calls"
)
MAX_REASONS = 6  # reasons listed in one verdict
UNACCOUNTED_HINT = (
    "a person must approve this call; to run without asking, write plain commands the policy can follow "
    "(no eval, bash -c with a run-time string, interpreters with -c/-e, xargs or unknown wrappers)"
)


@dataclass(frozen=True)
class Verdict:
    """``action`` with the ``reason`` (for the model or the person approving), a ``hint`` (how to
    get the call through) and the ``rule`` that decided (``tools.write_file``,
    ``commands.deny: rm -rf *``, ``remembered: ...``)."""

    action: Action
    reason: str
    hint: str = ""
    rule: str = ""


RulesSource = Callable[[], Sequence[Rule]]


def evaluate(
    policy: Policy,
    spec: ToolSpec,
    arguments: Mapping[str, Any],
    *,
    workspace: str | None,
    remembered: RulesSource | None = None,
) -> Verdict:
    """The verdict for one validated call. ``remembered`` is called (at most once) only when the
    answer would otherwise be ``ask``; it returns the rules that apply to this tool and workspace."""
    action, source = policy.tool_action(spec.name, spec.risk)
    if action == "deny":
        return Verdict(
            "deny",
            f"the policy does not allow the tool {spec.name} ({source} = deny)",
            "use another tool, or ask the operator to change the policy",
            source,
        )
    command = arguments.get(spec.command_arg) if spec.command_arg else None
    if isinstance(command, str) and (policy.commands is not None or action == "ask"):
        rules = policy.commands or CommandRules()
        verdict = _command_verdict(rules, analyse(command), action, source, workspace, remembered)
        return replace(verdict, reason=redact_text(verdict.reason))  # command text is quoted in it
    if action == "allow":
        return Verdict("allow", f"{spec.name} is allowed ({source})", rule=source)
    for rule in _fetch(remembered):
        if rule.pattern is None:
            return Verdict(
                rule.action, f"{spec.name}: {rule.describe()}", _denied_hint(rule.action), f"remembered:{rule.id}"
            )
    return Verdict("ask", f"the policy asks a person before running {spec.name} ({source} = ask)", rule=source)


def _command_verdict(
    rules: CommandRules,
    analysis: CommandAnalysis,
    tool_action: Action,
    source: str,
    workspace: str | None,
    remembered: RulesSource | None,
) -> Verdict:
    if analysis.problem is not None:
        return Verdict(
            "deny",
            f"the command could not be parsed by the shell parser, so it cannot be checked and was refused: "
            f"{redact_text(analysis.problem)}",
            UNPARSABLE_HINT,
            "commands.unparsable",
        )
    for segment in analysis.segments:
        for pattern in rules.deny:
            if matches_denied(pattern, segment):
                return Verdict(
                    "deny",
                    f"{_shown(segment)} matches the deny rule `{pattern}`",
                    "this command is not allowed here; reach the goal another way",
                    f"commands.deny: {pattern}",
                )
    for write in analysis.writes:
        why = write.unknown or outside_workspace(write, workspace)
        if why is not None:
            return Verdict(
                "deny",
                f"`{redact_text(write.text)}` writes to {redact_text(repr(write.target))}, {why}",
                "write only to paths inside the workspace (relative paths, no .., no ~)",
                "commands.workspace",
            )
    # (text, what follows it): formatted only for the reasons shown, MAX_REASONS of them (each one
    # quotes its command's text: formatting them all was quadratic in a long command's words)
    concerns: list[tuple[str, str]] = list(dict.fromkeys((c.text, f": {c.why}") for c in analysis.concerns))
    for mention in analysis.mentions:
        why = outside_workspace(mention, workspace)
        if why is not None:
            concerns.append((mention.text, f" is given {redact_text(repr(mention.target))}, {why}, where it may write"))
    asks: list[tuple[Segment, str]] = []
    for segment in analysis.segments:
        if segment.probe:
            continue
        action, why = _segment_action(rules, segment, tool_action, source)
        if action == "deny":
            return Verdict("deny", f"{_shown(segment)} {why}", _denied_hint("deny"), "commands.unmatched")
        if action == "ask":
            asks.append((segment, why))
    if not asks and not concerns:
        return Verdict("allow", "every part of the command is allowed", rule="commands.allow")
    fetched = _fetch(remembered)
    checked = analysis.segments if concerns else [segment for segment, _ in asks]
    for segment in checked:
        denial = next((r for r in fetched if r.action == "deny" and _remembered(r, segment, matches_denied)), None)
        if denial is not None:
            return Verdict(
                "deny", f"{_shown(segment)}: {denial.describe()}", _denied_hint("deny"), f"remembered:{denial.id}"
            )
    still = [(segment, why) for segment, why in asks
             if not any(r.action == "allow" and _remembered(r, segment, matches_allowed) for r in fetched)]
    if concerns:  # what the policy cannot account for always needs a person, call by call
        items: list[tuple[str, str] | tuple[Segment, str]] = [*dict.fromkeys(concerns), *still]
        shown = list(dict.fromkeys(_reason(item) for item in items[:MAX_REASONS * 4]))[:MAX_REASONS]
        more = f"; and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
        return Verdict("ask", f"needs a person's approval, the policy cannot account for it: {'; '.join(shown)}{more}",
                       UNACCOUNTED_HINT, "commands.unaccounted")
    if not still:
        return Verdict("allow", "every part of the command is allowed (remembered rules)", rule="remembered")
    more = f"; and {len(still) - MAX_REASONS} more" if len(still) > MAX_REASONS else ""
    reason = "; ".join(_reason(item) for item in still[:MAX_REASONS]) + more
    return Verdict("ask", f"needs a person's approval: {reason}", rule=still[0][1])


def _segment_action(rules: CommandRules, segment: Segment, tool_action: Action, source: str) -> tuple[Action, str]:
    for pattern in rules.ask:
        if matches_allowed(pattern, segment):
            return "ask", f"matches the ask rule `{pattern}`"
    for pattern in rules.allow:
        if matches_allowed(pattern, segment):
            return "allow", f"matches the allow rule `{pattern}`"
    if rules.unmatched is not None:
        return rules.unmatched, f"matches no rule (commands.unmatched = {rules.unmatched})"
    return tool_action, f"matches no rule ({source} = {tool_action})"


def matches_allowed(pattern: str, segment: Segment) -> bool:
    """True when ``segment`` is exactly what ``pattern`` names, as written: leading ``VAR=value``
    assignments must be in the pattern too, and ``./git`` is not ``git``."""
    words = segment.assignments + segment.words
    return _match(pattern.split(), list(words), [False] * len(words))


def matches_denied(pattern: str, segment: Segment) -> bool:
    """True when ``segment`` might run what ``pattern`` names: also with its assignments dropped,
    with the command's directory dropped (``/bin/rm`` is ``rm``), and with every word whose value
    is known only at run time (``$X``, ``$(...)``) standing for any words."""
    words = list(segment.words)
    dynamic = list(segment.dynamic) or [False] * len(words)
    candidates = [words, [posixpath.basename(words[0]), *words[1:]]]
    if segment.assignments:
        candidates.append(list(segment.assignments) + words)
    parts = pattern.split()
    for candidate in candidates:
        flags = dynamic if len(candidate) == len(words) else [False] * len(segment.assignments) + dynamic
        if _match(parts, candidate, flags):
            return True
    return False


def _match(pattern: list[str], words: list[str], dynamic: list[bool]) -> bool:
    """Whether ``words`` match the ``pattern`` words (``fnmatch`` each; a final ``*`` takes any
    remaining words, none included; a ``dynamic`` word may stand for any number of words, none
    included). Bottom-up over (pattern word, word): time O(words x pattern words^2), no recursion
    (the recursive form took exponential time on many dynamic words, and raised RecursionError past
    about 1,000 of them)."""
    size, count = len(pattern), len(words)
    rest_dynamic = [True] * (count + 1)  # rest_dynamic[j]: every word from j on is dynamic
    for j in range(count - 1, -1, -1):
        rest_dynamic[j] = dynamic[j] and rest_dynamic[j + 1]
    later: list[bool] = []  # the row of word j + 1: later[i] = pattern[i:] matches words[j + 1:]
    for j in range(count, -1, -1):
        row = [False] * (size + 1)
        row[size] = rest_dynamic[j]
        any_after = False  # any(later[k] for k > i), built as i goes down
        for i in range(size - 1, -1, -1):
            if j < count:
                any_after = any_after or later[i + 1]
            if pattern[i] == "*" and i == size - 1:
                row[i] = True
            elif j == count:
                row[i] = False
            elif dynamic[j]:  # may expand to any number of words
                row[i] = later[i] or any_after
            else:
                row[i] = later[i + 1] and fnmatchcase(words[j], pattern[i])
        later = row
    return later[0]


def outside_workspace(write: Write, workspace: str | None) -> str | None:
    """Why ``write`` leaves the workspace, or ``None`` when it stays inside. Lexical, plus a
    symlink-resolving check where the workspace exists on this machine (the worker)."""
    target = write.target
    if write.tilde:
        return "under a home directory, outside the workspace"
    if write.dynamic:
        return "a path known only at run time, which cannot be checked"
    if target in SAFE_WRITE_TARGETS or _FD_PATH.match(target):
        return None
    root = posixpath.normpath(workspace) if workspace else "/__workspace__"
    if target.startswith("/"):
        path = posixpath.normpath(target)
    elif write.cwd is None:
        return "a relative path after a cd to a directory that cannot be known here"
    else:
        base = write.cwd if write.cwd.startswith("/") else posixpath.join(root, write.cwd)
        path = posixpath.normpath(posixpath.join(base, target))
    if not _within(path, root):
        return "outside the workspace"
    if "\x00" in path:
        return "a path holding a NUL byte, which cannot be checked"
    if workspace and os.path.isdir(workspace):
        real_root = os.path.realpath(workspace)
        if not _within(os.path.realpath(path), real_root):
            return "outside the workspace (through a symbolic link)"
    return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _reason(item: tuple[str, str] | tuple[Segment, str]) -> str:
    """One reason of a verdict: a concern or mention ``(text, what follows)``, or an asked segment
    ``(segment, why)``."""
    first, rest = item
    if isinstance(first, Segment):
        return f"{_shown(first)} {rest}"
    return f"`{redact_text(first)}`{rest}"


def _shown(segment: Segment) -> str:
    """How a segment is quoted in a reason: secrets in it masked (tools.redact)."""
    if segment.wrapped_by:
        return f"`{redact_text(' '.join(segment.words))}` (run by {segment.wrapped_by})"
    return f"`{redact_text(segment.text)}`"


def _remembered(rule: Rule, segment: Segment, match: Callable[[str, Segment], bool]) -> bool:
    return rule.pattern is None or match(rule.pattern, segment)


def _fetch(remembered: RulesSource | None) -> Sequence[Rule]:
    return remembered() if remembered is not None else ()


def _denied_hint(action: Action) -> str:
    return "this command is not allowed here; reach the goal another way" if action == "deny" else ""
