/**
 * The lock operations of the memory backend: each one's whole state transition, and whom it
 * wakes. Every operation first drops the key's expired holders and queue entries (an expiry it
 * notices wakes a waiter, as a release does), and last forgets what the key no longer needs.
 */
import type { Scope } from "effect"
import { Effect, Either } from "effect"
import * as LockBackend from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import { attemptAcquire } from "./acquisition.js"
import {
  dropExpired,
  extend,
  forgetUnused,
  hasEnded,
  keyDataOf,
  raiseFence as raiseKeyFence,
  rememberedFence,
  rememberEnded,
  rememberNotHeld,
  removeFromQueue
} from "./keys.js"
import { atomically, type MemoryState } from "./state.js"
import { handOnUnused, noteAttempt, subscribeIn, wakeNext } from "./wakeups.js"

export const acquire = (
  state: MemoryState,
  request: LockBackend.AcquireRequest
): ReturnType<LockBackend.Service["acquire"]> =>
  atomically(state, "acquire", (now) => {
    const dropped = dropExpired(state.keys, request.key, now)
    const outcome = attemptAcquire(state.keys, request, now)
    noteAttempt(state, request)
    // A shared grant passes the wake-up on so several readers / permit takers can enter after
    // one release; the requester itself is awake already.
    const sharedGrant = request.mode === "shared" && outcome._tag === "Granted"
    if (dropped || sharedGrant) wakeNext(state, request.key, request.holder)
    forgetUnused(state.keys, request.key, now)
    return outcome._tag === "Granted" || outcome._tag === "Denied" ? Effect.succeed(outcome) : Effect.fail(outcome)
  })

export const release = (
  state: MemoryState,
  { count, holder, key, leaseMs, mode }: LockBackend.ReleaseRequest
): ReturnType<LockBackend.Service["release"]> =>
  atomically(state, "release", (now) => {
    const dropped = dropExpired(state.keys, key, now)
    const data = state.keys.get(key)
    const hold = data?.holders.get(holder)
    let outcome: Effect.Effect<number, LockError.NotHeld>
    let woken = dropped
    if (data === undefined || hold === undefined) {
      // a copy of a last release succeeds again, a copy of a NotHeld answers NotHeld again; the
      // holder is remembered as ended either way, so a late copy of its acquisition grants nothing
      const released = hasEnded(data, holder, now)
      outcome = released ? Effect.succeed(0) : Effect.fail(new LockError.NotHeld({ key, holder }))
      if (released) rememberEnded(keyDataOf(state.keys, key), holder, now + leaseMs)
      else rememberNotHeld(keyDataOf(state.keys, key), holder, now + leaseMs)
    } else {
      const current = mode === "exclusive" ? hold.exclusive : hold.shared
      // a count below the caller's: a copy of a release already applied
      const remaining = current >= count ? count - 1 : current
      if (mode === "exclusive") hold.exclusive = remaining
      else hold.shared = remaining
      if (mode === "shared" && remaining === 0) hold.permits = 0
      if (current > 0 && remaining === 0) woken = true
      if (hold.exclusive === 0 && hold.shared === 0) {
        data.holders.delete(holder)
        rememberEnded(data, holder, now + leaseMs)
      }
      outcome = Effect.succeed(remaining)
    }
    if (woken) wakeNext(state, key)
    forgetUnused(state.keys, key, now)
    return outcome
  })

export const renew = (
  state: MemoryState,
  requests: ReadonlyArray<LockBackend.RenewRequest>
): ReturnType<LockBackend.Service["renew"]> =>
  atomically(state, "renew", (now) => {
    const touched = new Set<string>()
    const toWake = new Set<string>()
    const results = requests.map(({ holder, key, leaseMs }): LockBackend.RenewResult => {
      if (!touched.has(key)) {
        touched.add(key)
        if (dropExpired(state.keys, key, now)) toWake.add(key)
      }
      const hold = state.keys.get(key)?.holders.get(holder)
      if (hold === undefined) return Either.right(false)
      extend(hold, now, leaseMs)
      return Either.right(true)
    })
    for (const key of toWake) wakeNext(state, key)
    for (const key of touched) forgetUnused(state.keys, key, now)
    return Effect.succeed(results)
  })

