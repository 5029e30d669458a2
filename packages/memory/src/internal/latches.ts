/**
 * Count-down latches: a count per key, the ids of the calls applied to it (so a copy of a call
 * counts once), and their waiters, all woken when the count is set or reaches 0. A key a lock
 * holds is no latch: a latch call on it is refused and changes nothing of the lock.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import * as LockBackend from "@lockstep/core/LockBackend"
import type * as LockError from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import type { Keys } from "./keys.js"
import { makeRemembered, type Remembered } from "./remembered.js"
import { atomically, type MemoryState } from "./state.js"
import { subscribeIn, wakeAll } from "./wakeups.js"

/** A latch's count, and the ids of the calls applied to it, until a time each. */
export interface Latch {
  count: number
  readonly applied: Remembered
}

/** Every latch with a count or a remembered call, by key. */
export type Latches = Map<string, Latch>

/** The key's latch with the calls it no longer remembers dropped, or `undefined` (count 0, nothing remembered). */
const liveLatch = (latches: Latches, key: string, now: number): Latch | undefined => {
  const latch = latches.get(key)
  if (latch === undefined) return undefined
  latch.applied.forget(now)
  if (latch.count === 0 && latch.applied.size() === 0) {
    latches.delete(key)
    return undefined
  }
  return latch
}

/** The key's latch, made at count 0 if it has none. */
const latchOf = (latches: Latches, key: string): Latch => {
  let latch = latches.get(key)
  if (latch === undefined) {
    latch = { count: 0, applied: makeRemembered() }
    latches.set(key, latch)
  }
  return latch
}

/** The refusal of a latch call on a key a lock holds (a live holder), or `undefined`. */
const refusalOnLock = (keys: Keys, key: string, now: number): LockError.InvalidLockOptions | undefined => {
  for (const hold of keys.get(key)?.holders.values() ?? []) {
    if (hold.expiresAt > now) {
      return Rules.notALatch(key)
    }
  }
  return undefined
}

export const latchSetCount = (
  state: MemoryState,
  { count, id, key }: LockBackend.SetCountRequest
): ReturnType<LockBackend.Service["latchSetCount"]> =>
  atomically(state, "latchSetCount", (now) => {
    const refused = refusalOnLock(state.keys, key, now)
    if (refused !== undefined) return Effect.fail(refused)
    const latch = liveLatch(state.latches, key, now)
    if (latch?.applied.has(id, now) === true) return Effect.succeed(true)
    if (latch !== undefined && latch.count > 0) return Effect.succeed(false)
    const set = latchOf(state.latches, key)
    set.count = count
    set.applied.set(id, now + LockBackend.latchCallMemoryMs)
    wakeAll(state.latchSubscriptions.get(key))
    return Effect.succeed(true)
  })

export const latchCountDown = (
  state: MemoryState,
  { id, key }: LockBackend.LatchRequest
): ReturnType<LockBackend.Service["latchCountDown"]> =>
  atomically(state, "latchCountDown", (now) => {
    const refused = refusalOnLock(state.keys, key, now)
    if (refused !== undefined) return Effect.fail(refused)
    const latch = liveLatch(state.latches, key, now)
    if (latch === undefined) return Effect.succeed(0)
    if (latch.applied.has(id, now) || latch.count === 0) return Effect.succeed(latch.count)
    latch.count--
    latch.applied.set(id, now + LockBackend.latchCallMemoryMs)
    if (latch.count === 0) wakeAll(state.latchSubscriptions.get(key))
    return Effect.succeed(latch.count)
  })

export const latchCount = (state: MemoryState, key: string): ReturnType<LockBackend.Service["latchCount"]> =>
  atomically(state, "latchCount", (now) => {
    const refused = refusalOnLock(state.keys, key, now)
    if (refused !== undefined) return Effect.fail(refused)
    return Effect.succeed(liveLatch(state.latches, key, now)?.count ?? 0)
  })

// every waiter of a latch is woken by the same signal: none has a wake-up to hand on
const noHandOn = (): void => undefined

export const latchSubscribe = (
  state: MemoryState,
  key: string,
  waiter: string
): Effect.Effect<LockBackend.Subscription, LockError.BackendError, Scope.Scope> =>
  subscribeIn(state, state.latchSubscriptions, "latchSubscribe", key, waiter, "shared", noHandOn)
