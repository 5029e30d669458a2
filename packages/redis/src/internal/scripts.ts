/**
 * The Lua scripts of the Redis backend. Each operation is one script, so it is atomic on the
 * server and judged on the server's clock (`TIME`). Scripts change fields in place and touch the
 * wait structures only when someone waits: an uncontended acquire and release run 10 Redis
 * commands between them (TIME, HGETALL, MGET, SET, HSET, PEXPIRE; HGETALL, DEL, SET, PUBLISH).
 *
 * Layout of a lock named K (every key shares K's cluster slot: K has no braces, the others are
 * tagged `{K}`):
 * - `K` (hash): Redisson's RLock layout — field `<clientId>:<n>` -> exclusive hold count, the key's
 *   PEXPIRE the lease — so a Redisson process and lockstep exclude each other on the same name.
 *   lockstep adds fields of its own under the `lockstep|` prefix (Redisson's scripts only test for
 *   the key and for their own field):
 *   `lockstep|m|<holder>` -> `<fence>|<expiresAt ms>`, `lockstep|s|<holder>` -> `<count>|<permits>`
 *   for shared holds, `lockstep|limit` -> the shared limit (-1: unlimited) while shared holds
 *   exist, and `lockstep|w` while lockstep waiters may be registered (see below). The key's
 *   PEXPIRE is the latest expiry of its holders.
 * - `redisson_lock_token:{K}` (string): the last fence issued. A new fence is the greater of the
 *   last + 1 and the server's clock in microseconds, so fences keep increasing even after the
 *   server lost its data (a restart without persistence, FLUSHALL) as long as its clock does not
 *   step back; the key expires a lease after the last grant (and not before the clock has passed
 *   the fence), so no lock leaves a key behind for good.
 * - `lockstep_ended:{K}:<holder>` (string, one per holder): a holder that ended (released its last
 *   hold, left the queue, was dropped by a forced release: `0`; its release found nothing to
 *   release: `-1`), for as long as it is remembered (PX). A late or second copy of one of its
 *   operations changes nothing and answers as the first did. `lockstep_force:{K}:<id>`: an
 *   applied forced release and its answer (`1` / `0`), remembered a minute.
 * - `redisson_lock__channel:{K}`: wake-ups. Every message is a number, so Redisson's listeners
 *   (which read them as Java longs and act on 0 only) take them in their stride: `0` when the key
 *   became free (Redisson's own unlock message: a Redisson waiter may be subscribed, so it is sent
 *   whenever lockstep frees the key); `<code>` wakes only the lockstep waiter with that wake code
 *   (a 52-bit hash of its holder id, see `wakeCode`); `-<code>` the same, and says that the next
 *   message is the `0` of the same release, which lockstep's listeners then ignore (`-1` only says
 *   that: a release that frees the key and wakes no lockstep waiter); `2` wakes every shared
 *   waiter (a writer left many readers behind).
 * - `lockstep_fair:{K}` (sorted set, score: arrival) and `lockstep_fair_ttl:{K}` (sorted set,
 *   score: expiry ms): the fair queue, members `<code>|<holder>`. Every operation is O(log n) in
 *   the queue's length: expired waiters are dropped by score, the head is the lowest arrival.
 * - `lockstep_waiters:{K}` (sorted set, score: until when the entry is kept): waiters of unfair
 *   kinds that wait on a subscription, members `<code>|<x|s>|<permits>|<limit>`. A release
 *   takes out and wakes those that can win: one exclusive waiter, or the shared waiters that fit.
 * - `lockstep_woken:{K}` (sorted set, score: until when the place is kept, a couple of seconds):
 *   waiters a release woke that have yet to try, members as in `lockstep_waiters`. Their permits
 *   (an exclusive one: the whole key) count as taken for later releases, so overlapping releases
 *   do not wake more waiters than can win; a waiter's next attempt (or its leaving) takes it out.
 * - `lockstep_waiting:{K}` (string): present (PX) for as long as any fair or registered waiter may
 *   be, or a woken one has yet to try; a new grant copies it into K as `lockstep|w`, so a release
 *   learns from the hash it reads anyway whether anyone waits, and an uncontended release touches
 *   no wait structure.
 */

/** What every script needs first: number formatting, the server clock, fences. */
const prelude = `
local P = 'lockstep|'

-- Times are floats and written with %.0f: Lua 5.1 (Redis) and Lua 5.3 with 32-bit integers
-- (the Lua VM of ioredis-mock) then agree on epoch milliseconds and microseconds.
local function fmt(n)
  return string.format('%.0f', n)
end

-- The server's clock: milliseconds, and microseconds (the floor of every new fence).
local function clock()
  local t = redis.call('TIME')
  local s, u = tonumber(t[1]), tonumber(t[2])
  return s * 1000.0 + math.floor(u / 1000), s * 1000000.0 + u
end
`

