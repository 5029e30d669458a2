/**
 * The Lua scripts of the Redis backend. Each operation is one script, so it is atomic on the
 * server and judged on the server's clock (`TIME`).
 *
 * Layout of a lock named K (every key shares K's cluster slot: K has no braces, the others are
 * tagged `{K}`):
 * - `K` (hash): Redisson's RLock layout — field `<clientId>:<n>` -> exclusive hold count, the key's
 *   PEXPIRE the lease — so a Redisson process and lockstep exclude each other on the same name.
 *   lockstep adds fields of its own under the `lockstep|` prefix (Redisson's scripts only test for
 *   the key and for their own field):
 *   `lockstep|m|<holder>` -> `<fence>|<expiresAt ms>`, `lockstep|s|<holder>` -> `<count>|<permits>`
 *   for shared holds, and `lockstep|limit` -> the shared limit (-1: unlimited) while shared holds
 *   exist. The key's PEXPIRE is the latest expiry of its holders.
 * - `redisson_lock_token:{K}` (string): the fence counter, never reset.
 * - `redisson_lock__channel:{K}`: release notifications ("0", as Redisson sends; for a fair lock,
 *   the holder at the head of the queue).
 * - `lockstep_queue:{K}` (list) and `lockstep_queue_timeout:{K}` (hash holder -> expiresAt): the
 *   fair queue in arrival order and each waiter's expiry.
 */

const prelude = `
local P = 'lockstep|'

-- Times are floats and written with %.0f: Lua 5.1 (Redis) and Lua 5.3 with 32-bit integers
-- (the Lua VM of ioredis-mock) then agree on epoch milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000.0 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- ioredis-mock's Lua bridge only converts tables built by a constructor, so copy into one
-- (unpack is bounded by the Lua stack: larger replies go out as they are, fine on Redis)
local function reply(t)
  if #t <= 7000 then return { unpack(t) } end
  return t
end

local function split(v)
  local out = {}
  for part in string.gmatch(v, '[^|]+') do out[#out + 1] = tonumber(part) end
  return out
end

-- A key's live holders: holder -> { x = exclusive count, s = shared count, p = permits,
-- f = fence, e = expiresAt }. Holds without lockstep metadata are Redisson's: they live as long
-- as the key. Expired holds are dropped (changed = true).
local function load(key, now)
  local flat = redis.call('HGETALL', key)
  local st = { holders = {}, limit = nil }
  if #flat == 0 then return st, false end
  local pttl = redis.call('PTTL', key)
  local keyExpiry = now + 1e15
  if pttl > 0 then keyExpiry = now + pttl end
  local function get(h)
    local r = st.holders[h]
    if r == nil then
      r = { x = 0, s = 0, p = 0, f = 0, e = nil }
      st.holders[h] = r
    end
    return r
  end
  for i = 1, #flat, 2 do
    local f, v = flat[i], flat[i + 1]
    if string.sub(f, 1, 9) == P then
      local rest = string.sub(f, 10)
      local tag, h = string.sub(rest, 1, 2), string.sub(rest, 3)
      if rest == 'limit' then
        st.limit = tonumber(v)
      elseif tag == 'm|' then
        local m = split(v)
        local r = get(h)
        r.f = m[1]
        r.e = m[2]
      elseif tag == 's|' then
        local m = split(v)
        local r = get(h)
        r.s = m[1]
        r.p = m[2]
      end
    else
      get(f).x = tonumber(v)
    end
  end
  local changed = false
  local shared = false
  for h, r in pairs(st.holders) do
    if r.e == nil then r.e = keyExpiry end
    if r.e <= now or (r.x == 0 and r.s == 0) then
      st.holders[h] = nil
      changed = true
    elseif r.s > 0 then
      shared = true
    end
  end
  if not shared then st.limit = nil end
  return st, changed
end

local function save(key, st, now)
  redis.call('DEL', key)
  local args = {}
  local latest = nil
  local shared = false
  for h, r in pairs(st.holders) do
    if r.x > 0 then
      args[#args + 1] = h
      args[#args + 1] = fmt(r.x)
    end
    if r.s > 0 then
      shared = true
      args[#args + 1] = P .. 's|' .. h
      args[#args + 1] = fmt(r.s) .. '|' .. fmt(r.p)
    end
    if r.f > 0 then
      args[#args + 1] = P .. 'm|' .. h
      args[#args + 1] = fmt(r.f) .. '|' .. fmt(r.e)
    end
    if latest == nil or r.e > latest then latest = r.e end
  end
  if latest == nil then return end
  -- the limit is kept only while shared holds exist
  if shared and st.limit ~= nil then
    args[#args + 1] = P .. 'limit'
    args[#args + 1] = fmt(st.limit)
  end
  -- in chunks: unpack has a stack limit
  for i = 1, #args, 200 do
    redis.call('HSET', key, unpack(args, i, math.min(i + 199, #args)))
  end
  redis.call('PEXPIRE', key, fmt(math.max(1, latest - now)))
end

-- The live fair queue, in order: { { h = holder, e = expiresAt } ... }; expired entries dropped.
local function load_queue(qkey, tkey, now)
  local list = redis.call('LRANGE', qkey, 0, -1)
  local live = {}
  for _, h in ipairs(list) do
    local e = tonumber(redis.call('HGET', tkey, h))
    if e == nil or e <= now then
      redis.call('LREM', qkey, 0, h)
      redis.call('HDEL', tkey, h)
    else
      live[#live + 1] = { h = h, e = e }
    end
  end
  return live
end

local function dequeue(qkey, tkey, holder)
  if redis.call('HDEL', tkey, holder) == 1 then redis.call('LREM', qkey, 0, holder) end
end

-- Tells waiters that holds were released: the head of a fair queue by name, anyone else with "0".
local function notify(channel, qkey, tkey, now)
  local queue = load_queue(qkey, tkey, now)
  if #queue > 0 then
    redis.call('PUBLISH', channel, queue[1].h)
  else
    redis.call('PUBLISH', channel, '0')
  end
end
`