export const inspect = (state: MemoryState, key: string): ReturnType<LockBackend.Service["inspect"]> =>
  atomically(state, "inspect", (now) => {
    if (dropExpired(state.keys, key, now)) wakeNext(state, key)
    forgetUnused(state.keys, key, now)
    const data = state.keys.get(key)
    return Effect.succeed<LockBackend.KeyState>({
      key,
      fence: rememberedFence(data, now),
      limit: data?.limit,
      holders: data === undefined ? [] : [...data.holders].map(([holder, hold]) => ({
        holder,
        exclusive: hold.exclusive,
        shared: hold.shared,
        permits: hold.permits,
        fence: hold.fence,
        ttlMs: hold.expiresAt - now
      })),
      queue: data === undefined ? [] : data.queue.map((e) => ({ holder: e.holder, ttlMs: e.expiresAt - now }))
    })
  })

export const raiseFence = (
  state: MemoryState,
  { fence, key, leaseMs }: LockBackend.RaiseFenceRequest
): ReturnType<LockBackend.Service["raiseFence"]> =>
  atomically(state, "raiseFence", (now) => {
    raiseKeyFence(keyDataOf(state.keys, key), fence, now, leaseMs)
    return Effect.void
  })

export const forceRelease = (
  state: MemoryState,
  { id, key }: LockBackend.ForceReleaseRequest
): ReturnType<LockBackend.Service["forceRelease"]> =>
  atomically(state, "forceRelease", (now) => {
    const dropped = dropExpired(state.keys, key, now)
    const data = state.keys.get(key)
    // a copy answers as the first delivery did (after waking whoever an expiry let in)
    const [whenHeld, whenFree] = Rules.forceReleaseIds({ id, key })
    for (const [applied, answer] of [[whenHeld, true], [whenFree, false]] as const) {
      if (hasEnded(data, applied, now)) {
        if (dropped) wakeNext(state, key)
        forgetUnused(state.keys, key, now)
        return Effect.succeed(answer)
      }
    }
    const target = keyDataOf(state.keys, key)
    const held = target.holders.size > 0
    // the dropped holders' late copies must not re-enter: remember them until they would have expired
    for (const [holder, hold] of target.holders) rememberEnded(target, holder, hold.expiresAt)
    target.holders.clear()
    rememberEnded(target, held ? whenHeld : whenFree, now + LockBackend.forceReleaseMemoryMs)
    if (dropped || held) wakeNext(state, key)
    forgetUnused(state.keys, key, now)
    return Effect.succeed(held)
  })

export const cancel = (
  state: MemoryState,
  { holder, key, leaseMs }: LockBackend.CancelRequest
): ReturnType<LockBackend.Service["cancel"]> =>
  atomically(state, "cancel", (now) => {
    const dropped = dropExpired(state.keys, key, now)
    const data = state.keys.get(key)
    const headBefore = data?.queue[0]?.holder
    if (data !== undefined) removeFromQueue(data, holder)
    // a waiter that left must not be queued again by a late copy of one of its attempts
    if (data?.holders.has(holder) !== true) rememberEnded(keyDataOf(state.keys, key), holder, now + leaseMs)
    // The canceller is leaving, so it is not the one to wake.
    if (dropped || state.keys.get(key)?.queue[0]?.holder !== headBefore) wakeNext(state, key, holder)
    forgetUnused(state.keys, key, now)
    return Effect.void
  })

export const subscribe = (
  state: MemoryState,
  key: string,
  holder: string,
  mode: LockBackend.HoldMode
): Effect.Effect<LockBackend.Subscription, LockError.BackendError, Scope.Scope> =>
  subscribeIn(state, state.subscriptions, "subscribe", key, holder, mode, handOnUnused)