/**
 * The next fence of lock K: above the last one and never below the clock in microseconds; the
 * counter is kept a lease after the grant (and at least until the clock has passed it). One SET on
 * Redis 6.2+ (SET ... GET); a key of another type fails with WRONGTYPE and changes nothing.
 */
const fence = `
local function next_fence(token, now, nowUs, lease)
  local keep = math.max(lease, math.floor(nowUs / 1000 - now) + 1)
  local last = redis.pcall('SET', token, fmt(nowUs), 'PX', fmt(keep), 'GET')
  if type(last) == 'table' then
    -- a server without SET ... GET (before 6.2), or WRONGTYPE, which the GET raises again
    last = redis.call('GET', token)
    redis.call('SET', token, fmt(nowUs), 'PX', fmt(keep))
  end
  last = tonumber(last or '0') or 0
  if last < nowUs then return nowUs end
  local fence = last + 1
  redis.call('SET', token, fmt(fence), 'PX', fmt(math.max(lease, math.floor(fence / 1000 - now) + 1)))
  return fence
end
`

/**
 * The failover quarantine: until when this server must not make a new grant, because a lease an
 * earlier incarnation of its data may have granted (on the master it replaced, or before a
 * restart that lost data) could still be held. The server's epoch is the replication id
 * (`master_replid`): a new one after a promotion or a restart. The epoch record
 * (`<replid>|<since ms>`, one key per server) is written by the first grant of a new epoch:
 * a node that was promoted (`master_replid2` set) dates its epoch from now, since the promotion
 * time is unknown and it is no later than now; a node that never was (a restart, or a new
 * server) from its start (`uptime_in_seconds`). Each client waits `longest`, the longest lease it
 * may have granted, from there.
 */
const quarantine = `
local function quarantined_until(epoch, longest, now)
  local info = redis.call('INFO', 'replication')
  local replid = string.match(info, 'master_replid:(%w+)') or '?'
  local record = redis.call('GET', epoch)
  if type(record) == 'string' then
    local id, since = string.match(record, '^(%w+)|(%d+)$')
    if id == replid then return tonumber(since) + longest end
  end
  local replid2 = string.match(info, 'master_replid2:(%w+)') or '0'
  local since = now
  if string.match(replid2, '^0+$') then
    -- never promoted since it started: what it may have lost, it lost at its start (uptime is
    -- rounded down to the second, so this start is never earlier than the true one)
    local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')) or 0
    since = now - up * 1000
  end
  redis.call('SET', epoch, replid .. '|' .. fmt(since))
  return since + longest
end
`

