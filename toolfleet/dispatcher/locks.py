"""Resource locks across turns (issue "Faults", locks).

Within a turn the plan orders conflicting calls. Across turns (other processes, other machines)
the turns that write overlapping resources of the same workspace must not interleave: a turn takes
an exclusive lock on every resource its writes touch before it sends any of them, all at once
(so two turns cannot deadlock), and holds them until its last result is in. Turns run one after
the other on those resources, like the calls within a turn. Reads take no lock.

Locks live in one Redis hash per namespace (:attr:`toolfleet.keys.Keys.locks`); conflicts use the
planner's rule (:func:`toolfleet.tools.overlaps`: by path prefix, ``*`` is everything) within one
workspace. Paths are canonical (links resolved beneath the workspace, see
:mod:`toolfleet.tools.resources`), so two spellings of one file take one lock.
Each lock has a lease on the Redis clock, renewed by the holding dispatcher while its
turn runs; a dead holder's locks lapse after one lease. The lease is ``lock_lease_s`` while none
of the turn's writes is in flight, and long enough that a holder frozen (not dead) cannot lose its
locks while a write it sent may still act while some are: ``lock_lease_s`` + ``turn_lease_s``
(after which workers refuse the turn's calls) + the longest hard time limit of those writes +
``clock_skew_margin_s`` (:func:`lease_s`; set before such a write is sent, :mod:`.turn_locks`).
An acquire never shortens the table's own expiry, and one refused by a live conflict writes
nothing. A holder whose lease lapsed and whose lock
another turn then removed is *lapsed*: its next acquire is refused with the name of that turn
(``LAPSED`` prefix), so it never takes the lock again and sends no more writes (they would
interleave with the other turn's).

A turn whose dispatcher answered a call that may still act (its worker went silent, or a cancel it
could not confirm: ``WORKER_LOST``, ``OUTCOME_UNKNOWN``) is *held* (:meth:`ResourceLocks.hold`)
until that execution's deadline (hard time limit) plus ``clock_skew_margin_s``: releasing then
keeps its locks until that time, so the next turn's write on the same path cannot come before a
late write of a frozen holder (which its fencing check refuses once it is past its deadline).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import redis

from ..keys import Keys
from ..redis_client import translated
from ..settings import Settings

_ACQUIRE = """
-- KEYS: locks, lapsed ; ARGV: owner, lease_ms, name...   (name = workspace .. '\\n' .. resource)
-- lapsed: owner -> '<the turn that removed its expired locks> <ms>' (a holder whose lease lapsed is told so)
local gone = redis.call('HGET', KEYS[2], ARGV[1])
if gone then return '!' .. string.match(gone, '^%S+') end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function split(s)
  local i = string.find(s, '\\n', 1, true)
  return string.sub(s, 1, i - 1), string.sub(s, i + 1)
end
local function parts(r)
  local i = string.find(r, ':', 1, true)
  if not i then return r, '' end
  return string.sub(r, 1, i - 1), string.sub(r, i + 1)
