"""The Lua scripts of :class:`toolfleet.tools.state.SessionStore`: one atomic step each for a
versioned save, an open (with ``replace``) and a close of a session's stored states (Redis runs a
script as one step, so a save never lands between a close's read of the state list and its
delete)."""

SAVE = """
-- KEYS: state, meta ; ARGV: expected version, data, default ttl_s, now, state name, state key prefix,
-- the session's epoch when loaded ; -1 session gone (or opened again since), -2 stale, else the new
-- version. Every key of the session is renewed: the other states' keys are the prefix + a listed
-- name (same {id} hash tag as KEYS, so the same cluster slot).
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if (redis.call('HGET', KEYS[2], 'epoch') or '') ~= ARGV[7] then return -1 end  -- closed, then opened again
local v = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if v ~= tonumber(ARGV[1]) then return -2 end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'version', v + 1)
local ttl = tonumber(redis.call('HGET', KEYS[2], 'ttl_s') or ARGV[3])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('HSET', KEYS[2], 'touched_at', ARGV[4])
local ok, names = pcall(cjson.decode, redis.call('HGET', KEYS[2], 'states') or '[]')
if not ok or type(names) ~= 'table' then names = {} end
local listed = false
for _, name in ipairs(names) do
  if name == ARGV[5] then listed = true
  elseif type(name) == 'string' and name ~= '' then redis.call('EXPIRE', ARGV[6] .. name, ttl) end
end
if not listed then  -- a state the session was opened without: list it, so close() finds it
  names[#names + 1] = ARGV[5]
  redis.call('HSET', KEYS[2], 'states', cjson.encode(names))
end
return v + 1
"""


DROP_STATES = """
local ok, names = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'states') or '[]')
if not ok or type(names) ~= 'table' then names = {} end
for _, name in ipairs(names) do
  if type(name) == 'string' and name ~= '' then redis.call('DEL', ARGV[1] .. name) end
end
"""

OPEN = """
-- KEYS: meta ; ARGV: state key prefix, replace ('1'/'0'), now, ttl_s, epoch, states (JSON list),
-- then name, data pairs. 0: open already (and not replace), else 1. One step: a save of the
-- session's previous life that lists a state lands before (and its key is deleted here) or after
-- (and finds the new epoch): never a state of the old life left under the new one.
if redis.call('EXISTS', KEYS[1]) == 1 and ARGV[2] ~= '1' then return 0 end
""" + DROP_STATES + """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'opened_at', ARGV[3], 'touched_at', ARGV[3], 'ttl_s', ARGV[4], 'epoch', ARGV[5],
           'states', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[4])
for i = 7, #ARGV, 2 do
  local key = ARGV[1] .. ARGV[i]
  redis.call('DEL', key)
  redis.call('HSET', key, 'data', ARGV[i + 1], 'version', 1)
  redis.call('EXPIRE', key, ARGV[4])
end
return 1
"""

CLOSE = """
-- KEYS: meta ; ARGV: state key prefix. 1 if the session was open. One step with the save script:
-- a save that lists a new state either lands before (its key is deleted here) or finds no session.
local open = redis.call('EXISTS', KEYS[1])
""" + DROP_STATES + """
redis.call('DEL', KEYS[1])
return open
"""
