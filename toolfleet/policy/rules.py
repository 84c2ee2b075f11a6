"""Remembered rules: approvals (or denials) a person chose to keep, in Redis, per workspace.

``approve(call_id, remember="git *")`` stores ``Rule(tool="run_command", action="allow",
pattern="git *", workspace=<the turn's workspace>)``; later calls that match it are answered
without asking, by the dispatcher and by the workers alike (both read this store). A remembered
rule only answers what the policy would otherwise *ask*: a configured ``deny`` always wins.

Stored as one hash, ``<ns>:policy:rules`` (rule id -> JSON), without a time to live: a rule lasts
until it is forgotten (``toolfleet rules --forget ID``).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from typing import Literal

import redis
from pydantic import BaseModel, ConfigDict

from ..errors import BrokerUnavailable
from ..keys import Keys


class Rule(BaseModel):
    """``pattern`` is a command pattern (tools with a command argument) or ``None`` (the whole tool).
    ``workspace`` is a directory (compared after normalising), ``""`` for turns without a
    workspace, or ``None`` for every workspace (only when added explicitly: an approval always
    remembers its turn's workspace)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    action: Literal["allow", "deny"]
    pattern: str | None = None
    workspace: str | None = None
    by: str = ""
    created_at: float = 0.0

    @property
    def id(self) -> str:
        """Stable id: the same rule remembered twice is stored once."""
        key = json.dumps([self.tool, self.action, self.pattern, self.workspace])
        return hashlib.sha1(key.encode()).hexdigest()[:12]

    def applies(self, tool: str, workspace: str | None) -> bool:
        """True for calls of ``tool`` in ``workspace``."""
        return self.tool == tool and (self.workspace is None or self.workspace == workspace_key(workspace))

    def describe(self) -> str:
        what = f"`{self.pattern}`" if self.pattern else "the tool"
        where = "everywhere" if self.workspace is None else f"in {self.workspace or 'turns without a workspace'}"
        return f"remembered {self.action} {self.tool} {what} {where}"


def workspace_key(workspace: str | None) -> str:
    """How a workspace is compared: normalised (``/srv/ws/`` is ``/srv/ws``), ``""`` for none."""
    return posixpath.normpath(workspace) if workspace else ""


class RuleStore:
    """The remembered rules of one namespace."""

    def __init__(self, client: redis.Redis, keys: Keys, url: str) -> None:
        self.redis = client
        self.url = url
        self.key = keys.policy_rules

    def add(self, rule: Rule) -> Rule:
        """Store ``rule`` (stamped with the time) and return it."""
        if rule.created_at == 0.0:
            rule = rule.model_copy(update={"created_at": time.time()})
        try:
            self.redis.hset(self.key, rule.id, rule.model_dump_json())
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.url, str(exc)) from exc
        return rule

    def all(self) -> list[Rule]:
        try:
            raw = self.redis.hgetall(self.key)
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.url, str(exc)) from exc
        return sorted((Rule.model_validate_json(v) for v in raw.values()), key=lambda r: r.created_at)

    def matching(self, tool: str, workspace: str | None) -> list[Rule]:
        """The rules that apply to ``tool`` in ``workspace``."""
        return [rule for rule in self.all() if rule.applies(tool, workspace)]

    def forget(self, rule_id: str) -> bool:
        """Remove a rule by id; False if there was none."""
        try:
            return bool(self.redis.hdel(self.key, rule_id))
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.url, str(exc)) from exc

