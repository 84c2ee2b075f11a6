"""A circuit breaker per tool, shared by the whole fleet through Redis.

States (hash ``<ns>:breaker:{<tool>}``, its run of consecutive failures counted in
``<ns>:breaker:{<tool>}:failures``, every transition one Lua script)::

    closed ──N consecutive failures──▶ open ──cooldown over, a dispatcher asks──▶ probing
      ▲                                  ▲                                          │
      └──────── health check passed ─────┼──────────── health check failed ─────────┘

- Failures are what says the *tool* is broken, not the request: an unexpected exception in the
  handler, a time limit hit without the handler noticing, a lost worker. A ``ToolFailure`` the
  handler raises on purpose (file not found, command exited 1) is the tool working; it resets the
  count like a success. Workers report every failure, and a call that worked when a run of
  failures was counted before it began (its claim read the counter) or while it ran (the failure
  was published to the pool processes: toolfleet/worker/breaker_notices.py); the dispatcher reports
  the workers it declares lost.
- While open or probing, the dispatcher gives new calls ``TOOL_UNAVAILABLE`` without sending them.
- After ``breaker_cooldown_s``, the first dispatcher that asks moves the breaker to ``probing`` and
  sends one health check (side-effect free: the tool's ``health_check``, or only "a worker serving
  it answers") to the tool's queue; its outcome closes or reopens the breaker. A health check
  that never answers is retried after another cooldown.
"""

from __future__ import annotations

from typing import Any

import redis

from .keys import Keys
from .settings import Settings

CLOSED, OPEN, PROBE = "closed", "open", "probe"

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


def success_lua(key: str, failures: str) -> str:
    """Lua that counts one call that worked against the breaker hash ``key`` and its failure
    counter ``failures`` (Lua expressions for the keys, :meth:`Keys.breaker` and
    :meth:`Keys.breaker_failures`): a closed breaker's run of failures ends. Also run by the
    ledger's record script, so a worker reports a call that worked in the same round trip as its
    result. One read when there is nothing to reset (no failures counted): the usual case."""
    return f"""
if redis.call('EXISTS', {failures}) == 1 and (redis.call('HGET', {key}, 'state') or 'closed') == 'closed' then
  redis.call('DEL', {failures})
end
"""


_OBSERVE = """
-- KEYS: breaker, failures ; ARGV: ok (1/0), threshold, channel, tool
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state ~= 'closed' then return state end
if ARGV[1] == '1' then
""" + success_lua("KEYS[1]", "KEYS[2]") + """
  return 'closed'
end
local n = redis.call('INCR', KEYS[2])
-- the calls of the tool running now reset the count when they work (worker/breaker_notices.py)
redis.call('PUBLISH', ARGV[3], ARGV[4])
if n >= tonumber(ARGV[2]) then""" + _NOW + """
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now)
  return 'open'
end
return 'closed'
"""

_CHECK = """
-- KEYS: breaker ; ARGV: cooldown_ms
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'closed' then return 'closed' end""" + _NOW + """
local since = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
if now < since + tonumber(ARGV[1]) then return 'open' end
redis.call('HSET', KEYS[1], 'state', 'probing', 'opened_at', now)
return 'probe'
"""

_HEALTH = _NOW + """
-- KEYS: breaker, failures ; ARGV: ok (1/0)
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'state', 'closed')
  redis.call('DEL', KEYS[2])
  return 'closed'
end
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now)
return 'open'
"""


class Breakers:
    """The breakers of one namespace (one Redis client; per process)."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self._client = client
        self._observe = client.register_script(_OBSERVE)
        self._check = client.register_script(_CHECK)
        self._health = client.register_script(_HEALTH)

    def observe(self, tool: str, ok: bool) -> str:
        """Count one finished call of ``tool``; returns the state after it."""
        return _s(self._observe(keys=[self.keys.breaker(tool), self.keys.breaker_failures(tool)],
                                args=[int(ok), self.settings.breaker_failures, self.keys.breaker_failed_channel,
                                      tool]))

    def read_state(self, pipe: Any, tool: str) -> None:
        """Queue the read :meth:`check` starts with on ``pipe``; :func:`closed_state` tells its reply."""
        pipe.hget(self.keys.breaker(tool), "state")

    def check(self, tool: str) -> str:
        """``closed`` (send the call), ``open`` (refuse it) or ``probe`` (refuse it, and send one
        health check now: this caller won the right to). A closed breaker is one read (``HGET``);
        only another state runs the script that may move it to probing."""
        state = self._client.hget(self.keys.breaker(tool), "state")
        if state is None or _s(state) == CLOSED:
            return CLOSED
        cooldown_ms = int(self.settings.breaker_cooldown_s * 1000)
        return _s(self._check(keys=[self.keys.breaker(tool)], args=[cooldown_ms]))

    def health(self, tool: str, ok: bool) -> str:
        """Record a health check's outcome: closes the breaker, or opens it for another cooldown."""
        return _s(self._health(keys=[self.keys.breaker(tool), self.keys.breaker_failures(tool)], args=[int(ok)]))


def closed_state(reply: object) -> bool:
    """Whether a :meth:`Breakers.read_state` reply says closed (no state yet counts as closed);
    ``False`` for an error reply, so :meth:`Breakers.check` reads it again."""
    return reply is None or (not isinstance(reply, Exception) and _s(reply) == CLOSED)


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