/** Helpers of the paths where holders share a key or someone waits. */
const base = `
-- ioredis-mock's Lua bridge only converts tables built by a constructor, so copy into one
-- (unpack is bounded by the Lua stack: larger replies go out as they are, fine on Redis)
local function reply(t)
  if #t <= 7000 then return { unpack(t) } end
  return t
end

-- A pcall that failed: Redis answers { err = ... }, ioredis-mock { 'error', ... }.
local function failed(r)
  return type(r) == 'table' and (r.err ~= nil or r[1] == 'error')
end

-- Runs a command whose arguments end with a list, in chunks the Lua stack can take.
local function chunked(cmd, key, list)
  for i = 1, #list, 500 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 499, #list)))
  end
end

-- A key's holders from its fields: holder -> { x = exclusive count, s = shared count,
-- p = permits, f = fence, e = expiresAt (nil: a Redisson hold, which lives as long as the key) },
-- and the stored limit and waiter flag.
local function parse(flat)
  local hs, limit, flag = {}, nil, false
  local function get(h)
    local r = hs[h]
    if r == nil then
      r = { x = 0, s = 0, p = 0, f = 0, e = nil }
      hs[h] = r
    end
    return r
  end
  for i = 1, #flat, 2 do
    local f, v = flat[i], flat[i + 1]
    if string.sub(f, 1, 9) == P then
      local tag = string.sub(f, 10, 11)
      if tag == 'm|' then
        local r = get(string.sub(f, 12))
        local bar = string.find(v, '|', 1, true)
        r.f = tonumber(string.sub(v, 1, bar - 1))
        r.e = tonumber(string.sub(v, bar + 1))
      elseif tag == 's|' then
        local r = get(string.sub(f, 12))
        local bar = string.find(v, '|', 1, true)
        r.s = tonumber(string.sub(v, 1, bar - 1))
        r.p = tonumber(string.sub(v, bar + 1))
      elseif f == P .. 'limit' then
        limit = tonumber(v)
      elseif f == P .. 'w' then
        flag = true
      end
    else
      get(f).x = tonumber(v)
    end
  end
  return hs, limit, flag
end

-- Holds without an expiry of their own are Redisson's: they live as long as the key (its PTTL,
-- read once); they are marked r.redisson.
local function with_key_expiry(hs, key, now)
  local keyExpiry = nil
  for _, r in pairs(hs) do
    if r.e == nil then
      if keyExpiry == nil then
        local pttl = redis.call('PTTL', key)
        keyExpiry = now + 1e15
        if pttl > 0 then keyExpiry = now + pttl end
      end
      r.e = keyExpiry
      r.redisson = true
    end
  end
  return hs
end

-- The live state of key K at now: expired holds are dropped from the hash in place (and the
-- limit with the last shared hold). st.latest: the latest expiry of the live holds (the key's
-- PEXPIRE); st.redisson: a Redisson hold is among them (the key's PEXPIRE is its lease).
local function load(key, flat, now)
  local hs, limit, flag = parse(flat)
  local st = { holders = {}, limit = nil, flag = flag, latest = 0, redisson = false, exists = #flat > 0, dropped = false }
  if #flat == 0 then return st end
  local gone = {}
  local shared = false
  for h, r in pairs(with_key_expiry(hs, key, now)) do
    if r.redisson and r.x > 0 then st.redisson = true end
    if r.e <= now or (r.x == 0 and r.s == 0) then
      gone[#gone + 1] = h
      gone[#gone + 1] = P .. 's|' .. h
      gone[#gone + 1] = P .. 'm|' .. h
      if r.x > 0 or r.s > 0 then st.dropped = true end
    else
      st.holders[h] = r
      if r.s > 0 then shared = true end
      if r.e > st.latest then st.latest = r.e end
    end
  end
  if shared then st.limit = limit elseif limit ~= nil then gone[#gone + 1] = P .. 'limit' end
  if st.latest == 0 then
    -- nothing live is left: the key goes (a Redisson client tests for the key alone)
    redis.call('DEL', key)
    st.exists = false
    st.flag = false
  elseif #gone > 0 then
    chunked('HDEL', key, gone)
  end
  return st
end

-- Until when the key must live: the latest expiry of its holders; never shortened below a
-- Redisson hold's lease.
local function expire_to(key, st, latest, now)
  if latest > st.latest or (latest < st.latest and not st.redisson) then
    redis.call('PEXPIRE', key, fmt(math.max(1, latest - now)))
  end
end

-- The code of a fair-queue member '<code>|<holder>' or a waiter member '<code>|...'.
local function code_of(member)
  return string.sub(member, 1, string.find(member, '|', 1, true) - 1)
end

-- The fair queue without its expired entries (each is removed once: amortised O(log n)).
local function prune_fair(fq, fqt, now)
  local gone = redis.call('ZRANGEBYSCORE', fqt, '-inf', fmt(now))
  if #gone > 0 then
    chunked('ZREM', fqt, gone)
    chunked('ZREM', fq, gone)
  end
end

-- Scores of many members in one command where the server has ZMSCORE (Redis 6.2+).
local function zmscore(key, members)
  local r = redis.pcall('ZMSCORE', key, unpack(members))
  if not failed(r) then return r end
  local out = {}
  for i, m in ipairs(members) do out[i] = redis.call('ZSCORE', key, m) end
  return out
end

-- Keeps the wait structures (and the sentinel that says someone may wait) at least ttl ms.
local function keep_waiting(sentinel, keys, ttl)
  local cur = redis.call('PTTL', sentinel)
  if cur < ttl then
    redis.call('SET', sentinel, '1', 'PX', fmt(ttl))
  else
    ttl = cur
  end
  for _, k in ipairs(keys) do redis.call('PEXPIRE', k, fmt(ttl)) end
end

-- What the live holds leave to waiters: free (no live hold), writer (a live exclusive hold is
-- left) and taken (the live shared permits), in the order wake takes them.
local function left_by(holders)
  local writer, taken = false, 0
  for _, r in pairs(holders) do
    if r.x > 0 then writer = true end
    if r.s > 0 then taken = taken + r.p end
  end
  return next(holders) == nil, writer, taken
end

-- How long a woken waiter's place is kept for it (ms): it tries at once, so this only bounds how
-- long one that crashed (or lost its wake-up) holds back the wake-ups of others.
local woken_ms = 2000

-- Wakes the waiters that can win now, after holds ended. zero: the key was freed and Redisson's
-- unlock message '0' follows; free, writer, taken: see left_by. The fair queue's head is told by its code; unfair
-- waiters are taken out of their set: the first exclusive one if the key is free, else the
-- shared ones that fit, where the places of waiters woken before that have yet to try (rq)
-- count as taken. Returns whether anyone may still wait.
local function wake(channel, fq, fqt, wq, rq, sentinel, now, zero, free, writer, taken)
  local codes = {}
  prune_fair(fq, fqt, now)
  local head = redis.call('ZRANGE', fq, 0, 0)[1]
  if head then codes[#codes + 1] = code_of(head) end
  redis.call('ZREMRANGEBYSCORE', wq, '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', rq, '-inf', fmt(now))
  local pending = redis.call('ZRANGE', rq, 0, -1)
  for _, m in ipairs(pending) do
    local mode, p = string.match(m, '^%d+|(%a)|(%d+)|')
    free = false
    if mode == 'x' then writer = true elseif p ~= nil then taken = taken + tonumber(p) end
  end
  local scan = 64
  local entries = redis.call('ZRANGE', wq, 0, scan - 1)
  local woken, used, everyShared = {}, 0, false
  for _, m in ipairs(entries) do
    local c, mode, p, l = string.match(m, '^(%d+)|(%a)|(%d+)|(%-?%d+)$')
    if c ~= nil then
      p, l = tonumber(p), tonumber(l)
      if mode == 'x' then
        if free and #woken == 0 then
          woken[1] = m
          codes[#codes + 1] = c
          break
        end
      elseif not writer then
        if l < 0 then
          woken[#woken + 1] = m
          codes[#codes + 1] = c
          everyShared = true
        elseif taken + used + p <= l then
          woken[#woken + 1] = m
          codes[#codes + 1] = c
          used = used + p
          if taken + used >= l then break end
        end
      end
    end
  end
  if #woken > 0 then chunked('ZREM', wq, woken) end
  local rest = #entries > #woken or #entries == scan
  if #woken > 0 and rest then
    -- places are kept only while others wait: those a later release would wake instead
    local places = {}
    for _, m in ipairs(woken) do
      places[#places + 1] = fmt(now + woken_ms)
      places[#places + 1] = m
    end
    redis.call('ZADD', rq, unpack(places))
    -- the sentinel outlives the places: their waiters' tries then take them out
    keep_waiting(sentinel, { rq }, woken_ms)
  end
  -- unlimited readers beyond the scan: every shared waiter retries
  if everyShared and #entries == scan then codes[#codes + 1] = '2' end
  -- no lockstep waiter to wake: '-1' says the '0' (for Redisson's waiters) is not for lockstep's
  if zero and #codes == 0 then codes[1] = '1' end
  for i, c in ipairs(codes) do
    if zero and i == #codes then c = '-' .. c end
    redis.call('PUBLISH', channel, c)
  end
  if zero then redis.call('PUBLISH', channel, '0') end
  return head ~= nil or rest or #pending > 0
end
`

