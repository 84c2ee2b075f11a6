"""Loop detection across the batches of one session.

A model that calls the same tool with the same arguments again and again is stuck: the result will
not change. Per session, Redis keeps the signature of the last call (tool name + canonical JSON of
its arguments), how many times in a row it came, and when. The call that makes it ``limit`` in a row
(default 3) is answered ``LOOP_DETECTED`` without running; so is every further repeat, until the
session calls something else.

State counts: a call's ``epoch`` (for a tool with stored session state, the state's version when
the batch is screened plus the writes on it earlier in the batch: :func:`toolfleet.tools.state.loop_epochs`)
is part of its signature, so a call is never refused when something it reads was written since
the last identical call (the third ``cd("..")`` in a row moves on each time). A tool declared
``loop_check=False`` is not counted at all.

Results count too: a repeat whose earlier identical calls of the run (the last ``limit - 1``)
already got different results is not refused (a file changed by something else between turns).
Repeats inside one batch have no results yet, so they count as before.

A tool declared ``pollable`` (a job-status check) is exempt while time passes: an identical call at
least ``poll_interval_s`` after the previous one starts the count again. Calls in one batch are
submitted at the same moment, so repeats inside a batch always count.

One Lua script per batch (one round trip), so concurrent batches of a session count correctly.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ..errors import BrokerUnavailable
from ..keys import Keys
from ..models import ErrorCode, ToolResult

_COUNT = """
-- KEYS: loop ; ARGV: ttl, now, keep, then (sig, poll_interval_s, ref) triples ;
-- returns per call its run length and the refs (JSON) of the calls of the run before it (the last `keep`)
local now, keep = tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'sig', 'count', 'at', 'refs')
local sig, count, at = state[1], tonumber(state[2] or '0'), tonumber(state[3] or '0')
local refs = {}
if state[4] then refs = cjson.decode(state[4]) end
local out = {}
for i = 4, #ARGV, 3 do
  local s, poll, ref = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if s == sig and not (poll > 0 and now - at >= poll) then count = count + 1 else count = 1; refs = {} end
  sig, at = s, now
  out[#out + 1] = count
  out[#out + 1] = cjson.encode(refs)
  refs[#refs + 1] = ref
  while #refs > keep do table.remove(refs, 1) end
end
redis.call('HSET', KEYS[1], 'sig', sig, 'count', count, 'at', at, 'refs', cjson.encode(refs))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return out
"""


@dataclass(frozen=True)
class LoopCheck:
    """One validated call as loop detection sees it (``poll_interval_s`` 0: not pollable)."""

    call_id: str
    name: str
    arguments: Mapping[str, Any]
    poll_interval_s: float = 0.0
    epoch: str = ""  # what the call reads, as it stands (state versions): part of the signature


def signature(name: str, arguments: Mapping[str, Any], epoch: str = "") -> str:
    """Tool name + canonical JSON of the arguments (+ the epoch of what it reads), hashed."""
    text = json.dumps([name, arguments, epoch] if epoch else [name, arguments], sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class LoopDetector:
    """Counts repeats per session in Redis (``<ns>:session:<id>:loop``, expiring ``ttl_s`` after
    the session's last call)."""

    def __init__(
        self, client: redis.Redis, keys: Keys, *, url: str, limit: int = 3, ttl_s: int = 24 * 3600
    ) -> None:
        self.redis = client
        self.url = url
        self.keys = keys
        self.limit = limit
        self.ttl_s = ttl_s
        self._count = client.register_script(_COUNT)

    def check(self, session_id: str | None, calls: Sequence[LoopCheck], now: float | None = None,
              turn_id: str = "") -> list[ToolResult]:
        """The ``LOOP_DETECTED`` results for the calls of one batch (model order) of turn
        ``turn_id`` that repeat too often; empty without a session id or with the limit off. A
        repeat whose earlier identical calls (the last ``limit - 1``) got different results is not
        a loop: something changed. Raises :class:`BrokerUnavailable` if Redis does not answer."""
        if not session_id or self.limit <= 0 or not calls:
            return []
        args: list[Any] = [self.ttl_s, time.time() if now is None else now, max(self.limit - 1, 1)]
        for call in calls:
            args += [signature(call.name, call.arguments, call.epoch), call.poll_interval_s,
                     json.dumps([turn_id, call.call_id])]
        try:
            out = self._count(keys=[self.keys.session_loop(session_id)], args=args)
            looping = []
            for call, n, refs in zip(calls, out[0::2], out[1::2], strict=True):
                if int(n) >= self.limit and not self._results_differ(refs):
                    looping.append(loop_detected(call, int(n)))
            return looping
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.url, str(exc)) from exc

    def _results_differ(self, refs_json: Any) -> bool:
        """Whether the earlier calls ``refs_json`` (JSON ``[[turn_id, call_id], ...]``) that have
        a result (other than ``LOOP_DETECTED``) got at least two different ones."""
        try:
            refs = json.loads(refs_json)
        except (TypeError, ValueError):
            return False
        if not isinstance(refs, list) or len(refs) < 2:
            return False
        pipe = self.redis.pipeline(transaction=False)
        for ref in refs:
            turn_id, call_id = json.loads(ref)
            pipe.hget(self.keys.turn_results(turn_id), call_id)
        seen = set()
        for raw in pipe.execute():
            if raw is None:
                continue
            try:
                result = ToolResult.model_validate_json(raw)
            except ValueError:
                continue
            if result.code != ErrorCode.LOOP_DETECTED:
                seen.add((result.status, result.content))
        return len(seen) > 1


def loop_detected(call: LoopCheck, times: int) -> ToolResult:
    hint = "use the result you already have, change the arguments, or try a different approach"
    if call.poll_interval_s > 0:
        hint += f"; to poll, wait at least {call.poll_interval_s:g} s between checks"
    return ToolResult.failure(
        call.call_id,
        call.name,
        ErrorCode.LOOP_DETECTED,
        f"{call.name} was called with the same arguments {times} times in a row in this session; "
        "it was not run again, because the result would not change",
        hint,
    )