/**
 * KEYS: K, token, channel, queue, queue timeout.
 * ARGV: holder, mode ('x' | 's'), permits, limit (-1: unlimited), leaseMs, fair ('1' | '0'), waiterTtlMs.
 * Returns {1, fence, count} granted, {0, retryAfterMs} denied, {2} upgrade refused,
 * {3, storedLimit} limit mismatch, {4} permits over the limit.
 */
export const acquire = `${prelude}
local key, token, channel, qkey, tkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local holder, excl = ARGV[1], ARGV[2] == 'x'
local permits, limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fair, waiterTtl = ARGV[6] == '1', tonumber(ARGV[7])
local now = now_ms()
local st, changed = load(key, now)
local function finish()
  if changed then
    save(key, st, now)
    notify(channel, qkey, tkey, now)
  end
end

if not excl and limit >= 0 and permits > limit then finish() return {4} end
if not excl and st.limit ~= nil and st.limit ~= limit then finish() return {3, st.limit} end

local me = st.holders[holder]
local expiresAt = now + lease
if me ~= nil then
  if excl and me.x == 0 then finish() return {2} end
  if excl or me.s > 0 then
    -- re-entry: count + 1, expiry extended, same fence
    local count
    if excl then me.x = me.x + 1; count = me.x else me.s = me.s + 1; count = me.s end
    me.e = math.max(me.e, expiresAt)
    save(key, st, now)
    dequeue(qkey, tkey, holder)
    return {1, fmt(me.f), count}
  end
end

-- the mode rules, ignoring the requester's own holds
local allowed, blocking = true, nil
local function block(e)
  allowed = false
  if blocking == nil or e < blocking then blocking = e end
end
if excl then
  for h, r in pairs(st.holders) do if h ~= holder then block(r.e) end end
else
  for h, r in pairs(st.holders) do if h ~= holder and r.x > 0 then block(r.e) end end
  if allowed then
    local taken = 0
    for h, r in pairs(st.holders) do if h ~= holder and r.s > 0 then taken = taken + r.p end end
    if limit >= 0 and taken + permits > limit then
      for h, r in pairs(st.holders) do if h ~= holder and r.s > 0 then block(r.e) end end
    end
  end
end

if me ~= nil then
  -- a writer taking the read lock: the queue does not apply to a current holder
  if not allowed then finish() return {0, fmt(math.max(1, blocking - now))} end
  me.s = 1
  me.p = permits
  me.e = math.max(me.e, expiresAt)
  st.limit = limit
  save(key, st, now)
  dequeue(qkey, tkey, holder)
  return {1, fmt(me.f), 1}
end

-- a new grant: the mode rules, then the fair queue
local ahead = {}
if fair then
  for _, w in ipairs(load_queue(qkey, tkey, now)) do
    if w.h == holder then break end
    ahead[#ahead + 1] = w
  end
end
if allowed and #ahead == 0 then
  local fence = redis.call('INCR', token)
  local r = { x = 0, s = 0, p = 0, f = fence, e = expiresAt }
  if excl then r.x = 1 else r.s = 1; r.p = permits; st.limit = limit end
  st.holders[holder] = r
  save(key, st, now)
  dequeue(qkey, tkey, holder)
  return {1, fmt(fence), 1}
end
if fair then
  if redis.call('HSET', tkey, holder, fmt(now + waiterTtl)) == 1 then redis.call('RPUSH', qkey, holder) end
end
for _, w in ipairs(ahead) do
  if blocking == nil or w.e < blocking then blocking = w.e end
end
finish()
if blocking == nil then blocking = now + 1 end
return {0, fmt(math.max(1, blocking - now))}
`

