/**
 * The lock scripts of the Redis backend, each with its contract (descriptor.ts). Each operation is
 * one script, so it is atomic on the server and judged on the server's clock (`TIME`). Scripts
 * change fields in place and touch the wait structures only when someone waits: an uncontended
 * acquire and release run 9 Redis commands between them (EXISTS, TIME, SET, HSET, PEXPIRE;
 * HGETALL, DEL, SET, PUBLISH).
 *
 * Layout of a lock named K (every key shares K's cluster slot: K has no braces, the others are
 * tagged `{K}`). With the client's `keyPrefix` (the backend's namespace), every key and channel
 * below starts with it: ioredis prefixes KEYS, and the backend prefixes the names it passes in ARGV
 * (a latch's channel, a forced release's ended keys) and the channels it subscribes to.
 * - `K` (hash): Redisson's RLock layout — field `<clientId>:<n>` -> exclusive hold count, the key's
 *   PEXPIRE the lease — so a Redisson process and lockstep exclude each other on the same name.
 *   lockstep adds fields of its own under the `lockstep|` prefix (Redisson's scripts only test for
 *   the key and for their own field):
 *   `lockstep|m|<holder>` -> `<fence>|<expiresAt ms>`, `lockstep|s|<holder>` -> `<count>|<permits>`
 *   for shared holds, `lockstep|limit` -> the shared limit (-1: unlimited) while shared holds
 *   exist, `lockstep|w` while lockstep waiters may be registered (see below), and
 *   `lockstep|c|<holder>` -> the expiry of a claim a release granted the holder (a hand-off, below;
 *   unconfirmed while the holder's expiry is still that). The key's PEXPIRE is the latest expiry
 *   of its holders.
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
 *   (which read them as Java longs and act on 0 and 1 only) take them in their stride: `0` when
 *   the key became free (Redisson's own unlock message: a Redisson waiter may be subscribed, so it
 *   is sent whenever lockstep frees the key); `<code>` wakes only the lockstep waiter with that
 *   wake code (a 52-bit hash of its holder id, see `wakeCode`); `-<code>` the same, and says that
 *   the next message is the `0` of the same release, which lockstep's listeners then ignore (`-1`
 *   only says that: a release that frees the key and wakes no lockstep waiter); `2` wakes every
 *   shared waiter (a writer left many readers behind); `1` and a code zero-padded to 17 digits,
 *   then a fence: a hand-off (below).
 * - The hand-off: a release that finds a waiter that can win and asked for it grants it the lock
 *   in the same script, as a claim: a hold of count 1 with a fresh fence that expires `claimMs`
 *   (the waiter's, at most `maxClaimMs`) after the release unless the holder confirms it (a
 *   renewal, or its own acquire, which finds it the holder: same fence, count 1). The waiter holds
 *   the lock from the message on, without an acquire of its own, for as long as its deadline
 *   measured from when it sent its last denied attempt allows (see `waitForGrant` in core's
 *   acquisition.ts; a denial answers a fence floor, so that a late message from an older claim is
 *   not taken for a new one). A claim no one confirms (the waiter died, the message was lost) ends
 *   by itself; a waiter that gives up without a grant releases a claim made for it (leave, cancel).
 *   The key is not free in between, so Redisson's clients stay out and hear no `0` until the
 *   claimant frees it. Waiters ask for hand-offs only where no quarantine and no replica
 *   acknowledgement applies (a release checks neither): elsewhere a release only wakes them.
 * - `lockstep_fair:{K}` (sorted set, score: arrival) and `lockstep_fair_ttl:{K}` (sorted set,
 *   score: expiry ms): the fair queue, members `<code>|<claimMs>|<holder>` (claimMs 0 until the
 *   waiter waits on a subscription; the entry formats are members.ts's). Every operation is O(log n) in the queue's length: expired
 *   waiters are dropped by score, the head is the lowest arrival.
 * - `lockstep_waiters:{K}` (sorted set, score: until when the entry is kept): waiters of unfair
 *   kinds that wait on a subscription, members `<code>|<x|s>|<permits>|<limit>|<claimMs>|<holder>`.
 *   A release takes out and wakes (or grants) those that can win: one exclusive waiter, or the
 *   shared waiters that fit.
 * - `lockstep_woken:{K}` (sorted set, score: until when the place is kept, a couple of seconds):
 *   waiters a release woke that have yet to try, members as in `lockstep_waiters`. Their permits
 *   (an exclusive one: the whole key) count as taken for later releases, so overlapping releases
 *   do not wake more waiters than can win; a waiter's next attempt (or its leaving) takes it out.
 * - `lockstep_waiting:{K}` (string): present (PX) for as long as any fair or registered waiter may
 *   be, or a woken one has yet to try; a new grant copies it into K as `lockstep|w`, so a release
 *   learns from the hash it reads anyway whether anyone waits, and an uncontended release touches
 *   no wait structure.
 */
