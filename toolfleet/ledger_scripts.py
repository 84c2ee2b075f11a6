"""The turn ledger's Lua scripts (:mod:`toolfleet.ledger` runs them; each is one atomic step).

Key and argument lists are in each script's first comment line. A call that worked also counts
for its tool's circuit breaker inside ``RECORD`` (:func:`toolfleet.breaker.success_lua`).
"""

from __future__ import annotations

from .breaker import success_lua

# Stores the result unless the call has one (first result wins; the same result again answers 1, a
# retry whose first reply was lost), with its result event (the audit
# trail's ``finished`` entry is read from it: :meth:`toolfleet.audit.AuditLog.read`). The results
# hash (with its marker field ''), the event stream and the audit stream exist since the turn was
# opened and submitted, with their time to live (renewed per turn: ``renew_lease``, ``end_turn``;
# set again by a claim that found the turn's keys lost), so a worker's result that found its claim
# (``claimed``) leaves them be; any other result (the dispatcher's own, or one whose claim Redis
# lost with its data) sets all three, and marks the call decided (``d:``) in the runs hash.
# KEYS[1..4] of the script: results, events, audit, runs; a fenced result's refusal goes to ``late``.
_STORE_RESULT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  -- this very result again (a step retried after its reply was lost): it is the call's, no late note
  if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return 1 end
  if ARGV[5] ~= nil and ARGV[5] ~= '' then late() end
  return 0
end
redis.call('XADD', KEYS[2], '*', 'type', 'result', 'call_id', ARGV[1], 'data', ARGV[2])
if not claimed then
  -- no claim of this call made this result: mark it decided in runs (KEYS[4]), where a later claim
  -- looks first (CLAIM reads the results hash only for a call begun before)
  redis.call('HSET', KEYS[4], 'd:' .. ARGV[1], '1')
  for i = 1, 4 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3])) end
end
return 1
"""

# A worker's result carries its claim's fencing token: refused (kept as a late note for the operator,
# never as the call's result) when a newer execution holds the call or the caller already has a result.
_LATE = """
local function late()
  redis.call('HSET', KEYS[5], ARGV[1] .. ' ' .. ARGV[5], ARGV[2])
  redis.call('EXPIRE', KEYS[5], tonumber(ARGV[3]))
  redis.call('XADD', KEYS[3], '*', 'type', 'late', 'call_id', ARGV[1], 'data', ARGV[4])
  -- the audit trail reads its started/finished entries from the event stream: both live as long
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
end
"""

_FENCED = """
local claimed = false
if ARGV[5] ~= '' then
  -- no fence entry at all: Redis lost its data (restarted without persistence); nobody claimed
  -- the call since, so this execution's result is still the one (first result wins)
  local f = redis.call('HGET', KEYS[4], 'f:' .. ARGV[1])
  local current = f and string.match(f, '^(%d+)') or ARGV[5]
  if current ~= ARGV[5] then late() return 0 end
  claimed = f ~= false