/**
 * KEYS: K, token, channel, queue, queue timeout. ARGV: holder, mode ('x' | 's').
 * Returns the remaining count for that mode, or -1 when the holder does not hold the key in it.
 */
export const release = `${prelude}
local key, channel, qkey, tkey = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local holder, excl = ARGV[1], ARGV[2] == 'x'
local now = now_ms()
local st, changed = load(key, now)
local me = st.holders[holder]
local remaining = -1
if me ~= nil and ((excl and me.x > 0) or ((not excl) and me.s > 0)) then
  if excl then
    me.x = me.x - 1
    remaining = me.x
  else
    me.s = me.s - 1
    remaining = me.s
    if me.s == 0 then me.p = 0 end
  end
  if remaining == 0 and me.x == 0 and me.s == 0 then st.holders[holder] = nil end
end
if remaining >= 0 or changed then save(key, st, now) end
-- a hold ended (released or expired): waiters may enter
if remaining == 0 or changed then notify(channel, qkey, tkey, now) end
return remaining
`

/**
 * KEYS: the K of each request, in order. ARGV: for each request, holder and leaseMs.
 * Returns one 1 (renewed) or 0 (not held) per request. Touches only the holder's own fields.
 */
export const renew = `${prelude}
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local holder, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local meta = redis.call('HGET', key, P .. 'm|' .. holder)
  out[i] = 0
  if meta then
    local m = split(meta)
    if m[2] > now then
      local e = math.max(m[2], now + lease)
      redis.call('HSET', key, P .. 'm|' .. holder, fmt(m[1]) .. '|' .. fmt(e))
      if redis.call('PTTL', key) < e - now then redis.call('PEXPIRE', key, fmt(e - now)) end
      out[i] = 1
    end
  end
end
return reply(out)
`

/**
 * KEYS: K, token, channel, queue, queue timeout.
 * Returns {fence, limit or '', holders as flat {holder, x, s, p, f, ttl}..., '|', queue as flat {holder, ttl}...}.
 */
export const inspect = `${prelude}
local key, token, channel, qkey, tkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms()
local st, changed = load(key, now)
if changed then
  save(key, st, now)
  notify(channel, qkey, tkey, now)
end
-- '' for no limit: ioredis-mock's Lua bridge drops arrays that hold false
local limit = ''
if st.limit ~= nil then limit = fmt(st.limit) end
local out = { redis.call('GET', token) or '0', limit }
local holders = {}
for h, r in pairs(st.holders) do
  holders[#holders + 1] = { h, fmt(r.x), fmt(r.s), fmt(r.p), fmt(r.f), fmt(r.e - now) }
end
out[#out + 1] = #holders
for _, r in ipairs(holders) do
  for _, v in ipairs(r) do out[#out + 1] = v end
end
for _, w in ipairs(load_queue(qkey, tkey, now)) do
  out[#out + 1] = w.h
  out[#out + 1] = fmt(w.e - now)
end
return reply(out)
`

/** KEYS: K, token, channel, queue, queue timeout. Drops every holder; 1 if anything was held. */
export const forceRelease = `${prelude}
local key, channel, qkey, tkey = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms()
local st = load(key, now)
local held = next(st.holders) ~= nil
redis.call('DEL', key)
notify(channel, qkey, tkey, now)
if held then return 1 end
return 0
`

/** KEYS: K, token, channel, queue, queue timeout. ARGV: holder. Leaves the fair queue; tells the new head. */
export const cancel = `${prelude}
local channel, qkey, tkey = KEYS[3], KEYS[4], KEYS[5]
local holder = ARGV[1]
local now = now_ms()
local before = load_queue(qkey, tkey, now)
dequeue(qkey, tkey, holder)
if #before > 0 and before[1].h == holder and #before > 1 then
  redis.call('PUBLISH', channel, before[2].h)
end
return 0
`
