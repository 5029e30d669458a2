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
 * - `redisson_lock_token:{K}` (string): the last fence issued. A new fence is the greater of the
 *   last + 1 and the server's clock in microseconds, so fences keep increasing even after the
 *   server lost its data (a restart without persistence, FLUSHALL) as long as its clock does not
 *   step back; the key expires a lease after the last grant (and not before the clock has passed
 *   the fence), so no lock leaves a key behind for good.
 * - `lockstep_ended:{K}` (sorted set): holders that ended (released their last hold, left the
 *   queue, were dropped by a forced release; `!<holder>` when the release found nothing to
 *   release) and applied forced releases (`force|<1|0>|<id>`, with their answer), scored by until
 *   when they are remembered (server ms). A late or second copy of one of their operations
 *   changes nothing and answers as the first did. The set expires with its last entry.
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

-- Microseconds on the server's clock: the floor of every new fence.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000.0 + tonumber(t[2])
end

-- Whether \`id\` ended recently enough to be remembered.
local function has_ended(ekey, id, now)
  local until_ms = redis.call('ZSCORE', ekey, id)
  return until_ms ~= false and until_ms ~= nil and tonumber(until_ms) > now
end

-- Remembers \`id\` as ended until \`until_ms\`; forgets entries that ran out; keeps the set no longer
-- than its last entry.
local function remember(ekey, id, until_ms, now)
  redis.call('ZREMRANGEBYSCORE', ekey, '-inf', fmt(now))
  redis.call('ZADD', ekey, fmt(until_ms), id)
  local ttl = redis.call('PTTL', ekey)
  if ttl < until_ms - now then redis.call('PEXPIRE', ekey, fmt(math.max(1, until_ms - now))) end
end

-- The next fence of the lock: above the last one and never below the clock in microseconds. The
-- counter is kept a lease after the grant, and at least until the clock has passed it.
local function next_fence(token, now, lease)
  local last = tonumber(redis.call('GET', token) or '0') or 0
  local fence = math.max(last + 1, math.floor(now_us()))
  local keep = math.max(lease, math.floor(fence / 1000 - now) + 1, redis.call('PTTL', token))
  redis.call('SET', token, fmt(fence), 'PX', fmt(keep))
  return fence
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
 * KEYS: K, token, channel, queue, queue timeout, ended.
 * ARGV: holder, mode ('x' | 's'), permits, limit (-1: unlimited), leaseMs, fair ('1' | '0'),
 * waiterTtlMs, count (the holder's count in that mode once granted).
 * Returns {1, fence, count} granted, {0, retryAfterMs} denied, {2} upgrade refused,
 * {3, storedLimit} limit mismatch, {4} permits over the limit, {5} not held (a re-entry into a
 * hold that is gone, or a late copy from a holder that ended).
 */
export const acquire = `${prelude}
local key, token, channel, qkey, tkey, ekey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local holder, excl = ARGV[1], ARGV[2] == 'x'
local permits, limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fair, waiterTtl, count = ARGV[6] == '1', tonumber(ARGV[7]), tonumber(ARGV[8])
local now = now_ms()
local st, changed = load(key, now)
local function finish()
  if changed then
    save(key, st, now)
    notify(channel, qkey, tkey, now)
  end
end

if not excl and st.limit ~= nil and st.limit ~= limit then finish() return {3, st.limit} end
if not excl and limit >= 0 and permits > limit then finish() return {4} end

-- the mode rules, ignoring the requester's own holds
local allowed, blocking = true, nil
local function block(e)
  allowed = false
  if blocking == nil or e < blocking then blocking = e end
end
local function check()
  if excl then
    for h, r in pairs(st.holders) do if h ~= holder then block(r.e) end end
    return
  end
  for h, r in pairs(st.holders) do if h ~= holder and r.x > 0 then block(r.e) end end
  if allowed then
    local taken = 0
    for h, r in pairs(st.holders) do if h ~= holder and r.s > 0 then taken = taken + r.p end end
    if limit >= 0 and taken + permits > limit then
      for h, r in pairs(st.holders) do if h ~= holder and r.s > 0 then block(r.e) end end
    end
  end
end

local me = st.holders[holder]
local expiresAt = now + lease
if me ~= nil then
  local held = me.s
  if excl then held = me.x end
  if held > 0 then
    -- re-entry, or a copy of one already applied: the count becomes the requested one
    if excl then me.x = count else me.s = count end
    me.e = math.max(me.e, expiresAt)
    save(key, st, now)
    dequeue(qkey, tkey, holder)
    return {1, fmt(me.f), count}
  end
  if excl then finish() return {2} end
  -- a writer taking the read lock: the queue does not apply to a current holder
  check()
  if not allowed then finish() return {0, fmt(math.max(1, blocking - now))} end
  me.s = count
  me.p = permits
  me.e = math.max(me.e, expiresAt)
  st.limit = limit
  save(key, st, now)
  dequeue(qkey, tkey, holder)
  return {1, fmt(me.f), count}
