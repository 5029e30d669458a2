/**
 * The history checker (`History.check`) and the recording wrapper of a backend
 * (`History.instrument`).
 */
import { Array as Arr, Cause, Clock, Data, Effect, Either, Exit, Option, Order } from "effect"
import type { AcquireRequest, HoldMode, Service, Subscription } from "@lockstep/core/LockBackend"
import type * as History from "../History.js"

type Grant = Extract<History.Event, { readonly _tag: "Grant" }>
type Release = Extract<History.Event, { readonly _tag: "Release" }>

const Violation = Data.taggedEnum<History.Violation>()

/** Events in the order of their sequence numbers. */
export const byAt: Order.Order<History.Event> = Order.mapInput(Order.number, (event: History.Event) => event.at)

/** One holder's holds of a key, as the history shows them so far. */
interface HoldState {
  exclusive: number
  shared: number
  permits: number
  limit: number
  fence: number
  expiresAt: number | undefined
}

/** What the checker knows of one key. */
interface KeyTrack {
  /** The new grants in `at` order, each with the highest fence of the new grants up to it. */
  readonly answered: Array<Answered>
  readonly holds: Map<string, HoldState>
  /** Holders whose holds ended without a release (expiry, loss, force release). */
  readonly ended: Set<string>
}

/** A new grant as the fence check remembers it. */
interface Answered {
  readonly at: number
  readonly time: number | undefined
  readonly fence: number
  readonly exclusive: boolean
  /** The highest fence of the new grants up to this one. */
  readonly highest: number
}

/**
 * The fence a new grant must be above: the highest of the grants answered before it was sent
 * (`answered` is in `at` order, all before `grant`), and of those answered while it was in flight
 * that it could not have held alongside, unless its own hold had expired by then (a late reply).
 */
const fenceToBeat = (answered: ReadonlyArray<Answered>, grant: Grant): number => {
  const sent = grant.invokedAt ?? grant.at
  let low = 0
  let high = answered.length
  while (low < high) {
    const mid = (low + high) >>> 1
    if (answered[mid]!.at < sent) low = mid + 1
    else high = mid
  }
  let previous = low === 0 ? Number.NEGATIVE_INFINITY : answered[low - 1]!.highest
  for (let i = low; i < answered.length; i++) {
    const other = answered[i]!
    const conflicts = other.exclusive || grant.mode === "exclusive"
    const expiredBefore = grant.expiresAt !== undefined && other.time !== undefined && grant.expiresAt <= other.time
    if (conflicts && !expiredBefore) previous = Math.max(previous, other.fence)
  }
  return previous
}

/** See `History.check`: the events in `at` order, each checked against what came before. */
export const check = (events: Iterable<History.Event>): ReadonlyArray<History.Violation> => {
  const keys = new Map<string, KeyTrack>()
  const violations: Array<History.Violation> = []
  for (const event of Arr.sort(events, byAt)) {
    endExpired(keys, event.time)
    const k = trackOf(keys, event.key)
    switch (event._tag) {
      case "Grant":
        grant(k, event, violations)
        break
      case "Release":
        release(k, event, violations)
        break
      case "Renew": {
        const hold = k.holds.get(event.holder)
        if (hold !== undefined) {
          hold.expiresAt = hold.expiresAt === undefined ? event.expiresAt : Math.max(hold.expiresAt, event.expiresAt)
        }
        break
      }
      case "Expire": {
        k.holds.delete(event.holder)
        k.ended.add(event.holder)
        break
      }
      case "ForceRelease": {
        for (const holder of k.holds.keys()) k.ended.add(holder)
        k.holds.clear()
        break
      }
    }
  }
  return violations
}

const trackOf = (keys: Map<string, KeyTrack>, key: string): KeyTrack => {
  let found = keys.get(key)
  if (found === undefined) {
    found = { answered: [], holds: new Map(), ended: new Set() }
    keys.set(key, found)
  }
  return found
}

/** Ends every hold whose `expiresAt` is not after `time`. */
const endExpired = (keys: Map<string, KeyTrack>, time: number | undefined): void => {
  if (time === undefined) return
  for (const k of keys.values()) {
    for (const [holder, hold] of k.holds) {
      if (hold.expiresAt !== undefined && hold.expiresAt <= time) {
        k.holds.delete(holder)
        k.ended.add(holder)
      }
    }
  }
}