/**
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken, and with a quarantine the server's epoch record.
 * ARGV: holder, mode ('x' | 's'), permits, limit (-1: unlimited), leaseMs, fair ('1' | '0'),
 * waiterTtlMs, count (the holder's count in that mode once granted), wake code, register ('1':
 * the holder waits on a subscription; a denied unfair attempt registers it as a waiter), the
 * quarantine's longest lease (0: no quarantine; a new grant waits while it lasts).
 * Returns {1, fence, count} granted, {0, retryAfterMs} denied, {2} upgrade refused,
 * {3, storedLimit} limit mismatch, {4} permits over the limit, {5} not held (a re-entry into a
 * hold that is gone, or a late copy from a holder that ended).
 */
export const acquire = `${prelude}${fence}${quarantine}
local key, token, channel, fq, fqt, ended, wq, sentinel, rq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local holder, excl = ARGV[1], ARGV[2] == 'x'
local permits, limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fair, waiterTtl, count = ARGV[6] == '1', tonumber(ARGV[7]), tonumber(ARGV[8])
local code, register = ARGV[9], ARGV[10] == '1'
local longest = tonumber(ARGV[11] or '0')
local flat = redis.call('HGETALL', key)

-- the fast path: a first hold of a free key no one waits for (and no quarantine to look at)
local memo = nil
if #flat == 0 and count == 1 and longest == 0 and (excl or limit < 0 or permits <= limit) then
  memo = redis.call('MGET', ended, sentinel)
  -- a late copy from a holder that ended (nil array items: false on Redis, userdata in ioredis-mock)
  if type(memo[1]) == 'string' then return {5} end
  if type(memo[2]) ~= 'string' then
    local now, nowUs = clock()
    local f = next_fence(token, now, nowUs, lease)
    local meta = fmt(f) .. '|' .. fmt(now + lease)
    if excl then
      redis.call('HSET', key, holder, '1', P .. 'm|' .. holder, meta)
    else
      redis.call('HSET', key, P .. 's|' .. holder, '1|' .. fmt(permits), P .. 'limit', fmt(limit), P .. 'm|' .. holder, meta)
    end
    redis.call('PEXPIRE', key, fmt(lease))
    return {1, fmt(f), 1}
  end
end
${base}
local now, nowUs = clock()
local st = load(key, flat, now)

if not excl and st.limit ~= nil and st.limit ~= limit then return {3, fmt(st.limit)} end
if not excl and limit >= 0 and permits > limit then return {4} end

-- the mode rules, ignoring the requester's own holds: allowed, or the earliest blocking expiry
local blocking = nil
local function block(e)
  if blocking == nil or e < blocking then blocking = e end
end
local function check()
  if excl then
    for h, r in pairs(st.holders) do if h ~= holder then block(r.e) end end
    return
  end
  for h, r in pairs(st.holders) do if h ~= holder and r.x > 0 then block(r.e) end end
  if blocking == nil then
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
  local e = math.max(me.e, expiresAt)
  local meta = P .. 'm|' .. holder
  if held > 0 then
    -- re-entry, or a copy of one already applied: the count becomes the requested one (a holder
    -- is never queued: it left the queue with its grant)
    if excl then
      redis.call('HSET', key, holder, fmt(count), meta, fmt(me.f) .. '|' .. fmt(e))
    else
      redis.call('HSET', key, P .. 's|' .. holder, fmt(count) .. '|' .. fmt(me.p), meta, fmt(me.f) .. '|' .. fmt(e))
    end
    expire_to(key, st, math.max(st.latest, e), now)
    return {1, fmt(me.f), count}
  end
  if excl then return {2} end
  -- a writer taking the read lock: the queue does not apply to a current holder
  check()
  if blocking ~= nil then return {0, fmt(math.max(1, blocking - now))} end
  redis.call('HSET', key, P .. 's|' .. holder, fmt(count) .. '|' .. fmt(permits), P .. 'limit', fmt(limit), meta, fmt(me.f) .. '|' .. fmt(e))
  expire_to(key, st, math.max(st.latest, e), now)
  return {1, fmt(me.f), count}
end

-- not a holder: a re-entry whose hold is gone, or a late copy from a holder that ended
if count > 1 then return {5} end
if memo == nil then memo = redis.call('MGET', ended, sentinel) end
if type(memo[1]) == 'string' then return {5} end
local waiting = type(memo[2]) == 'string'

-- a new grant: the mode rules, then the fair queue (only when someone may wait)
check()
local fm = code .. '|' .. holder
local wm = code .. '|' .. (excl and 'x' or 's') .. '|' .. fmt(permits) .. '|' .. fmt(limit)
-- a woken waiter tries: granted or not, the place kept for it is free again
if waiting and register then redis.call('ZREM', rq, wm) end
local first, mine = true, nil
if fair and waiting then
  prune_fair(fq, fqt, now)
  mine = redis.call('ZSCORE', fq, fm) or nil
  local head = redis.call('ZRANGE', fq, 0, 0)[1]
  first = head == nil or head == fm
  if not first then
    -- the earliest expiry among the waiters ahead: a bounded look at the earliest-expiring
    -- entries (exact for queues up to 16; for longer ones never later than the true one)
    local soon = redis.call('ZRANGE', fqt, 0, 15, 'WITHSCORES')
    local members = {}
    for i = 1, #soon, 2 do members[#members + 1] = soon[i] end
    local arrivals = {}
    if #members > 0 then arrivals = zmscore(fq, members) end
    local mineAt = mine and tonumber(mine)
    local ahead = nil
    for i = 1, #members do
      local at = type(arrivals[i]) == 'string' and tonumber(arrivals[i])
      if members[i] ~= fm and at and (mineAt == nil or at < mineAt) then
        ahead = tonumber(soon[2 * i])
        break
      end
    end
    if ahead == nil then ahead = tonumber(soon[#soon]) end
    if ahead ~= nil then block(ahead) end
  end
end

-- a new grant waits out the server's quarantine (re-entries and a writer's read hold do not:
-- the hold they build on is on this server)
if blocking == nil and first and longest > 0 then
  local till = quarantined_until(KEYS[10], longest, now)
  if now < till then block(till) end
end

if blocking == nil and first then
  local fence = next_fence(token, now, nowUs, lease)
  local fields = { P .. 'm|' .. holder, fmt(fence) .. '|' .. fmt(expiresAt) }
  if excl then
    fields[3] = holder
    fields[4] = '1'
  else
    fields[3] = P .. 's|' .. holder
    fields[4] = '1|' .. fmt(permits)
    fields[5] = P .. 'limit'
    fields[6] = fmt(limit)
  end
  if waiting and not st.flag then
    fields[#fields + 1] = P .. 'w'
    fields[#fields + 1] = '1'
  end
  redis.call('HSET', key, unpack(fields))
  expire_to(key, st, math.max(st.latest, expiresAt), now)
  if waiting then
    -- any grant takes the holder out of the wait structures
    if redis.call('ZREM', fqt, fm) == 1 then redis.call('ZREM', fq, fm) end
    redis.call('ZREM', wq, wm)
  end
  return {1, fmt(fence), 1}
end

-- denied: queue (fair) or register (a subscribed unfair waiter), so that a release wakes it
if blocking == nil then blocking = now + 1 end
local retry = math.max(1, blocking - now)
local keys = nil
local ttl = 0
if fair then
  if mine == nil then
    local tail = redis.call('ZRANGE', fq, -1, -1, 'WITHSCORES')
    local at = nowUs
    if tail[2] ~= nil then at = math.max(at, tonumber(tail[2]) + 1) end
    redis.call('ZADD', fq, fmt(at), fm)
  end
  redis.call('ZADD', fqt, fmt(now + waiterTtl), fm)
  keys, ttl = { fq, fqt }, waiterTtl
elseif register then
  -- kept a little past the waiter's own retry (the lock API retries at least once per waiter
  -- timeout), by which it registers again or is granted: a crashed waiter's entry goes soon
  ttl = math.min(retry, waiterTtl, 120000) + 2000
  redis.call('ZADD', wq, fmt(now + ttl), wm)
  keys = { wq }
end
if keys ~= nil then
  keep_waiting(sentinel, keys, ttl)
  if st.exists and not st.flag then redis.call('HSET', key, P .. 'w', '1') end
end
return {0, fmt(retry)}
`