import { Either } from "effect"
import type * as LockBackend from "@lockstep/core/LockBackend"
import { forceReleaseMemoryMs } from "@lockstep/core/LockBackend"
import type { InvalidLockOptions } from "@lockstep/core/LockError"
import { BackendError, LockUpgradeNotSupported, NotHeld } from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import { asNumber, defineScript } from "./descriptor.js"
import { fairMember, limitOf, modeOf } from "./members.js"
import { base, fence, prelude, quarantine } from "./shared.js"

// ---------------------------------------------------------------------------------------------
// keys
// ---------------------------------------------------------------------------------------------

/** The wake-up channel of lock `key`. */
export const channelOf = (key: string) => `redisson_lock__channel:{${key}}`

/** The last fence issued for lock `key`. */
const tokenOf = (key: string) => `redisson_lock_token:{${key}}`

/**
 * The Redis keys of lock `key`, in the order the scripts expect them; `memo` is the key that
 * remembers the holder (or operation) the call is about.
 */
export const keysOf = (key: string, memo = `lockstep_ended:{${key}}`) => [
  key,
  tokenOf(key),
  channelOf(key),
  `lockstep_fair:{${key}}`,
  `lockstep_fair_ttl:{${key}}`,
  memo,
  `lockstep_waiters:{${key}}`,
  `lockstep_waiting:{${key}}`,
  `lockstep_woken:{${key}}`
]

/** The prefix of the keys that remember the holders of lock `key` that ended. */
const endedPrefixOf = (key: string) => `lockstep_ended:{${key}}:`

/** Where a holder that ended is remembered. */
export const endedKeyOf = (key: string, holder: string) => endedPrefixOf(key) + holder

/** The server's epoch record, which the failover quarantine keeps (one per server). */
export const epochKey = "lockstep_epoch"

/** The keys of lock `key` that are the same on every call (`keysOf`), and the prefix of its ended keys. */
interface KeySet {
  readonly keys: ReadonlyArray<string>
  readonly endedPrefix: string
}

/** Lock keys whose `KeySet` is kept; past that many, the cache starts over. */
const keySetsKept = 4096
const keySets = new Map<string, KeySet>()

/**
 * The `KeySet` of `key`, built once and kept: acquire and release name the same eight keys of a
 * lock on every call (and a ninth, the holder's), which are not built again for each call.
 */
const keySetOf = (key: string): KeySet => {
  let set = keySets.get(key)
  if (set === undefined) {
    if (keySets.size >= keySetsKept) keySets.clear()
    set = { keys: keysOf(key), endedPrefix: endedPrefixOf(key) }
    keySets.set(key, set)
  }
  return set
}

/** `keysOf(key, endedKeyOf(key, holder))`, from the kept `KeySet`. */
const holderKeysOf = (key: string, holder: string): Array<string> => {
  const { endedPrefix, keys } = keySetOf(key)
  return [keys[0]!, keys[1]!, keys[2]!, keys[3]!, keys[4]!, endedPrefix + holder, keys[6]!, keys[7]!, keys[8]!]
}

const noArgs: ReadonlyArray<string | number> = []

// ---------------------------------------------------------------------------------------------
// the errors replies stand for (each made here only)
// ---------------------------------------------------------------------------------------------

