/**
 * One acquisition attempt judged against a key's state: granted (a new hold, a re-entry, a
 * downgrade, or a copy of one already applied), denied (with how long to wait, and maybe a place
 * in the fair queue), or refused. It changes only the key; whom to wake is the caller's concern.
 */
import type * as LockBackend from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import type { Hold, KeyData, Keys, QueueEntry } from "./keys.js"
import {
  enqueue,
  extend,
  hasEnded,
  keyDataOf,
  nextFence,
  queueAhead,
  removeFromQueue,
  wasNotHeld
} from "./keys.js"

export type AcquireOutcome =
  | LockBackend.AcquireResult
  | LockError.InvalidLockOptions
  | LockError.LockUpgradeNotSupported
  | LockError.NotHeld

/** A denial; `queued` says whether it puts the holder in (or refreshes it in) the fair queue. */
const deny = (
  keys: Keys,
  request: LockBackend.AcquireRequest,
  now: number,
  blockers: ReadonlyArray<Hold>,
  ahead: ReadonlyArray<QueueEntry>,
  queued: boolean
): LockBackend.AcquireResult => {
  let earliest = Infinity
  for (const hold of blockers) earliest = Math.min(earliest, hold.expiresAt)
  for (const entry of ahead) earliest = Math.min(earliest, entry.expiresAt)
  if (queued) enqueue(keyDataOf(keys, request.key), request.holder, now + request.waiterTtlMs)
  // Denial always has a blocker, so `earliest` is finite; the guard keeps the result sane anyway.
  const retryAfterMs = Number.isFinite(earliest) ? Math.max(1, Math.ceil(earliest - now)) : 1
  return { _tag: "Denied", retryAfterMs }
}

/** Live holds of others that keep `request` out by the mode rules. */
const blockersOf = (data: KeyData | undefined, request: LockBackend.AcquireRequest): Array<Hold> => {
  const blockers: Array<Hold> = []
  if (data === undefined) return blockers
  if (request.mode === "exclusive") {
    for (const [other, hold] of data.holders) if (other !== request.holder) blockers.push(hold)
    return blockers
  }
  const sharedHolds: Array<Hold> = []
  let used = 0
  for (const [other, hold] of data.holders) {
    if (other === request.holder) continue
    if (hold.exclusive > 0) blockers.push(hold)
    if (hold.shared > 0) {
      used += hold.permits
      sharedHolds.push(hold)
    }
  }
  // Any shared holder leaving may free enough permits.
  if (used + request.permits > request.limit) blockers.push(...sharedHolds)
  return blockers
}

/** Judges `request` against its key's state (expired holds already dropped) and applies the outcome. */
export const attemptAcquire = (keys: Keys, request: LockBackend.AcquireRequest, now: number): AcquireOutcome => {
  const { holder, key, limit, mode, permits } = request
  const data = keys.get(key)
  if (mode === "shared") {
    if (data?.limit !== undefined && data.limit !== limit) {
      return Rules.limitMismatch(key, data.limit, limit)
    }
    if (permits > limit) {
      // Could never be granted: report it instead of letting the caller wait forever.
      return Rules.permitsExceedLimit(key, permits, limit)
    }
  }
  const own = data?.holders.get(holder)
  if (data !== undefined && own !== undefined) {
    const count = mode === "exclusive" ? own.exclusive : own.shared
    if (count > 0) {
      // Re-entry, or a copy of one already applied: the count becomes the requested one.
      if (mode === "exclusive") own.exclusive = request.count
      else own.shared = request.count
      extend(own, now, request.leaseMs)
      removeFromQueue(data, holder)
      return { _tag: "Granted", fence: own.fence, count: request.count }
    }
    if (mode === "exclusive") return new LockError.LockUpgradeNotSupported({ key, holder })
    // A writer taking the read lock: a current holder skips the queue, which would deadlock.
    const blockers = blockersOf(data, request)
    if (blockers.length > 0) return deny(keys, request, now, blockers, [], false)
    own.shared = request.count
    own.permits = permits
    data.limit = limit
    extend(own, now, request.leaseMs)
    removeFromQueue(data, holder)
    return { _tag: "Granted", fence: own.fence, count: request.count }
  }
  // Not a holder: a re-entry whose hold is gone, or a late copy from a holder that ended.
  if (request.count > 1 || hasEnded(data, holder, now) || wasNotHeld(data, holder, now)) {
    return new LockError.NotHeld({ key, holder })
  }
  const blockers = blockersOf(data, request)
  const ahead = request.fair ? queueAhead(data, holder) : []
  if (blockers.length > 0 || ahead.length > 0) return deny(keys, request, now, blockers, ahead, request.fair)
  const granted = keyDataOf(keys, key)
  const fence = nextFence(granted, now, request.leaseMs)
  granted.holders.set(holder, {
    exclusive: mode === "exclusive" ? 1 : 0,
    shared: mode === "shared" ? 1 : 0,
    permits: mode === "shared" ? permits : 0,
    fence,
    expiresAt: now + request.leaseMs
  })
  if (mode === "shared") granted.limit = limit
  removeFromQueue(granted, holder)
  return { _tag: "Granted", fence, count: 1 }
}