/**
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken.
 * ARGV: holder, mode ('x' | 's'), count (the holder's count in that mode before the release),
 * leaseMs (how long an ended holder is remembered).
 * Returns the remaining count for that mode, or -1 when the holder holds nothing (and did not
 * just end: a copy of its last release answers 0 again).
 */
export const release = `${prelude}
local key, channel, fq, fqt, ended, wq, sentinel, rq = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local holder, excl, count, lease = ARGV[1], ARGV[2] == 'x', tonumber(ARGV[3]), tonumber(ARGV[4])
local flat = redis.call('HGETALL', key)

-- the fast path: the holder's own fields are all the hash holds, so its hold is live (the key's
-- PEXPIRE is its expiry) and no one is registered as waiting
local alone = true
local sfield, meta = P .. 's|' .. holder, P .. 'm|' .. holder
local mx, ms, mp, mine = 0, 0, 0, false
for i = 1, #flat, 2 do
  local f = flat[i]
  if f == holder then
    mx, mine = tonumber(flat[i + 1]), true
  elseif f == sfield then
    local v = flat[i + 1]
    local bar = string.find(v, '|', 1, true)
    ms, mp, mine = tonumber(string.sub(v, 1, bar - 1)), tonumber(string.sub(v, bar + 1)), true
  elseif f ~= meta and f ~= P .. 'limit' then
    alone = false
  end
end

local function forget(value)
  redis.call('SET', ended, value, 'PX', fmt(lease))
end

if not mine and alone then
  -- a copy of a last release answers 0 again, a copy of a refused one -1 again; ended either way,
  -- so a late copy of one of its acquisitions grants nothing
  if redis.call('GET', ended) == '0' then
    forget('0')
    return 0
  end
  forget('-1')
  return -1
end

local remaining
if alone then
  local held = ms
  if excl then held = mx end
  -- a count below the caller's: a copy of a release already applied
  remaining = held
  if held >= count then remaining = count - 1 end
  if remaining == held then return remaining end
  if excl then mx = remaining else ms = remaining end
  if mx == 0 and ms == 0 then
    redis.call('DEL', key)
    forget('0')
    -- Redisson's unlock message: a Redisson waiter may wait for this key
    redis.call('PUBLISH', channel, '0')
  elseif excl and mx == 0 then
    -- a writer that also holds the read lock keeps that
    redis.call('HDEL', key, holder)
  elseif excl then
    redis.call('HSET', key, holder, fmt(mx))
  elseif ms == 0 then
    redis.call('HDEL', key, sfield, P .. 'limit')
  else
    redis.call('HSET', key, sfield, fmt(ms) .. '|' .. fmt(mp))
  end
  return remaining
end

-- other holders, or waiters: the full rules
${base}
local now = clock()
local st = load(key, flat, now)
local me = st.holders[holder]
if me == nil then
  if redis.call('GET', ended) == '0' then
    forget('0')
    remaining = 0
  else
    forget('-1')
    remaining = -1
  end
  if st.dropped and st.flag then
    -- expired holds were dropped: waiters may enter
    if not wake(channel, fq, fqt, wq, rq, sentinel, now, false, left_by(st.holders)) then
      redis.call('DEL', sentinel)
    end
  end
  return remaining
end

local held = me.s
if excl then held = me.x end
remaining = held
if held >= count then remaining = count - 1 end
local freed = st.dropped or (held > 0 and remaining == 0)
if remaining ~= held then
  if excl then me.x = remaining else me.s = remaining end
end
local zero = false
if me.x == 0 and me.s == 0 then
  st.holders[holder] = nil
  forget('0')
  if next(st.holders) == nil then
    redis.call('DEL', key)
    zero = true
  else
    local gone = { holder, sfield, meta }
    local shared = false
    local latest = 0
    for _, r in pairs(st.holders) do
      if r.s > 0 then shared = true end
      if r.e > latest then latest = r.e end
    end
    if not shared and st.limit ~= nil then gone[#gone + 1] = P .. 'limit' end
    redis.call('HDEL', key, unpack(gone))
    expire_to(key, st, latest, now)
  end
elseif remaining ~= held then
  if excl and me.x == 0 then
    redis.call('HDEL', key, holder)
  elseif excl then
    redis.call('HSET', key, holder, fmt(me.x))
  elseif me.s == 0 then
    local gone = { sfield }
    local shared = false
    for h, r in pairs(st.holders) do if h ~= holder and r.s > 0 then shared = true end end
    if not shared then gone[2] = P .. 'limit' end
    redis.call('HDEL', key, unpack(gone))
  else
    redis.call('HSET', key, sfield, fmt(me.s) .. '|' .. fmt(me.p))
  end
end
if not freed then return remaining end
if st.flag then
  if not wake(channel, fq, fqt, wq, rq, sentinel, now, zero, left_by(st.holders)) then
    -- no one waits any more
    redis.call('DEL', sentinel)
    if not zero then redis.call('HDEL', key, P .. 'w') end
  end
elseif zero then
  redis.call('PUBLISH', channel, '0')
end
return remaining
`