const notHeld = (key: string, holder: string) => new NotHeld({ key, holder })

const upgradeRefused = (key: string, holder: string) => new LockUpgradeNotSupported({ key, holder })

/** `stored` is the limit the key is held with; -1 stands for an infinite one (a read lock's). */
const limitMismatch = (request: LockBackend.AcquireRequest, stored: unknown) =>
  Rules.limitMismatch(request.key, asNumber(stored) === -1 ? Infinity : asNumber(stored), request.limit)

const permitsOverLimit = (request: LockBackend.AcquireRequest) =>
  Rules.permitsExceedLimit(request.key, request.permits, request.limit)

const unexpectedReply = (reply: unknown) => new Error(`unexpected reply ${String(reply)}`)

/** A renewal's own error reply (a key of another type, say). */
const renewFailed = (answer: string) => new BackendError({ operation: "renew", cause: new Error(answer) })

// ---------------------------------------------------------------------------------------------
// scripts
// ---------------------------------------------------------------------------------------------

const acquireLua = `${prelude}${fence}${quarantine}
local key, token, channel, fq, fqt, ended, wq, sentinel, rq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local holder, excl = ARGV[1], ARGV[2] == 'x'
local permits, limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fair, waiterTtl, count = ARGV[6] == '1', tonumber(ARGV[7]), tonumber(ARGV[8])
local code, register = ARGV[9], ARGV[10] == '1'
local claimMs, longest = ARGV[11] or '0', tonumber(ARGV[12] or '0')

-- the fast path: a first hold of a free key no one waits for (and no quarantine to look at), from
-- a holder that did not end (a late copy of one of its operations grants nothing): K, its holder's
-- ended key and its sentinel are all absent, which one command says
if count == 1 and longest == 0 and (excl or limit < 0 or permits <= limit) and redis.call('EXISTS', key, ended, sentinel) == 0 then
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
local flat = redis.call('HGETALL', key)
local memo = nil
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
if memo == nil then memo = redis.call('MGET', ended, sentinel, token) end
if type(memo[1]) == 'string' then return {5} end
local waiting = type(memo[2]) == 'string'

-- a new grant: the mode rules, then the fair queue (only when someone may wait)
check()
-- a fair waiter asks for hand-offs once it waits on a subscription (register): its entry moves
-- from the form without a claim to the one with it, keeping its place (fmOther: the other form)
local fm = fair_member(code, register and claimMs or '0', holder)
local fmOther = fair_member(code, register and '0' or claimMs, holder)
local wm = unfair_member(code, excl, permits, limit, claimMs, holder)
-- a woken waiter tries: granted or not, the place kept for it is free again
if waiting and register then redis.call('ZREM', rq, wm) end
local first, mine = true, nil
if fair and waiting then
  prune_fair(fq, fqt, now)
  mine = redis.call('ZSCORE', fq, fm) or nil
  if mine == nil and fmOther ~= fm then
    local other = redis.call('ZSCORE', fq, fmOther)
    if other then
      -- (its expiry: refreshed below when denied; a grant takes it out)
      redis.call('ZADD', fq, other, fm)
      redis.call('ZADD', fqt, fmt(now + waiterTtl), fm)
      redis.call('ZREM', fq, fmOther)
      redis.call('ZREM', fqt, fmOther)
      mine = other
    end
  end
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
    if fair and fmOther ~= fm and redis.call('ZREM', fqt, fmOther) == 1 then redis.call('ZREM', fq, fmOther) end
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
  -- the fence floor: every fence issued before this denial is at most the last one kept or, once
  -- that expired, the clock (a kept fence outlives the clock's passing it); a hand-off that names
  -- a fence above it was granted after this attempt was processed (see lockstep's wakeups.ts)
  -- (the last fence as read before: this attempt issued none)
  local last = type(memo[3]) == 'string' and tonumber(memo[3]) or 0
  return {0, fmt(retry), fmt(math.max(last, nowUs))}
end
return {0, fmt(retry)}
`

