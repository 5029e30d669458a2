/**
 * The latch scripts of the Redis backend, each with its contract (descriptor.ts). Latch `K` is
 * Redisson's RCountDownLatch: the count in the string `K`, messages on Redisson's channel (`1`: a
 * new count, `0`: the count reached zero). The calls applied to it are remembered in
 * `lockstep_latch_applied:{K}` (a hash id -> 1, kept `latchCallMemoryMs` after its last write), so
 * a copy of a call changes nothing. A latch call on a key of another type (a lock's hash) answers
 * -1: InvalidLockOptions.
 */
import { Either } from "effect"
import { latchCallMemoryMs } from "@lockstep/core/LockBackend"
import type { InvalidLockOptions } from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import { asNumber, defineScript } from "./descriptor.js"

/** The keys of latch `key`: its count (Redisson's layout) and the calls applied to it. */
export const latchKeysOf = (key: string) => [key, `lockstep_latch_applied:{${key}}`]

/** Redisson's RCountDownLatch channel. */
export const latchChannelOf = (key: string) => `redisson_countdownlatch__channel__{${key}}`

const noArgs: ReadonlyArray<string | number> = []

/** The error of a latch call on a key that holds something else (made here only). */
const heldByLock = Rules.notALatch

/** A latch script's reply (a number), or InvalidLockOptions when the key holds something else (-1). */
const decodeCount = (reply: unknown, key: string): Either.Either<number, InvalidLockOptions> =>
  asNumber(reply) === -1 ? Either.left(heldByLock(key)) : Either.right(asNumber(reply))

/**
 * What every latch script starts with: KEYS as `key` (the count) and `applied` (the calls applied,
 * kept for ARGV memory ms after its last write), and -1 for a key of another type. The channel
 * (Redisson's) is named by the caller.
 */
const latchPrelude = `
local key, applied = KEYS[1], KEYS[2]
local kind = redis.call('TYPE', key)
-- a status reply (a table) from Redis; some emulators answer with the bare string
if type(kind) == 'table' then kind = kind['ok'] end
if kind ~= 'none' and kind ~= 'string' then return -1 end
`

const setCountLua = `${latchPrelude}
if redis.call('HEXISTS', applied, ARGV[1]) == 1 then return 1 end
if kind == 'string' then return 0 end
redis.call('SET', key, ARGV[2])
redis.call('HSET', applied, ARGV[1], 1)
redis.call('PEXPIRE', applied, ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
`

/**
 * Sets the count when the latch is at 0 (the key absent). Publishes Redisson's new-count message
 * (1).
 * KEYS: K, applied calls.
 * ARGV: call id, count, memory ms, channel (as the server names it: with the client's `keyPrefix`).
 * Reply: 1 if set (or a copy of a call that set it), 0 if a count is set, -1 not a latch. A count
 * set is what the replicas acknowledge.
 */
export const setCount = defineScript("latchSetCount", setCountLua, {
  keys: (key: string): Array<string> => latchKeysOf(key),
  args: (key: string, id: string, count: number, namespace: string): Array<string | number> => [
    id,
    count,
    latchCallMemoryMs,
    namespace + latchChannelOf(key)
  ],
  decode: (reply: unknown, key: string): Either.Either<boolean, InvalidLockOptions> =>
    asNumber(reply) === -1 ? Either.left(heldByLock(key)) : Either.right(asNumber(reply) === 1),
  wrote: (reply: unknown): boolean => asNumber(reply) === 1
})

const countDownLua = `${latchPrelude}
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

/**
 * One off the count. A copy of an applied call changes nothing. Reaching 0 deletes the key and
 * publishes Redisson's zero message (0).
 * KEYS: K, applied calls.
 * ARGV: call id, memory ms, channel (as the server names it: with the client's `keyPrefix`).
 * Reply: the count after (0 when the key is absent), -1 not a latch. Any count is what the
 * replicas acknowledge.
 */
export const countDown = defineScript("latchCountDown", countDownLua, {
  keys: (key: string): Array<string> => latchKeysOf(key),
  args: (key: string, id: string, namespace: string): Array<string | number> => [
    id,
    latchCallMemoryMs,
    namespace + latchChannelOf(key)
  ],
  decode: decodeCount,
  wrote: (reply: unknown): boolean => asNumber(reply) !== -1
})

const countLua = `${latchPrelude}
if kind == 'none' then return 0 end
return tonumber(redis.call('GET', key))
`

/**
 * The count; reads only.
 * KEYS: K, applied calls.
 * ARGV: none.
 * Reply: the count, 0 when the key is absent, -1 not a latch.
 */
export const count = defineScript("latchCount", countLua, {
  keys: (key: string): Array<string> => latchKeysOf(key),
  args: (): ReadonlyArray<string | number> => noArgs,
  decode: decodeCount
})