/**
 * KEYS: the K of each request, in order. ARGV: for each request, holder and leaseMs.
 * Returns per request 1 (renewed), 0 (not held) or the error that request met (a key of another
 * type, say), so one bad key does not fail the others. Touches only the holder's own fields.
 */
export const renew = `${prelude}${base}
local now = clock()
local out = {}
for i, key in ipairs(KEYS) do
  local holder, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local field = P .. 'm|' .. holder
  local meta = redis.pcall('HGET', key, field)
  out[i] = 0
  if failed(meta) then
    out[i] = meta.err or meta[2]
  elseif meta then
    local bar = string.find(meta, '|', 1, true)
    local e = tonumber(string.sub(meta, bar + 1))
    if e > now then
      local next_e = math.max(e, now + lease)
      redis.call('HSET', key, field, string.sub(meta, 1, bar) .. fmt(next_e))
      if redis.call('PTTL', key) < next_e - now then redis.call('PEXPIRE', key, fmt(next_e - now)) end
      out[i] = 1
    end
  end
end
return reply(out)
`

/**
 * KEYS: K, token, channel, fair queue, fair expiries, ended (unused), waiters, sentinel, woken.
 * Reads only. Returns {fence, limit or '', holder count, holders as flat {holder, x, s, p, f, ttl}...,
 * queue as flat {holder, ttl}...} with the queue in arrival order.
 */