/**
 * A hold of `request.key` for `request.holder`, or how long to wait.
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken, and with a quarantine the server's epoch record.
 * ARGV: holder, mode ('x' | 's'), permits, limit (-1: unlimited), leaseMs, fair ('1' | '0'),
 * waiterTtlMs, count (the holder's count in that mode once granted), wake code, register ('1':
 * the holder waits on a subscription; a denied unfair attempt registers it as a waiter), claimMs
 * (the claim a release may grant the waiter: see `wake` in shared.ts; 0: wake it only), the
 * quarantine's longest lease (0: no quarantine; a new grant waits while it lasts).
 * Reply: {1, fence, count} granted, {0, retryAfterMs[, fenceFloor]} denied (fenceFloor, when the
 * denial queued or registered the waiter: no fence issued before it is above it),
 * {2} upgrade refused,
 * {3, storedLimit} limit mismatch, {4} permits over the limit, {5} not held (a re-entry into a
 * hold that is gone, or a late copy from a holder that ended). A grant is what the replicas
 * acknowledge.
 */
export const acquire = defineScript("acquire", acquireLua, {
  /** `longestLease`: the quarantine's, if any. */
  keys: (key: string, holder: string, longestLease: number | undefined): Array<string> => {
    const keys = holderKeysOf(key, holder)
    if (longestLease !== undefined) keys.push(epochKey)
    return keys
  },
  args: (
    request: LockBackend.AcquireRequest,
    code: string,
    register: boolean,
    claimMs: number,
    longestLease: number | undefined
  ): Array<string | number> => {
    const args: Array<string | number> = [
      request.holder,
      modeOf(request.mode),
      request.permits,
      limitOf(request.limit),
      request.leaseMs,
      request.fair ? "1" : "0",
      request.waiterTtlMs,
      request.count,
      code,
      register ? "1" : "0",
      claimMs
    ]
    if (longestLease !== undefined) args.push(longestLease)
    return args
  },
  /** `fail`: the BackendError of an acquire that failed for `cause`. */
  decode: (
    reply: unknown,
    request: LockBackend.AcquireRequest,
    fail: (cause: Error) => BackendError
  ): Either.Either<
    LockBackend.AcquireResult,
    BackendError | InvalidLockOptions | LockUpgradeNotSupported | NotHeld
  > => {
    const [status, a, b] = reply as [number, number?, number?]
    switch (status) {
      case 1:
        return Either.right({ _tag: "Granted", fence: asNumber(a), count: asNumber(b) })
      case 0:
        return Either.right({ _tag: "Denied", retryAfterMs: asNumber(a) })
      case 2:
        return Either.left(upgradeRefused(request.key, request.holder))
      case 3:
        return Either.left(limitMismatch(request, a))
      case 4:
        return Either.left(permitsOverLimit(request))
      case 5:
        return Either.left(notHeld(request.key, request.holder))
      default:
        return Either.left(fail(unexpectedReply(reply)))
    }
  },
  wrote: (reply: unknown): boolean => Array.isArray(reply) && Number(reply[0]) === 1,
  /**
   * A denial's fence floor (it queued or registered the waiter): no fence issued before the
   * attempt was processed is above it (`undefined`: a denial without one). `null` for any other
   * reply.
   */
  fenceFloor: (reply: unknown): number | undefined | null =>
    !Array.isArray(reply) || Number(reply[0]) !== 0 ? null : reply[2] === undefined ? undefined : asNumber(reply[2])
})

