/**
 * The Lua library the lock scripts are built from (lock.ts): each script starts with `prelude`
 * and adds the parts it needs, so every script is one self-contained source on the server.
 */
import { lua as members } from "./members.js"

/** What every script needs first: number formatting, the server clock, fences. */
export const prelude = `
local P = 'lockstep|'

-- Times are floats and written with %.0f: Lua 5.1 (Redis) and Lua 5.3 with 32-bit integers
-- (the Lua VM of ioredis-mock) then agree on epoch milliseconds and microseconds.
local function fmt(n)
  return string.format('%.0f', n)
end

-- A server at its maxmemory with noeviction refuses a script's first write that may take more
-- memory, but lets the rest of a script through once it has written. Scripts that keep or end
-- holds (renew, release, cancel, leave, forced release) start with a write that changes nothing,
-- so that a full server still renews and releases them: only new grants are refused.
local function writes_when_full(key)
  redis.pcall('HDEL', key, P .. 'none')
end

-- The server's clock: milliseconds, and microseconds (the floor of every new fence).
local function clock()
  local t = redis.call('TIME')
  local s, u = tonumber(t[1]), tonumber(t[2])
  return s * 1000.0 + math.floor(u / 1000), s * 1000000.0 + u
end
`

/**
 * The fence rules of `Rules.nextFence` and `Rules.fenceRememberedUntil`, on the token key. The next
 * fence of lock K: above the last one and never below the clock in microseconds; the counter is
 * kept a lease after the grant (and at least until the clock has passed it): `keep_fence`. One SET
 * on Redis 6.2+ (SET ... GET); a key of another type fails with WRONGTYPE and changes nothing.
 */
export const fence = `
local function keep_fence(token, fence, now, lease)
  redis.call('SET', token, fmt(fence), 'PX', fmt(math.max(lease, math.floor(fence / 1000 - now) + 1)))
end
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
  keep_fence(token, fence, now, lease)
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
export const quarantine = `
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
    -- never promoted since it started: what it may have lost, it lost at its start. Redis counts
    -- uptime between two times cut to the second, which may overstate it by up to a second: the
    -- start is taken a second later, so that it is never earlier than the true one
    local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')) or 0
    since = now - up * 1000 + 1000
  end
  redis.call('SET', epoch, replid .. '|' .. fmt(since))
  return since + longest