export const inspect = `${prelude}${base}
local key, token, fq, fqt = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local now = clock()
local hs, limit = parse(redis.call('HGETALL', key))
local holders = {}
local shared = false
for h, r in pairs(with_key_expiry(hs, key, now)) do
  if r.e > now and (r.x > 0 or r.s > 0) then
    holders[#holders + 1] = { h, fmt(r.x), fmt(r.s), fmt(r.p), fmt(r.f), fmt(r.e - now) }
    if r.s > 0 then shared = true end
  end
end
-- '' for no limit: ioredis-mock's Lua bridge drops arrays that hold false
local limitOut = ''
if shared and limit ~= nil then limitOut = fmt(limit) end
local out = { redis.call('GET', token) or '0', limitOut, #holders }
for _, r in ipairs(holders) do
  for _, v in ipairs(r) do out[#out + 1] = v end
end
local members = redis.call('ZRANGE', fq, 0, -1)
for i = 1, #members, 500 do
  local part = { unpack(members, i, math.min(i + 499, #members)) }
  local expiries = zmscore(fqt, part)
  for j, m in ipairs(part) do
    local e = type(expiries[j]) == 'string' and tonumber(expiries[j])
    if e and e > now then
      out[#out + 1] = string.sub(m, string.find(m, '|', 1, true) + 1)
      out[#out + 1] = fmt(e - now)
    end
  end
end
return reply(out)
`

/**
 * KEYS: K, token, channel, fair queue, fair expiries, the operation's memory, waiters, sentinel,
 * woken.
 * ARGV: how long the operation is remembered (ms). Drops every holder (remembered as ended until
 * their holds would have expired); 1 if anything was held. A second copy of the same operation
 * changes nothing and answers as the first.
 */
export const forceRelease = `${prelude}${base}
local key, channel, fq, fqt, applied, wq, sentinel, rq = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local memory = tonumber(ARGV[1])
-- a copy answers as the first delivery did
local before = redis.call('GET', applied)
if before then return tonumber(before) end
local now = clock()
local st = load(key, redis.call('HGETALL', key), now)
local held = 0
for h, r in pairs(st.holders) do
  held = 1
  redis.call('SET', 'lockstep_ended:{' .. key .. '}:' .. h, '0', 'PX', fmt(math.max(1, r.e - now)))
end
redis.call('DEL', key)
redis.call('SET', applied, fmt(held), 'PX', fmt(memory))
if st.flag or redis.call('EXISTS', sentinel) == 1 then
  if not wake(channel, fq, fqt, wq, rq, sentinel, now, true, true, false, 0) then redis.call('DEL', sentinel) end
else
  redis.call('PUBLISH', channel, '0')
end
return held
`