const releaseLua = `${prelude}${fence}
local key, token, channel, fq, fqt, ended, wq, sentinel, rq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
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

-- the uncontended release writes first with DEL, which a full server lets through; every other
-- path is let through this way
local last = alone and mine and (excl and mx or ms) <= 1
if not last then writes_when_full(key) end

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
local now, nowUs = clock()
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
    local free, writer, taken = left_by(st.holders)
    if not wake(channel, fq, fqt, wq, rq, sentinel, now, false, free, writer, taken, key, token, nowUs, taken > 0 and st.limit or nil) then
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
  forget('0')
  zero = remove_holder(key, st, holder, now)
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
  local free, writer, taken = left_by(st.holders)
  if not wake(channel, fq, fqt, wq, rq, sentinel, now, zero, free, writer, taken, key, token, nowUs, taken > 0 and st.limit or nil) then
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
 * One hold of `request.holder` in `request.mode` less.
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken.
 * ARGV: holder, mode ('x' | 's'), count (the holder's count in that mode before the release),
 * leaseMs (how long an ended holder is remembered).
 * Reply: the remaining count for that mode, or -1 when the holder holds nothing (and did not
 * just end: a copy of its last release answers 0 again).
 */
export const release = defineScript("release", releaseLua, {
  keys: (key: string, holder: string): Array<string> => holderKeysOf(key, holder),
  args: (request: LockBackend.ReleaseRequest): Array<string | number> => [
    request.holder,
    modeOf(request.mode),
    request.count,
    request.leaseMs
  ],
  decode: (reply: unknown, request: LockBackend.ReleaseRequest): Either.Either<number, NotHeld> =>
    asNumber(reply) < 0 ? Either.left(notHeld(request.key, request.holder)) : Either.right(asNumber(reply))
})

const renewLua = `${prelude}${base}
writes_when_full(KEYS[1])
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
 * The leases of a batch of holds (`requests` at `indexes`: all in one cluster slot). Touches only
 * each holder's own fields.
 * KEYS: the K of each request, in order.
 * ARGV: for each request, holder and leaseMs.
 * Reply: per request 1 (renewed), 0 (not held) or the error that request met (a key of another
 * type, say), so one bad key does not fail the others. A renewal is what the replicas acknowledge.
 */
export const renew = defineScript("renew", renewLua, {
  keys: (requests: ReadonlyArray<LockBackend.RenewRequest>, indexes: ReadonlyArray<number>): Array<string> =>
    indexes.map((i) => requests[i]!.key),
  args: (requests: ReadonlyArray<LockBackend.RenewRequest>, indexes: ReadonlyArray<number>): Array<string | number> =>
    indexes.flatMap((i) => [requests[i]!.holder, requests[i]!.leaseMs]),
  /**
   * The result of the `j`th request of the batch; `notAcknowledged`: the error of renewals the
   * replicas did not acknowledge, if so (each such lease keeps the deadline it had; a "not held"
   * needs no acknowledgement: the lease is lost).
   */
  decode: (reply: unknown, j: number, notAcknowledged: BackendError | undefined): LockBackend.RenewResult => {
    const answer = (reply as Array<number | string>)[j]
    return typeof answer === "string"
      // this lease's own error: the others are unaffected
      ? Either.left(renewFailed(answer))
      : answer === 1 && notAcknowledged !== undefined
      ? Either.left(notAcknowledged)
      : Either.right(answer === 1)
  },
  /** Whether at least one lease was renewed. */
  wrote: (reply: unknown): boolean => Array.isArray(reply) && reply.some((answer) => answer === 1)
})

const inspectLua = `${prelude}${base}
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
      out[#out + 1] = fair_holder(m)
      out[#out + 1] = fmt(e - now)
    end
  end
end
return reply(out)
`

/**
 * What lock `key` holds and who waits for it; reads only.
 * KEYS: K, token, channel, fair queue, fair expiries, ended (unused), waiters, sentinel, woken.
 * ARGV: none.
 * Reply: {fence, limit or '', holder count, holders as flat {holder, x, s, p, f, ttl}...,
 * queue as flat {holder, ttl}...} with the queue in arrival order.
 */
