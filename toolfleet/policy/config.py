"""The policy a fleet runs under, as one value object loaded from TOML, JSON or a dict.

Shape (every table optional; see docs/policy.md for a worked example)::

    default = "allow"                  # verdict of a tool no other entry names

    [risk]                             # verdict by the tool's declared risk level
    low = "allow"
    medium = "allow"
    high = "ask"

    [tools]                            # verdict by tool name (exact name, or a wildcard such as "db_*")
    write_file = "ask"
    drop_table = "deny"

    [commands]                         # rules for tools that run shell commands (run_command)
    allow = ["git status", "git diff *", "python -m pytest *"]
    ask = ["git commit *"]
    deny = ["rm -rf *", "git push *", "sudo *"]
    unmatched = "ask"                  # a command segment no pattern names (default: the tool's verdict)

    [loops]
    limit = 3                          # identical calls in a row in one session; 0 turns it off

A verdict is ``allow`` (run it), ``ask`` (wait for a person's approval) or ``deny``
(``PERMISSION_DENIED``). :meth:`Policy.permissive` (everything allowed, no command rules) is what
a dispatcher or worker uses when it is given no policy, so the core path behaves as without this
layer; loop detection (limit 3) applies to every session either way.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigurationError

Action = Literal["allow", "ask", "deny"]
Risk = Literal["low", "medium", "high"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CommandRules(_Frozen):
    """Allow, ask and deny patterns for shell commands, checked segment by segment.

    A pattern is words separated by spaces; each word is a wildcard (``*``, ``?``, ``[...]``) matched
    against one word of the command as the shell splits it (quotes removed). A final ``*`` word
    matches any number of remaining words, none included: ``git *`` matches ``git`` and
    ``git log -3``. Deny beats ask beats allow.
    """

    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    unmatched: Action | None = None

    @field_validator("allow", "ask", "deny")
    @classmethod
    def _non_empty(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            if not pattern.split():
                raise ValueError("a command pattern must hold at least one word")
        return patterns


class LoopRules(_Frozen):
    """``limit``: how many identical calls (same tool, same arguments) in a row one session may make;
    the call that reaches it is answered ``LOOP_DETECTED``. 0 turns loop detection off."""

    limit: int = Field(default=3, ge=0)


class Policy(_Frozen):
    """What may run without asking. Build with :meth:`load`, :meth:`from_dict` or keywords."""

    default: Action = "allow"
    risk: dict[Risk, Action] = Field(default_factory=dict)
    tools: dict[str, Action] = Field(default_factory=dict)
    commands: CommandRules | None = None
    loops: LoopRules = Field(default_factory=LoopRules)

    @classmethod
    def permissive(cls) -> Policy:
        """Everything allowed, no command rules (loop detection stays on)."""
        return cls()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Raises :class:`ConfigurationError` naming the first wrong entry."""
        body = data.get("policy", data) if isinstance(data, Mapping) else data
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "policy"
            raise ConfigurationError(f"policy: {where}: {first['msg']}") from exc

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """A policy file: TOML (``.toml``) or JSON (anything else). Raises
        :class:`ConfigurationError` if it cannot be read or holds a wrong entry."""
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
            data = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
            raise ConfigurationError(f"cannot read policy file {file}: {exc}") from exc
        return cls.from_dict(data)

    def tool_action(self, name: str, risk: Risk) -> tuple[Action, str]:
        """The verdict for tool ``name`` before any argument is looked at, and the entry that gave
        it: an exact ``tools`` entry, else the first matching wildcard entry, else ``risk``, else
        ``default``."""
        if name in self.tools:
            return self.tools[name], f"tools.{name}"
        for pattern, action in self.tools.items():
            if fnmatch.fnmatchcase(name, pattern):
                return action, f"tools.{pattern}"
        if risk in self.risk:
            return self.risk[risk], f"risk.{risk}"
        return self.default, "default"