end
local function overlap(a, b)
  local wa, ra = split(a)
  local wb, rb = split(b)
  if wa ~= wb then return false end
  if ra == '*' or rb == '*' then return true end
  local ka, pa = parts(ra)
  local kb, pb = parts(rb)
  if ka ~= kb then return false end
  if pa == '' or pb == '' or pa == pb then return true end
  return string.sub(pb, 1, #pa + 1) == pa .. '/' or string.sub(pa, 1, #pb + 1) == pb .. '/'
end
-- first look, writing nothing: a live conflicting lock refuses the whole request
local held = redis.call('HGETALL', KEYS[1])
local lapsed = {}
for i = 1, #held, 2 do
  local name, val = held[i], held[i + 1]
  local sp = string.find(val, ' ', 1, true)
  local owner, until_ms = string.sub(val, 1, sp - 1), tonumber(string.sub(val, sp + 1))
  if owner ~= ARGV[1] then
    if until_ms > now then
      for j = 3, #ARGV do
        if overlap(name, ARGV[j]) then return owner end
      end
    else
      lapsed[#lapsed + 1] = name
      lapsed[#lapsed + 1] = owner
    end
  end
end
-- then take: the lapsed locks of others go, and their owners are marked (they never take a lock again)
if #lapsed > 0 then
  local marks = redis.call('HGETALL', KEYS[2])
  for i = 1, #marks, 2 do  -- a mark lives a day: its turn's lease lapsed long before
    if tonumber(string.match(marks[i + 1], '(%d+)$') or '0') < now - 86400000 then
      redis.call('HDEL', KEYS[2], marks[i])
    end
  end
  for i = 1, #lapsed, 2 do
    redis.call('HDEL', KEYS[1], lapsed[i])
    redis.call('HSET', KEYS[2], lapsed[i + 1], ARGV[1] .. ' ' .. now)
  end
  redis.call('PEXPIRE', KEYS[2], 86400000)
end
for j = 3, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[j], ARGV[1] .. ' ' .. (now + tonumber(ARGV[2])))
end
-- the table lives as long as its longest lease or hold: an acquire only ever lengthens its life
local ttl = 2 * tonumber(ARGV[2])
local pttl = redis.call('PTTL', KEYS[1])
if pttl >= 0 and pttl < ttl or pttl == -1 then redis.call('PEXPIRE', KEYS[1], ttl) end
return ''
"""

_RELEASE = """
-- KEYS: locks, holds, lapsed ; ARGV: owner
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local held = redis.call('HGETALL', KEYS[1])
local n = 0
for i = 1, #held, 2 do
  if string.sub(held[i + 1], 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
    if hold > now then
      redis.call('HSET', KEYS[1], held[i], ARGV[1] .. ' ' .. hold)
    else
      redis.call('HDEL', KEYS[1], held[i])
      n = n + 1
    end
  end
end
if hold > now then
  if redis.call('PTTL', KEYS[1]) < hold - now then redis.call('PEXPIRE', KEYS[1], hold - now + 1000) end
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
redis.call('HDEL', KEYS[3], ARGV[1])
return n
"""

_HOLD = """
-- KEYS: holds ; ARGV: owner, ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[2])
if until_ms > tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') then
  redis.call('HSET', KEYS[1], ARGV[1], until_ms)
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 1000) end
return until_ms
"""


def lock_names(workspace: str | None, resources: Iterable[str]) -> frozenset[str]:
    """The lock names of ``resources`` written in ``workspace`` (``None``: no workspace).

    ``resources`` come canonical from the plan (:func:`toolfleet.tools.resources.resolve`);
    the workspace is named by its real path when this machine has it, so two spellings of one
    workspace share locks. Where it does not, the name is as given (dispatchers that share a
    workspace should all see it, or none)."""
    return frozenset(f"{canonical_workspace(workspace)}\n{r}" for r in resources)


def canonical_workspace(workspace: str | None) -> str:
    """``workspace`` resolved (links followed) when it is a directory here, else as given."""
    if not workspace:
        return ""
    try:
        return os.path.realpath(workspace) if os.path.isdir(workspace) else workspace
    except (OSError, ValueError):
        return workspace


LAPSED = "!"  # acquire's answer to an owner whose lapsed lock another turn removed: "!" + that turn


def lease_s(settings: Settings, write_hard_s: float) -> float:
    """The lease (s) of a turn's locks whose writes have hard time limits up to ``write_hard_s``:
    ``lock_lease_s`` + ``turn_lease_s`` + ``write_hard_s`` + ``clock_skew_margin_s``. A holder that
    froze right after a renewal kept its turn's lease up to ``turn_lease_s`` longer (workers claim
    its calls until then), and a call claimed then may act until its hard limit: the locks outlive
    every effect of a holder that stopped renewing them."""
    return settings.lock_lease_s + settings.turn_lease_s + write_hard_s + settings.clock_skew_margin_s


class ResourceLocks:
    """Lock table of one namespace (thread-safe: redis-py pools its connections)."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.key = Keys(settings.namespace).locks
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._hold = client.register_script(_HOLD)
        self.holds_key = f"{self.key}:hold"
        self.lapsed_key = f"{self.key}:lapsed"

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lock_lease_s * 1000)

    def acquire(self, owner: str, names: Iterable[str], lease_s: float | None = None) -> str | None:
        """Take every lock in ``names`` for ``owner``, or none, for ``lease_s`` seconds (Redis
        clock; default ``lock_lease_s``). Returns ``None`` on success, else the owner holding a
        conflicting lock, or :data:`LAPSED` + the turn that removed ``owner``'s lapsed lock (then
        nothing is taken, now or later). Taking them again renews the lease (and restores locks
        Redis lost). Raises :class:`~toolfleet.errors.BrokerUnavailable` if Redis is away."""
        names = sorted(names)
        if not names:
            return None
        lease_ms = self.lease_ms if lease_s is None else max(int(lease_s * 1000), 1)
        with translated(self.settings.redis_url):
            holder = self._acquire(keys=[self.key, self.lapsed_key], args=[owner, lease_ms, *names])
        holder = holder.decode() if isinstance(holder, bytes) else str(holder or "")
        return holder or None

    def release(self, owner: str) -> int:
        """Drop every lock ``owner`` holds; returns how many. Locks under a :meth:`hold` stay until
        the hold ends (their lease is set to it)."""
        with translated(self.settings.redis_url):
            return int(self._release(keys=[self.key, self.holds_key, self.lapsed_key], args=[owner]))

    def hold(self, owner: str, seconds: float) -> None:
        """Keep ``owner``'s locks at least ``seconds`` from now (Redis clock), even past their
        release: one of its calls may still act until then (a frozen execution's deadline plus the
        clock-skew margin). Raises :class:`~toolfleet.errors.BrokerUnavailable` if Redis is away."""
        with translated(self.settings.redis_url):
            self._hold(keys=[self.holds_key], args=[owner, max(int(seconds * 1000), 1)])
