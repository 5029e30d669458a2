/**
 * A key's state and the rules that keep it: its holders and their holds, the fair queue, the
 * fence, and the ids it remembers (ended holders, forced releases, releases answered NotHeld).
 * Every function here is synchronous and changes only the key it is given.
 */
import * as Rules from "@lockstep/core/Rules"
import { makeRemembered, type Remembered } from "./remembered.js"

/** One holder's holds on a key. A holder may hold both modes at once (after a downgrade). */
export interface Hold {
  exclusive: number
  shared: number
  permits: number
  readonly fence: number
  expiresAt: number
}

/** A waiter's place in a key's fair queue, kept while it retries within its waiter ttl. */
export interface QueueEntry {
  readonly holder: string
  expiresAt: number
}

/**
 * A key's state. It exists while the key has holders or queue entries, and after that for as long
 * as it remembers ended holders or a fence it must not reissue.
 */
export interface KeyData {
  readonly holders: Map<string, Hold>
  /** The shared limit, defined while some holder holds the key in shared mode. */
  limit: number | undefined
  queue: Array<QueueEntry>
  /**
   * Holders that ended (and `Rules.forceReleaseIds` of applied forced releases), until a time each:
   * late copies of their operations change nothing and answer as the first did.
   */
  readonly ended: Remembered
  /**
   * Holders whose release was answered NotHeld (`Rules.endedUnheld`'s entries, kept apart under the
   * holder's own id), until a time each; made when the first is (rare: every acquisition of a new
   * holder would otherwise look for it in a second table).
   */
  notHeld: Remembered | undefined
  /** The last fence issued, and until when it must be remembered (0 once it may be forgotten). */
  fence: number
  fenceUntil: number
}

/** The state of every key that has some, by key. */
export type Keys = Map<string, KeyData>

/** The key's state, made empty if it has none. */
export const keyDataOf = (keys: Keys, key: string): KeyData => {
  let data = keys.get(key)
  if (data === undefined) {
    data = { holders: new Map(), limit: undefined, queue: [], ended: makeRemembered(), notHeld: undefined, fence: 0, fenceUntil: 0 }
    keys.set(key, data)
  }
  return data
}

/** Drops expired holders and queue entries; `true` if a holder or waiter was dropped. */
export const dropExpired = (keys: Keys, key: string, now: number): boolean => {
  const data = keys.get(key)
  if (data === undefined) return false
  let dropped = false
  for (const [holder, hold] of data.holders) {
    if (hold.expiresAt <= now) {
      data.holders.delete(holder)
      dropped = true
    }
  }
  // a new queue only when an entry expired: this runs on every operation on the key
  for (const entry of data.queue) {
    if (entry.expiresAt <= now) {
      data.queue = data.queue.filter((e) => e.expiresAt > now)
      dropped = true
      break
    }
  }
  data.ended.forget(now)
  data.notHeld?.forget(now)
  return dropped
}

/** Forgets the limit once no shared holder is left, and the whole key once nothing of it is needed. */
export const forgetUnused = (keys: Keys, key: string, now: number): void => {
  const data = keys.get(key)
  if (data === undefined) return
  if (
    data.holders.size === 0 && data.queue.length === 0 && data.ended.size() === 0 &&
    (data.notHeld === undefined || data.notHeld.size() === 0) && data.fenceUntil <= now
  ) {
    keys.delete(key)
    return
  }
  let hasShared = false
  for (const hold of data.holders.values()) {
    if (hold.shared > 0) {
      hasShared = true
      break
    }
  }
  if (!hasShared) data.limit = undefined
}

/** Whether `id` ended (or a forced release `id` was applied) recently enough to be remembered. */
export const hasEnded = (data: KeyData | undefined, id: string, now: number): boolean => data?.ended.has(id, now) === true

/** Remembers that `id` ended, so late copies of its operations change nothing. */
export const rememberEnded = (data: KeyData, id: string, until: number): void => {
  data.ended.set(id, until)
}

/** Whether `holder`'s release was answered NotHeld recently enough to be remembered. */
export const wasNotHeld = (data: KeyData | undefined, holder: string, now: number): boolean =>
  data?.notHeld !== undefined && data.notHeld.has(holder, now)

/** Remembers that `holder`'s release was answered NotHeld. */
export const rememberNotHeld = (data: KeyData, holder: string, until: number): void => {
  data.notHeld ??= makeRemembered()
  data.notHeld.set(holder, until)
}

/**
 * Greater than every fence issued on the key, and never below the clock in microseconds. The
 * fence is remembered for a lease, and until the clock has passed it: a grant after that starts
 * from the clock and still issues a greater one.
 */
export const nextFence = (data: KeyData, now: number, leaseMs: number): number => {
  data.fence = Rules.nextFence(data.fence, now)
  data.fenceUntil = Rules.fenceRememberedUntil(data.fenceUntil, data.fence, now, leaseMs)
  return data.fence
}

/** Raises the key's fence to `fence` (never lowers it), remembered as an issued one is. */
export const raiseFence = (data: KeyData, fence: number, now: number, leaseMs: number): void => {
  if (fence > data.fence) {
    data.fence = fence
    data.fenceUntil = Rules.fenceRememberedUntil(data.fenceUntil, fence, now, leaseMs)
  }
}

/** The fence the key still remembers at `now`, or 0. */
export const rememberedFence = (data: KeyData | undefined, now: number): number =>
  data !== undefined && data.fenceUntil > now ? data.fence : 0

/** Extends the hold to a lease from `now`; never shortens it. */
export const extend = (hold: Hold, now: number, leaseMs: number): void => {
  hold.expiresAt = Math.max(hold.expiresAt, now + leaseMs)
}

/** Queue entries ahead of `holder` (the whole queue when it is not queued). */
export const queueAhead = (data: KeyData | undefined, holder: string): ReadonlyArray<QueueEntry> => {
  if (data === undefined) return []
  const index = data.queue.findIndex((e) => e.holder === holder)
  return index === -1 ? data.queue : data.queue.slice(0, index)
}

/** Puts `holder` at the end of the queue, or, queued already, keeps its place until `expiresAt`. */
export const enqueue = (data: KeyData, holder: string, expiresAt: number): void => {
  const entry = data.queue.find((e) => e.holder === holder)
  if (entry === undefined) data.queue.push({ holder, expiresAt })
  else entry.expiresAt = expiresAt
}

export const removeFromQueue = (data: KeyData, holder: string): void => {
  const index = data.queue.findIndex((e) => e.holder === holder)
  if (index !== -1) data.queue.splice(index, 1)
}