/** A grant: its fence, its overlap with the other holders, and (shared) the key's capacity. */
const grant = (k: KeyTrack, event: Grant, violations: Array<History.Violation>): void => {
  const { holder, mode } = event
  const current = k.holds.get(holder)
  checkFence(k, event, current, violations)
  for (const [other, hold] of k.holds) {
    if (other === holder) continue
    const otherMode = hold.exclusive > 0 ? "exclusive" : hold.shared > 0 ? "shared" : undefined
    if (otherMode !== undefined && (mode === "exclusive" || otherMode === "exclusive")) {
      violations.push(Violation.Overlap({ at: event.at, key: event.key, holder, mode, other, otherMode }))
    }
  }
  const hold: HoldState = current ??
    { exclusive: 0, shared: 0, permits: 0, limit: event.limit, fence: event.fence, expiresAt: undefined }
  if (event.expiresAt !== undefined) {
    hold.expiresAt = hold.expiresAt === undefined ? event.expiresAt : Math.max(hold.expiresAt, event.expiresAt)
  }
  if (mode === "exclusive") {
    hold.exclusive += 1
  } else {
    if (hold.shared === 0) {
      checkCapacity(k, event, violations)
      hold.permits = event.permits
      hold.limit = event.limit
    }
    hold.shared += 1
  }
  k.holds.set(holder, hold)
}

/**
 * A new grant's fence must beat the fences before it (and is remembered for the grants after it);
 * a re-entrant one keeps its hold's fence.
 */
const checkFence = (k: KeyTrack, event: Grant, current: HoldState | undefined, violations: Array<History.Violation>): void => {
  const { at, holder, key } = event
  if (current !== undefined) {
    if (current.fence !== event.fence) {
      violations.push(Violation.FenceChanged({ at, key, holder, fence: event.fence, expected: current.fence }))
    }
    return
  }
  const previous = fenceToBeat(k.answered, event)
  if (!(event.fence > previous)) {
    violations.push(Violation.FenceNotIncreasing({ at, key, holder, fence: event.fence, previous }))
  }
  const last = k.answered[k.answered.length - 1]
  k.answered.push({
    at,
    time: event.time,
    fence: event.fence,
    exclusive: event.mode === "exclusive",
    highest: Math.max(last?.highest ?? Number.NEGATIVE_INFINITY, event.fence)
  })
  k.ended.delete(holder)
}

/** A holder's first shared grant: the key's readers agree on the limit and fit under it. */
const checkCapacity = (k: KeyTrack, event: Grant, violations: Array<History.Violation>): void => {
  const { at, holder, key } = event
  const readers = Array.from(k.holds.entries()).filter(([other, h]) => other !== holder && h.shared > 0)
  const expected = readers[0]?.[1].limit
  if (expected !== undefined && expected !== event.limit) {
    violations.push(Violation.LimitMismatch({ at, key, holder, limit: event.limit, expected }))
  }
  const permits = readers.reduce((sum, [, h]) => sum + h.permits, 0) + event.permits
  if (permits > event.limit) {
    violations.push(Violation.PermitsExceeded({ at, key, holder, permits, limit: event.limit }))
  }
}

/** A release of one hold in its mode; of a hold never granted (and not ended), a violation. */
const release = (k: KeyTrack, event: Release, violations: Array<History.Violation>): void => {
  const { at, holder, key, mode } = event
  const hold = k.holds.get(holder)
  const count = hold === undefined ? 0 : mode === "exclusive" ? hold.exclusive : hold.shared
  if (hold === undefined || count === 0) {
    if (!k.ended.has(holder)) violations.push(Violation.ReleaseWithoutGrant({ at, key, holder, mode }))
    return
  }
  if (mode === "exclusive") {
    hold.exclusive -= 1
  } else {
    hold.shared -= 1
    if (hold.shared === 0) hold.permits = 0
  }
  if (hold.exclusive === 0 && hold.shared === 0) k.holds.delete(holder)
}