end
"""

RECORD = """
-- KEYS: results, events, audit, runs, late[, breaker, breaker failures]
-- ARGV: call_id, result_json, ttl, audit_json, fencing_token ('' = unfenced: the dispatcher's own answers)
""" + _LATE + "if #KEYS >= 7 then" + success_lua("KEYS[6]", "KEYS[7]") + "end" + _FENCED + _STORE_RESULT

RECORD_UNSTARTED = """
-- KEYS: results, events, audit, runs ; ARGV: call_id, result_json, ttl, audit_json
local function late() end
local claimed = false
if redis.call('HEXISTS', KEYS[4], 's:' .. ARGV[1]) == 1 then return 0 end""" + _STORE_RESULT

CLAIM = """
-- KEYS: results, events, runs, cancelled, audit, armed, ended, lease[, fence_counter[, breaker failures]]
-- ARGV: call_id, started_json, ttl, hard_limit_ms, submitted_at (unix s, dispatcher clock), pid[, token]
-- (no fence_counter key: a Redis Cluster, where it lives in another slot; the token was taken before, ARGV[6])
-- (the audit trail's 'started' entry is read from the 'started' event: toolfleet.audit.AuditLog.read)
local cid = ARGV[1]
-- cancelled, ended, lease, armed[, the tool's breaker failures: the reply's last word, 1 if counted]
local flag = redis.call('MGET', KEYS[4], KEYS[7], KEYS[8], KEYS[6], KEYS[10] or KEYS[4])
local seen = (KEYS[10] and not flag[5]) and ' 0' or ' 1'
if flag[1] then return 'cancelled' end
if flag[2] or not flag[3] then return 'ended' end
-- field 'turn': set with the hash's time to live when the turn opened (missing: Redis lost it)
local run = redis.call('HMGET', KEYS[3], 'f:' .. cid, 's:' .. cid, 'n:' .. cid, 'x:' .. cid, 'turn', 'd:' .. cid)
local held, before, attempts, after, opened = run[1], run[2], run[3], run[4], run[5]
-- a result exists: one no claim made is marked 'd:' (RECORD, RECORD_UNSTARTED, a denial); a
-- worker's is only possible for a call begun before ('s:'); where runs lost its data, look
if run[6] or ((before or not opened) and redis.call('HEXISTS', KEYS[1], cid) == 1) then return 'done' end
if not flag[4] then return 'unarmed' end
-- fencing: a message sent before the dispatcher sent the call again is superseded; every claim
-- takes a new token from the namespace's counter and its deadline (Redis clock + hard limit)
if after and tonumber(ARGV[5]) < tonumber(after) then return 'superseded' end
-- Redis's clock in ms: TIME where it is needed before anything is written; on the usual path the
-- 'started' entry's stream id gives it (when its sequence is 0), one command fewer per call
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- a copy of the message whose execution holds the call (a replay, or a duplicate delivery): the
-- holder is live (deadline not passed, no worker reported its process dead) and this message was
-- not sent after the holder's: it neither runs nor takes the call (docs/signing.md, "Replays")
if held and before ~= ARGV[2] then
  local f = {}
  for part in string.gmatch(held, '%S+') do f[#f + 1] = part end
  local sent = tonumber(f[4] or '')
  if f[5] ~= 'dead' and sent and tonumber(ARGV[5]) <= sent and tonumber(f[2]) > clock() then return 'running' end
end
local token
if #KEYS >= 9 then token = redis.call('INCR', KEYS[9]) else
  token = ARGV[7]
  -- taken before this script: a claim that took a later token may already hold the call
  if held and tonumber(string.match(held, '^(%d+)')) > tonumber(token) then return 'superseded' end
end
local function fence(now) return token .. ' ' .. (now + tonumber(ARGV[4])) .. ' ' .. ARGV[6] .. ' ' .. ARGV[5] end
local function expire_turn() end
if not opened then
  -- the turn's keys lost their time to live with Redis's data (or predate it): the keys this
  -- claim writes get theirs here, as the streams this claim creates would otherwise keep none;
  -- so does the results hash, with its marker field '' (a call id is never empty), which this
  -- call's result then finds with its time to live (RECORD sets none for a claimed call). The
  -- field 'turn' stays unset (only open_turn sets it): the runs hash no longer holds every call's
  -- 'd:' mark, so every later claim of the turn reads the results hash too
  redis.call('HSETNX', KEYS[1], '', '')
  expire_turn = function() for _, i in ipairs({1, 2, 3, 5}) do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3])) end end
end
-- this same claim, retried after its reply was lost: the same execution, holding the new token
if before == ARGV[2] then
  redis.call('HSET', KEYS[3], 'f:' .. cid, fence(clock()))
  expire_turn()
  return 'ok ' .. token .. seen