end

-- not a holder: a re-entry whose hold is gone, or a late copy from a holder that ended
if count > 1 or has_ended(ekey, holder, now) or has_ended(ekey, '!' .. holder, now) then finish() return {5} end

-- a new grant: the mode rules, then the fair queue
check()
local ahead = {}
if fair then
  for _, w in ipairs(load_queue(qkey, tkey, now)) do
    if w.h == holder then break end
    ahead[#ahead + 1] = w
  end
end
if allowed and #ahead == 0 then
  local fence = next_fence(token, now, lease)
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
 * KEYS: K, token, channel, queue, queue timeout, ended.
 * ARGV: holder, mode ('x' | 's'), count (the holder's count in that mode before the release),
 * leaseMs (how long an ended holder is remembered).
 * Returns the remaining count for that mode, or -1 when the holder holds nothing (and did not
 * just end: a copy of its last release answers 0 again).
 */
export const release = `${prelude}
local key, channel, qkey, tkey, ekey = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local holder, excl, count, lease = ARGV[1], ARGV[2] == 'x', tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local st, changed = load(key, now)
local me = st.holders[holder]
local remaining = -1
local woken = changed
if me == nil then
  -- a copy of a last release answers 0 again, a copy of a refused one -1 again; ended either way,
  -- so a late copy of one of its acquisitions grants nothing
  if has_ended(ekey, holder, now) then
    remaining = 0
    remember(ekey, holder, now + lease, now)
  else
    remember(ekey, '!' .. holder, now + lease, now)
  end
  if changed then save(key, st, now) end
else
  local held = me.s
  if excl then held = me.x end
  -- a count below the caller's: a copy of a release already applied
  remaining = held
  if held >= count then remaining = count - 1 end
  if excl then me.x = remaining else me.s = remaining end
  if (not excl) and remaining == 0 then me.p = 0 end
  if held > 0 and remaining == 0 then woken = true end
  if me.x == 0 and me.s == 0 then
    st.holders[holder] = nil
    remember(ekey, holder, now + lease, now)
  end
  save(key, st, now)
end
-- a hold ended (released or expired): waiters may enter
if woken then notify(channel, qkey, tkey, now) end
return remaining
`

/**
 * KEYS: the K of each request, in order. ARGV: for each request, holder and leaseMs.
 * Returns per request 1 (renewed), 0 (not held) or the error that request met (a key of another
 * type, say), so one bad key does not fail the others. Touches only the holder's own fields.
 */
export const renew = `${prelude}
local now = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local holder, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local field = P .. 'm|' .. holder
  local meta = redis.pcall('HGET', key, field)
  out[i] = 0
  if type(meta) == 'table' and meta.err then
    out[i] = meta.err
  elseif meta then
    local m = split(meta)
    if m[2] > now then
      local e = math.max(m[2], now + lease)
      redis.call('HSET', key, field, fmt(m[1]) .. '|' .. fmt(e))
      if redis.call('PTTL', key) < e - now then redis.call('PEXPIRE', key, fmt(e - now)) end
      out[i] = 1
    end
  end
end
return reply(out)
`

/**
 * KEYS: K, token, channel, queue, queue timeout, ended.
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

/**
 * KEYS: K, token, channel, queue, queue timeout, ended. ARGV: the operation's id, how long it is
 * remembered (ms). Drops every holder (remembered as ended until their holds would have expired);
 * 1 if anything was held. A second copy of the same id changes nothing and answers as the first.
 */
export const forceRelease = `${prelude}
local key, channel, qkey, tkey, ekey = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, memory = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
-- a copy answers as the first delivery did
if has_ended(ekey, 'force|1|' .. id, now) then return 1 end
if has_ended(ekey, 'force|0|' .. id, now) then return 0 end
local st = load(key, now)
local held = 0
for h, r in pairs(st.holders) do
  held = 1
  remember(ekey, h, r.e, now)
end
redis.call('DEL', key)
remember(ekey, 'force|' .. held .. '|' .. id, now + memory, now)
notify(channel, qkey, tkey, now)
return held
`

/**
 * KEYS: K, token, channel, queue, queue timeout, ended. ARGV: holder, leaseMs. Leaves the fair
 * queue (a waiter that is not a holder is remembered as ended for leaseMs); tells the new head.
 */
export const cancel = `${prelude}
local key, channel, qkey, tkey, ekey = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local holder, lease = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local before = load_queue(qkey, tkey, now)
dequeue(qkey, tkey, holder)
if redis.call('HEXISTS', key, holder) == 0 and redis.call('HEXISTS', key, P .. 's|' .. holder) == 0 then
  remember(ekey, holder, now + lease, now)
end
if #before > 0 and before[1].h == holder and #before > 1 then
  redis.call('PUBLISH', channel, before[2].h)
end
return 0
`