export const inspect = defineScript("inspect", inspectLua, {
  keys: (key: string): Array<string> => keysOf(key),
  args: (): ReadonlyArray<string | number> => noArgs,
  decode: (reply: unknown, key: string): LockBackend.KeyState => {
    const flat = reply as Array<string | number | null>
    const count = asNumber(flat[2])
    const holders: Array<LockBackend.HolderState> = []
    for (let i = 0; i < count; i++) {
      const at = 3 + i * 6
      holders.push({
        holder: String(flat[at]),
        exclusive: asNumber(flat[at + 1]),
        shared: asNumber(flat[at + 2]),
        permits: asNumber(flat[at + 3]),
        fence: asNumber(flat[at + 4]),
        ttlMs: asNumber(flat[at + 5])
      })
    }
    const queue: Array<LockBackend.WaiterState> = []
    for (let at = 3 + count * 6; at + 1 < flat.length; at += 2) {
      queue.push({ holder: String(flat[at]), ttlMs: asNumber(flat[at + 1]) })
    }
    const limit = flat[1] === null || flat[1] === undefined || flat[1] === "" ? undefined : asNumber(flat[1])
    return { key, fence: asNumber(flat[0]), limit: limit === -1 ? Infinity : limit, holders, queue }
  }
})

const forceReleaseLua = `${prelude}${fence}${base}
local key, token, channel, fq, fqt, applied, wq, sentinel, rq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local memory, endedPrefix = tonumber(ARGV[1]), ARGV[2]
writes_when_full(key)
-- a copy answers as the first delivery did
local before = redis.call('GET', applied)
if before then return tonumber(before) end
local now, nowUs = clock()
local st = load(key, redis.call('HGETALL', key), now)
local held = 0
for h, r in pairs(st.holders) do
  held = 1
  redis.call('SET', endedPrefix .. h, '0', 'PX', fmt(math.max(1, r.e - now)))
end
redis.call('DEL', key)
redis.call('SET', applied, fmt(held), 'PX', fmt(memory))
if st.flag or redis.call('EXISTS', sentinel) == 1 then
  if not wake(channel, fq, fqt, wq, rq, sentinel, now, true, true, false, 0, key, token, nowUs, nil) then redis.call('DEL', sentinel) end
else
  redis.call('PUBLISH', channel, '0')
end
return held
`

/**
 * Drops every holder of lock `key` (each remembered as ended until its holds would have expired).
 * A second copy of the same operation (`id`) changes nothing and answers as the first.
 * KEYS: K, token, channel, fair queue, fair expiries, the operation's memory, waiters, sentinel,
 * woken.
 * ARGV: how long the operation is remembered (ms), and the prefix of the holders' ended keys as
 * the server names them (with the client's `keyPrefix`): a holder's ended key is that prefix and
 * its id, the key its acquire and release name as KEYS[6].
 * Reply: 1 if anything was held, else 0.
 */
export const forceRelease = defineScript("forceRelease", forceReleaseLua, {
  keys: (key: string, id: string): Array<string> => keysOf(key, `lockstep_force:{${key}}:${id}`),
  args: (key: string, namespace: string): Array<string | number> => [forceReleaseMemoryMs, namespace + endedPrefixOf(key)],
  decode: (reply: unknown): boolean => asNumber(reply) === 1
})

const raiseFenceLua = `${prelude}${fence}
local token = KEYS[1]
local fence, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = clock()
local last = tonumber(redis.call('GET', token) or '0') or 0
if fence > last then keep_fence(token, fence, now, lease) end
return 1
`

/**
 * The last fence issued becomes at least the given one, kept as a new fence is (a lease, and until
 * the clock in microseconds has passed it); a lower or equal fence changes nothing, so a copy
 * changes nothing either.
 * KEYS: token.
 * ARGV: fence, leaseMs.
 * Reply: 1 (not read). Every raise is what the replicas acknowledge.
 */
export const raiseFence = defineScript("raiseFence", raiseFenceLua, {
  keys: (key: string): Array<string> => [tokenOf(key)],
  args: (fence: number, leaseMs: number): Array<string | number> => [fence, leaseMs],
  wrote: (): boolean => true
})