end
local id = redis.call('XADD', KEYS[2], '*', 'type', 'started', 'call_id', cid, 'data', ARGV[2])
-- the id's ms part is Redis's clock only when its sequence is 0: a sequence above 0 means the
-- stream's last id had that ms already (an entry of the same ms, or one ahead of the clock after
-- it stepped back or a failover), which would stretch the deadline: the clock is read then
local ms, seq = string.match(id, '^(%d+)-(%d+)$')
local now = seq == '0' and tonumber(ms) or clock()
redis.call('HSET', KEYS[3], 'f:' .. cid, fence(now), 's:' .. cid, ARGV[2], 'n:' .. cid, (tonumber(attempts) or 0) + 1)
expire_turn()
if before then return 'restarted ' .. token .. seen end
return 'ok ' .. token .. seen
"""

OPEN = """
-- KEYS: calls, armed, lease, events, runs, results
-- ARGV: ttl, lease_ms, armed (1/0), opened_at (unix s), exclusive (1/0), then (call_id, name) pairs
-- one script, so no key of the turn is ever created without its time to live
-- exclusive: a turn id whose calls are registered already (another process opened it) is left
-- alone, nothing written: returns false (one opener of a turn id, decided here)
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return false end
local ttl = tonumber(ARGV[1])
if #ARGV > 5 then
  for i = 6, #ARGV, 1000 do redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV))) end
  redis.call('EXPIRE', KEYS[1], ttl)
end
if ARGV[3] == '1' then redis.call('SET', KEYS[2], '1', 'EX', ttl) end
redis.call('SET', KEYS[3], '1', 'PX', tonumber(ARGV[2]))
local id = redis.call('XADD', KEYS[4], '*', 'type', 'open', 'call_id', '', 'data', ARGV[4])
-- the results hash exists from the start, with its time to live (a worker's result adds to it
-- without setting one); its marker field '' is never a call id (a call without an id is refused
-- before it reaches the ledger) and Ledger.results skips it
-- returns the open event's id for a new turn (its driver reads what follows), '0-0' for a turn id
-- opened again (its driver reads its whole stream: results recorded before count)
local fresh = redis.call('HSETNX', KEYS[6], '', '') == 1
if fresh then
  -- a new results hash: no result of the turn can exist without its 'd:' mark in runs, so 'turn'
  -- tells a claim it may trust the marks. Not for a turn id opened again whose results survived a
  -- loss of runs (a resumed graph re-submits under the same id): its claims read the results
  redis.call('HSET', KEYS[5], 'turn', 'open')
end
-- runs too on a turn id opened again: end_turn trusts the time to live set here (Ledger.end_turn)
for i = 4, 6 do redis.call('EXPIRE', KEYS[i], ttl) end
if fresh then return id end
return '0-0'
"""

ADD = """
-- KEYS: calls, results, events, cancelled, runs
-- ARGV: ttl, then (call_id, name, not_executed_json) triples
local ttl = tonumber(ARGV[1])
local cancelled = redis.call('EXISTS', KEYS[4]) == 1
local refused = {}
local names = {}
for i = 2, #ARGV, 3 do
  names[#names + 1] = ARGV[i]
  names[#names + 1] = ARGV[i + 1]
  if #names >= 1000 then redis.call('HSET', KEYS[1], unpack(names)) names = {} end
  if cancelled then
    if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 2]) == 1 then
      redis.call('XADD', KEYS[3], '*', 'type', 'result', 'call_id', ARGV[i], 'data', ARGV[i + 2])
      redis.call('HSET', KEYS[5], 'd:' .. ARGV[i], '1')  -- decided (Keys.turn_runs)
    end
    refused[#refused + 1] = ARGV[i]
  end
end
if #names > 0 then redis.call('HSET', KEYS[1], unpack(names)) end
-- results and events exist since open_turn with their time to live: renewed only where written here
if cancelled then for _, i in ipairs({1, 2, 3, 5}) do redis.call('EXPIRE', KEYS[i], ttl) end
else redis.call('EXPIRE', KEYS[1], ttl) end
return refused
"""

REOPEN = """
-- KEYS: calls, armed, results, events, runs
-- ARGV: ttl, armed (1/0), n_calls, (call_id, name)*, (call_id, result)*
local missing = redis.call('EXISTS', KEYS[1]) == 0
local ttl = tonumber(ARGV[1])
local n = tonumber(ARGV[3])
for i = 4, 3 + 2 * n, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
-- each result the caller holds is decided: its 'd:' mark in runs is what a claim reads first, and
-- Redis may have lost the mark with the result (restarted from an older snapshot, a lagging replica)
-- while the runs hash kept its 'turn' field
for i = 4 + 2 * n, #ARGV, 2 do
  redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1])
  redis.call('HSET', KEYS[5], 'd:' .. ARGV[i], '1')