/**
 * KEYS: token. ARGV: fence, leaseMs. The last fence issued becomes at least the given one, kept as
 * a new fence is (a lease, and until the clock in microseconds has passed it); a lower or equal
 * fence changes nothing, so a copy changes nothing either.
 */
export const raiseFence = `${prelude}
local token = KEYS[1]
local fence, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = clock()
local last = tonumber(redis.call('GET', token) or '0') or 0
if fence > last then
  redis.call('SET', token, fmt(fence), 'PX', fmt(math.max(lease, math.floor(fence / 1000 - now) + 1)))
end
return 1
`

/**
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken.
 * ARGV: holder, leaseMs, the holder's fair-queue member. Leaves the fair queue (a waiter that is
 * not a holder is remembered as ended for leaseMs); tells the new head.
 */
export const cancel = `${prelude}${base}
local key, channel, fq, fqt, ended = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local holder, lease, fm = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now = clock()
prune_fair(fq, fqt, now)
local heads = redis.call('ZRANGE', fq, 0, 1)
if redis.call('ZREM', fqt, fm) == 1 then redis.call('ZREM', fq, fm) end
local fields = redis.call('HMGET', key, holder, P .. 's|' .. holder)
if type(fields[1]) ~= 'string' and type(fields[2]) ~= 'string' then
  -- remembered as ended (a refusal remembered for longer is not cut short)
  redis.call('SET', ended, '0', 'PX', fmt(math.max(lease, redis.call('PTTL', ended))))
end
if heads[1] == fm and heads[2] ~= nil then
  redis.call('PUBLISH', KEYS[3], code_of(heads[2]))
end
return 0
`

/**
 * KEYS: K, token, channel, fair queue, fair expiries, ended (unused), waiters, sentinel, woken.
 * ARGV: the waiter's member in the waiters set. A registered waiter that gives up without a grant
 * leaves the set; if a release had already taken it out (a wake-up was on its way to it), the
 * wake-up goes on to the waiters that can win now.
 */
export const leave = `${prelude}${base}
local key, channel, fq, fqt, wq, sentinel, rq = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[7], KEYS[8], KEYS[9]
if redis.call('ZREM', wq, ARGV[1]) == 1 then return 0 end
if redis.call('EXISTS', sentinel) == 0 then return 0 end
-- the place kept for it goes too
redis.call('ZREM', rq, ARGV[1])
local now = clock()
local st = load(key, redis.call('HGETALL', key), now)
local free, writer, taken = left_by(st.holders)
if not writer then wake(channel, fq, fqt, wq, rq, sentinel, now, false, free, writer, taken) end
return 1
`

/**
 * The latch scripts. KEYS: K (the count, a string: Redisson's RCountDownLatch layout), the applied
 * calls (a hash id -> 1, kept for ARGV memory ms after its last write). A latch call on a key of
 * another type (a lock's hash) answers -1. The channel (Redisson's) is named by the caller.
 */
const latchPrelude = `
local key, applied = KEYS[1], KEYS[2]
local kind = redis.call('TYPE', key)
-- a status reply (a table) from Redis; some emulators answer with the bare string
if type(kind) == 'table' then kind = kind['ok'] end
if kind ~= 'none' and kind ~= 'string' then return -1 end
`

/**
 * ARGV: call id, count, memory ms, channel. Sets the count when the latch is at 0 (the key absent);
 * 1 if set (or a copy of a call that set it), 0 if a count is set. Publishes Redisson's new-count
 * message (1).
 */
export const latchSetCount = `${latchPrelude}
if redis.call('HEXISTS', applied, ARGV[1]) == 1 then return 1 end
if kind == 'string' then return 0 end
redis.call('SET', key, ARGV[2])
redis.call('HSET', applied, ARGV[1], 1)
redis.call('PEXPIRE', applied, ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
`

/**
 * ARGV: call id, memory ms, channel. One off the count; the count after. A copy of an applied call
 * changes nothing. Reaching 0 deletes the key and publishes Redisson's zero message (0).
 */
export const latchCountDown = `${latchPrelude}
if kind == 'none' then return 0 end
if redis.call('HEXISTS', applied, ARGV[1]) == 1 then return tonumber(redis.call('GET', key)) end
local left = redis.call('DECR', key)
redis.call('HSET', applied, ARGV[1], 1)
redis.call('PEXPIRE', applied, ARGV[2])
if left <= 0 then
  redis.call('DEL', key)
  redis.call('PUBLISH', ARGV[3], '0')
  return 0
end
return left
`

/** The count, 0 when the key is absent. */
export const latchCount = `${latchPrelude}
if kind == 'none' then return 0 end
return tonumber(redis.call('GET', key))
`