/** See `History.instrument`. */
export const instrument = (recorder: History.Recorder, backend: Service): Service => {
  // Acquisitions whose reply was lost may or may not have been granted; the lock API then releases
  // them best-effort with the same count. That release undoes a grant the history never saw, so
  // it is not recorded either.
  const uncertain = new Set<string>()
  const attempt = (r: { readonly key: string; readonly holder: string; readonly mode: HoldMode; readonly count: number }) =>
    `${r.key}\u0000${r.holder}\u0000${r.mode}\u0000${r.count}`
  // A hand-off (the backend granted a waiter on its own, see `LockBackend.HandOff`) is numbered
  // when the waiter takes it, as if answered to its last attempt (the backend granted it after that
  // attempt was processed), expiring a claim after that attempt was sent; it is recorded once the
  // lock API relies on it, which its next call says: a renewal or a release, not an acquire (which
  // confirms a claim the API did not rely on, and is recorded as its own grant).
  const lastAttempt = new Map<string, { readonly request: AcquireRequest; readonly before: number; readonly invokedAt: number }>()
  const handedOver = new Map<string, { readonly grant: History.GrantInput; readonly at: number }>()
  const holderOf = (key: string, holder: string) => `${key}\u0000${holder}`
  const reliedOn = (key: string, holder: string) =>
    Effect.suspend(() => {
      const pending = handedOver.get(holderOf(key, holder))
      if (pending === undefined) return Effect.void
      handedOver.delete(holderOf(key, holder))
      return recorder.grant(pending.grant, pending.at)
    })
  return {
    ...backend,
    subscribe: (key, holder, mode) =>
      Effect.map(backend.subscribe(key, holder, mode), (subscription): Subscription => {
        const take = subscription.takeHandOff
        if (take === undefined) return subscription
        return {
          ...subscription,
          takeHandOff: Effect.tap(take, (handOff) => {
            const last = lastAttempt.get(holderOf(key, holder))
            if (handOff === undefined || last === undefined) return Effect.void
            lastAttempt.delete(holderOf(key, holder))
            return Effect.map(recorder.sequence, (at) =>
              void handedOver.set(holderOf(key, holder), {
                at,
                grant: {
                  key,
                  holder,
                  mode: last.request.mode,
                  permits: last.request.permits,
                  limit: last.request.limit,
                  fence: handOff.fence,
                  expiresAt: last.before + handOff.claimMs,
                  invokedAt: last.invokedAt
                }
              }))
          })
        }
      }),
    acquire: (request) =>
      Effect.gen(function*() {
        const before = yield* Clock.currentTimeMillis
        const invokedAt = yield* recorder.sequence
        // a hand-off this holder took and then asked to confirm: not relied on
        handedOver.delete(holderOf(request.key, request.holder))
        lastAttempt.set(holderOf(request.key, request.holder), { request, before, invokedAt })
        const result = yield* backend.acquire(request).pipe(
          Effect.tapErrorTag("BackendError", () => Effect.sync(() => uncertain.add(attempt(request))))
        )
        if (result._tag === "Granted") {
          lastAttempt.delete(holderOf(request.key, request.holder))
          yield* recorder.grant({
            key: request.key,
            holder: request.holder,
            mode: request.mode,
            permits: request.permits,
            limit: request.limit,
            fence: result.fence,
            expiresAt: before + request.leaseMs,
            invokedAt
          })
        }
        return result
      }),
    release: (request) =>
      Effect.gen(function*() {
        yield* reliedOn(request.key, request.holder)
        if (uncertain.delete(attempt(request))) return yield* backend.release(request)
        const at = yield* recorder.sequence
        const exit = yield* Effect.exit(backend.release(request))
        // a release whose reply is lost still ends the hold for the history: if it did not run,
        // the backend keeps the hold until it expires and grants it to nobody else meanwhile
        const lostReply = Exit.isFailure(exit) && Option.exists(Cause.failureOption(exit.cause), (e) => e._tag === "BackendError")
        if (Exit.isSuccess(exit) || lostReply) yield* recorder.release(request, at)
        return yield* exit
      }),
    renew: (requests) =>
      Effect.gen(function*() {
        yield* Effect.forEach(requests, (request) => reliedOn(request.key, request.holder), { discard: true })
        const before = yield* Clock.currentTimeMillis
        const results = yield* backend.renew(requests)
        yield* Effect.forEach(requests, (request, i) => {
          const result = results[i]
          // an error says nothing about the hold: neither renewed nor gone
          if (result === undefined || Either.isLeft(result)) return Effect.void
          return result.right
            ? recorder.renew({ key: request.key, holder: request.holder, expiresAt: before + request.leaseMs })
            : recorder.expire({ key: request.key, holder: request.holder })
        }, { discard: true })
        return results
      }),
    forceRelease: (request) =>
      Effect.gen(function*() {
        const at = yield* recorder.sequence
        const released = yield* backend.forceRelease(request)
        yield* recorder.forceRelease(request.key, at)
        return released
      })
  }
}