end
redis.call('HSETNX', KEYS[3], '', '')  -- the results hash's marker (Ledger.open_turn)
if ARGV[2] == '1' then redis.call('SET', KEYS[2], '1', 'EX', ttl) end
for i = 1, 5 do redis.call('EXPIRE', KEYS[i], ttl) end
if missing then return 1 end
return 0
"""

CANCEL = """
-- KEYS: calls, runs, results, cancelled, events, audit ; ARGV: reason, ttl, channel
local ttl = tonumber(ARGV[2])
if redis.call('SET', KEYS[4], ARGV[1], 'NX', 'EX', ttl) == false then return -1 end
local calls = redis.call('HGETALL', KEYS[1])
local ids = {}
for i = 1, #calls, 2 do
  local cid, name = calls[i], calls[i + 1]
  if redis.call('HEXISTS', KEYS[2], 's:' .. cid) == 0 and redis.call('HEXISTS', KEYS[3], cid) == 0 then
    local msg = 'The turn was cancelled before this call started; it did not run.'
    local hint = 'Nothing happened; ask again if the call is still wanted.'
    local content = 'Error [NOT_EXECUTED]: ' .. msg .. '\\nHint: ' .. hint
    local res = cjson.encode({call_id = cid, name = name, status = 'error', content = content,
      error = {code = 'NOT_EXECUTED', message = msg, hint = hint}, attempts = 0})
    redis.call('HSET', KEYS[3], cid, res)
    redis.call('XADD', KEYS[5], '*', 'type', 'result', 'call_id', cid, 'data', res)
    redis.call('HSET', KEYS[2], 'd:' .. cid, '1')  -- decided: a claim refuses it without the cancelled flag
    ids[#ids + 1] = cid
  end
end
redis.call('XADD', KEYS[5], '*', 'type', 'cancel', 'call_id', '', 'data', ARGV[1])
for i = 1, 6 do redis.call('EXPIRE', KEYS[i], ttl) end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return ids
"""

RESTORE_CANCEL = """
-- KEYS: cancelled, events ; ARGV: reason, ttl, channel
-- the cancel's flag, event and broadcast, no call marked: after Redis lost its data the runs hash is
-- gone, so "not started" can no longer be told (CANCEL would answer a running call NOT_EXECUTED)
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', tonumber(ARGV[2])) == false then return 0 end
redis.call('XADD', KEYS[2], '*', 'type', 'cancel', 'call_id', '', 'data', ARGV[1])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""

FENCE_DEAD = """
-- KEYS: runs ; ARGV: call_id, pid
-- the pool process ``pid`` that held the call died (the worker saw it): its claim no longer
-- keeps a redelivered copy of the message from running ("token deadline pid sent_at dead")
local held = redis.call('HGET', KEYS[1], 'f:' .. ARGV[1])
if not held then return 0 end
local f = {}
for part in string.gmatch(held, '%S+') do f[#f + 1] = part end
if f[3] ~= ARGV[2] or #f < 4 then return 0 end
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], f[1] .. ' ' .. f[2] .. ' ' .. f[3] .. ' ' .. f[4] .. ' dead')
return 1
"""

CHECK_FENCE = """
-- KEYS: runs, results, cancelled[, journal entry] ; ARGV: call_id, token, refuse_if_cancelled (1/0)
-- '' while the token still holds the call, else why not (the caller refuses its step)
local f = redis.call('HGET', KEYS[1], 'f:' .. ARGV[1])
if not f then return 'the ledger has no claim of this call' end
local token, deadline = string.match(f, '^(%d+) (%d+)')
if token ~= ARGV[2] then return 'a newer execution (fencing token ' .. token .. ') holds the call' end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 'the caller already has the result of this call' end
if ARGV[3] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then return 'the turn was cancelled' end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(deadline) then return 'the hard time limit of this execution has passed' end
if #KEYS >= 4 and redis.call('HGET', KEYS[4], 'token') ~= ARGV[2] then
  return 'another execution holds its idempotency key'
end
return ''
"""