end
`

/** Helpers of the paths where holders share a key or someone waits. */
export const base = `
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
-- p = permits, f = fence, e = expiresAt (nil: a Redisson hold, which lives as long as the key),
-- c = the expiry of the claim a release granted it (see claim; unconfirmed while e is still c) },
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
      elseif tag == 'c|' then
        get(string.sub(f, 12)).c = tonumber(v)
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
      if r.c ~= nil then gone[#gone + 1] = P .. 'c|' .. h end
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

-- A holder's holds end: it leaves st and the hash (its fields, and the limit with the last shared
-- hold), and the key goes with the last holder. Returns whether the key went.
local function remove_holder(key, st, holder, now)
  st.holders[holder] = nil
  if next(st.holders) == nil then
    redis.call('DEL', key)
    return true
  end
  local gone = { holder, P .. 's|' .. holder, P .. 'm|' .. holder, P .. 'c|' .. holder }
  local shared, latest = false, 0
  for _, o in pairs(st.holders) do
    if o.s > 0 then shared = true end
    if o.e > latest then latest = o.e end
  end
  if not shared and st.limit ~= nil then gone[#gone + 1] = P .. 'limit' end
  redis.call('HDEL', key, unpack(gone))
  expire_to(key, st, latest, now)
  return false
end

-- A waiter that gives up without a grant: a claim a release made for it meanwhile (a hold of
-- count 1 that it never learned of, or learned of too late) is dropped from st and the hash.
-- Returns whether it dropped one, and whether that freed the key (deleted).
local function drop_claim(key, st, holder, now)
  local r = st.holders[holder]
  if r == nil or r.c ~= r.e or r.x > 1 or r.s > 1 or (r.x > 0 and r.s > 0) then return false, false end
  return true, remove_holder(key, st, holder, now)
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

${members}
-- The hand-off: a release grants a waiter that can win the lock on the server, a claim: a hold of
-- count 1 with a fresh fence that expires claimMs from now unless its holder confirms it (a
-- renewal, or its own acquire, which finds it the holder and answers the same fence and count 1).
-- 'lockstep|c|<holder>' keeps the claim's expiry: while the hold's expiry is still that, the claim
-- is unconfirmed, and a waiter that gives up without a grant releases it (drop_claim).
-- A claim no one confirms (the waiter died, its message was lost) ends by itself, like any hold.
-- The waiter learns of it from a pair of messages on the lock's channel: '1' followed by its code
-- zero-padded to 17 digits (18 digits: no wake code is that long), then the fence. Both are
-- numbers, which Redisson's listeners (Java longs; they act on 0 and 1 only) pass over.
local function claim(key, token, now, nowUs, holder, excl, permits, limit, claimMs, c)
  local f = next_fence(token, now, nowUs, claimMs)
  local e = fmt(now + claimMs)
  local meta = fmt(f) .. '|' .. e
  if excl then
    redis.call('HSET', key, holder, '1', P .. 'm|' .. holder, meta, P .. 'c|' .. holder, e)
  else
    redis.call('HSET', key, P .. 's|' .. holder, '1|' .. fmt(permits), P .. 'limit', fmt(limit), P .. 'm|' .. holder, meta, P .. 'c|' .. holder, e)
  end
  -- the key lives at least as long as the claim (never shortened: other holds may outlive it)
  if redis.call('PTTL', key) < claimMs then redis.call('PEXPIRE', key, fmt(claimMs)) end
  return { '1' .. string.rep('0', 17 - #c) .. c, fmt(f) }
end

-- Wakes the waiters that can win now, after holds ended, and grants them the lock where they
-- asked for a hand-off (claim, above). zero: the key was freed (deleted) and Redisson's unlock
-- message '0' follows unless a claim holds it again; free, writer, taken: see left_by; key,
-- token, nowUs: where claims are written and fenced (key nil: wake only); limit: the stored
-- shared limit while shared holds are left. The fair queue's head is granted (or told by its
-- code); unfair waiters are taken out of their set: the first exclusive one if the key is free,
-- else the shared ones that fit, where the places of waiters woken before that have yet to try
-- (rq) count as taken. Returns whether anyone may still wait.
local function wake(channel, fq, fqt, wq, rq, sentinel, now, zero, free, writer, taken, key, token, nowUs, limit)
  local codes, grants = {}, {}
  prune_fair(fq, fqt, now)
  redis.call('ZREMRANGEBYSCORE', wq, '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', rq, '-inf', fmt(now))
  local pending = redis.call('ZRANGE', rq, 0, -1)
  for _, m in ipairs(pending) do
    local mode, p = unfair_hold(m)
    free = false
    if mode == 'x' then writer = true elseif p ~= nil then taken = taken + tonumber(p) end
  end
  local head = redis.call('ZRANGE', fq, 0, 0)[1]
  if head then
    local c, ms, h = fair_entry(head)
    if free and key ~= nil and ms > 0 then
      -- the head leaves the queue with its grant; the next one waits on
      redis.call('ZREM', fqt, head)
      redis.call('ZREM', fq, head)
      grants[#grants + 1] = claim(key, token, now, nowUs, h, true, 1, 1, ms, c)
      free, writer = false, true
      head = redis.call('ZRANGE', fq, 0, 0)[1]
    else
      codes[#codes + 1] = c
    end
  end
  local scan = 64
  local entries = redis.call('ZRANGE', wq, 0, scan - 1)
  local woken, plain, used, everyShared = {}, {}, 0, false
  local function take(m, c, excl, p, l, ms, h)
    woken[#woken + 1] = m
    -- a shared waiter whose limit is not the key's is only woken: its own try fails clearly
    if key ~= nil and ms > 0 and (excl or limit == nil or limit == l) then
      grants[#grants + 1] = claim(key, token, now, nowUs, h, excl, p, l, ms, c)
      if not excl then limit = l end
    else
      plain[#plain + 1] = m
      codes[#codes + 1] = c
    end
  end
  for _, m in ipairs(entries) do
    local c, mode, p, l, ms, h = unfair_entry(m)
    if c ~= nil then
      if mode == 'x' then
        if free and #woken == 0 then
          take(m, c, true, p, l, ms, h)
          break
        end
      elseif not writer then
        if l < 0 then
          take(m, c, false, p, l, ms, h)
          everyShared = true
        elseif taken + used + p <= l then
          used = used + p
          take(m, c, false, p, l, ms, h)
          if taken + used >= l then break end
        end
      end
    end
  end
  if #woken > 0 then chunked('ZREM', wq, woken) end
  local rest = #entries > #woken or #entries == scan
  if #plain > 0 and rest then
    -- places are kept only while others wait: those a later release would wake instead (a
    -- claimed waiter needs none: its claim is a hold, which the next release counts)
    local places = {}
    for _, m in ipairs(plain) do
      places[#places + 1] = fmt(now + woken_ms)
      places[#places + 1] = m
    end
    redis.call('ZADD', rq, unpack(places))
    -- the sentinel outlives the places: their waiters' tries then take them out
    keep_waiting(sentinel, { rq }, woken_ms)
  end
  local still = head ~= nil or rest or #pending > 0
  -- a claim holds the key again: not free for Redisson's waiters; and it learns that others wait
  if #grants > 0 then
    zero = false
    if still then redis.call('HSET', key, P .. 'w', '1') end
  end
  -- unlimited readers beyond the scan: every shared waiter retries
  if everyShared and #entries == scan then codes[#codes + 1] = '2' end
  -- no lockstep waiter to wake: '-1' says the '0' (for Redisson's waiters) is not for lockstep's
  if zero and #codes == 0 then codes[1] = '1' end
  for _, g in ipairs(grants) do
    redis.call('PUBLISH', channel, g[1])
    redis.call('PUBLISH', channel, g[2])
  end
  for i, c in ipairs(codes) do
    if zero and i == #codes then c = '-' .. c end
    redis.call('PUBLISH', channel, c)
  end
  if zero then redis.call('PUBLISH', channel, '0') end
  return still
end
`