const cancelLua = `${prelude}${fence}${base}
local key, token, channel, fq, fqt, ended, wq, sentinel, rq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local holder, lease, fm, fmClaim = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
writes_when_full(key)
local now, nowUs = clock()
prune_fair(fq, fqt, now)
local heads = redis.call('ZRANGE', fq, 0, 1)
if redis.call('ZREM', fqt, fm) == 1 then redis.call('ZREM', fq, fm) end
-- its entry in the form that asks for hand-offs (one it wrote once it waited on a subscription)
if fmClaim ~= nil and fmClaim ~= fm then
  if redis.call('ZREM', fqt, fmClaim) == 1 then redis.call('ZREM', fq, fmClaim) end
  if heads[1] == fmClaim then fm = fmClaim end
end
local st = load(key, redis.call('HGETALL', key), now)
-- a claim a release made for it while it gave up: released, and the next waiter gets its turn
local dropped, zero = drop_claim(key, st, holder, now)
if dropped or st.holders[holder] == nil then
  -- remembered as ended (a refusal remembered for longer is not cut short)
  redis.call('SET', ended, '0', 'PX', fmt(math.max(lease, redis.call('PTTL', ended))))
end
if dropped then
  local free, writer, taken = left_by(st.holders)
  if not wake(channel, fq, fqt, wq, rq, sentinel, now, zero, free, writer, taken, key, token, nowUs, taken > 0 and st.limit or nil) then
    redis.call('DEL', sentinel)
    if not zero then redis.call('HDEL', key, P .. 'w') end
  end
elseif heads[1] == fm and heads[2] ~= nil then
  redis.call('PUBLISH', channel, code_of(heads[2]))
end
return 0
`

/**
 * Leaves the fair queue (a waiter that is not a holder is remembered as ended for leaseMs); tells
 * the new head. A claim a release granted it meanwhile (it gives up without a grant: it never
 * took it) is released, and the next waiter gets its turn.
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken.
 * ARGV: holder, leaseMs, the holder's fair-queue member without a claim, and with its claim (the
 * form its acquire writes once it waits on a subscription).
 * Reply: 0 (not read).
 */
export const cancel = defineScript("cancel", cancelLua, {
  keys: (key: string, holder: string): Array<string> => holderKeysOf(key, holder),
  args: (holder: string, leaseMs: number, claimMs: number): Array<string | number> => [
    holder,
    leaseMs,
    fairMember(holder, 0),
    fairMember(holder, claimMs)
  ]
})

const leaveLua = `${prelude}${fence}${base}
local key, token, channel, fq, fqt, ended, wq, sentinel, rq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local member, holder, lease = ARGV[1], ARGV[2], tonumber(ARGV[3] or '0')
writes_when_full(key)
if redis.call('ZREM', wq, member) == 1 then return 0 end
-- a release took it out: it woke it, or granted it a claim
local waiting = redis.call('EXISTS', sentinel) == 1
-- the place kept for it goes too
if waiting then redis.call('ZREM', rq, member) end
local now, nowUs = clock()
local st = load(key, redis.call('HGETALL', key), now)
local dropped, zero = false, false
if holder ~= nil then dropped, zero = drop_claim(key, st, holder, now) end
-- a late copy of its acquire grants nothing
if dropped then redis.call('SET', ended, '0', 'PX', fmt(math.max(lease, redis.call('PTTL', ended)))) end
if not waiting and not dropped then return 0 end
local free, writer, taken = left_by(st.holders)
if not writer then wake(channel, fq, fqt, wq, rq, sentinel, now, zero, free, writer, taken, key, token, nowUs, taken > 0 and st.limit or nil) end
return 1
`

/**
 * A registered waiter that gives up without a grant leaves the waiters set; if a release had
 * already taken it out (a wake-up was on its way to it), the wake-up goes on to the waiters that
 * can win now, and a claim it granted the waiter is released (the holder is remembered as ended
 * for leaseMs, so a late copy of its acquire grants nothing).
 * KEYS: K, token, channel, fair queue, fair expiries, ended (of the holder), waiters, sentinel,
 * woken.
 * ARGV: the waiter's member in the waiters set (`waiterMember` in members.ts), its holder, leaseMs.
 * Reply: 0 or 1 (not read).
 */
export const leave = defineScript("leave", leaveLua, {
  keys: (key: string, holder: string): Array<string> => holderKeysOf(key, holder),
  args: (member: string, holder: string, leaseMs: number): Array<string | number> => [member, holder, leaseMs]
})
