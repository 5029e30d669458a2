/**
 * A lease's life: bound to its holder's hold when granted, and closed once, which releases its
 * share of the hold and, for the last lease of the hold, ends the hold.
 */
import { Duration, Effect, FiberRef } from "effect"
import type { Lease, LeaseState } from "../Lease.js"
import type { AcquireRequest, HoldMode } from "../LockBackend.js"
import type { LockLost } from "../LockError.js"
import { fiberHolds } from "./fiberHolds.js"
import type { Hold } from "./hold.js"
import { countIn, isLive, unsafeStartHold } from "./hold.js"
import * as HoldSet from "./holdSet.js"
import type { LockSpec } from "./spec.js"

/** Where a lease keeps its holder's hold, for `whileHeld`. */
const holdKey = Symbol.for("@lockstep/core/Lease/held")

/** The holder's hold behind a lease made here. */
export const holdOf = (lease: Lease): Hold => (lease as Lease & { readonly [holdKey]: Hold })[holdKey]

/**
 * A granted lease and what ends it (once; later calls do nothing). Tagged: it is also the outcome
 * of an attempt that was granted.
 */
export interface Grant {
  readonly _tag: "Granted"
  readonly lease: Lease
  readonly close: Effect.Effect<void>
}

const noTimeLeft = Effect.succeed(Duration.zero)

/**
 * A lease: one acquisition's view of its holder's hold, which re-entrant leases share. It keeps
 * only what is its own (mode, permits, how it ended) and reads the rest from the hold. Once
 * closed it answers for itself (no time left, released) whatever the hold does next.
 */
class LeaseImpl implements Lease {
  /** How the lease ended, once its scope closed. */
  ended: "Released" | "Lost" | undefined = undefined
  readonly [holdKey]: Hold
  constructor(readonly mode: HoldMode, readonly permits: number, hold: Hold) {
    this[holdKey] = hold
  }
  get key(): string {
    return this[holdKey].key
  }
  get holder(): string {
    return this[holdKey].holder
  }
  get fence(): number {
    return this[holdKey].fence
  }
  // getters: nothing is allocated per lease unless asked; each effect reads the lease when run,
  // so one kept past the lease's scope answers for then
  get expiresIn(): Effect.Effect<Duration.Duration> {
    return Effect.suspend(() => (this.ended !== undefined || this[holdKey].dead ? noTimeLeft : this[holdKey].expiresIn))
  }
  get lost(): Effect.Effect<never, LockLost> {
    return this[holdKey].lost
  }
  get state(): Effect.Effect<LeaseState> {
    return Effect.sync(() => this.ended ?? (this[holdKey].dead ? "Lost" : "Held"))
  }
  // what a logged or serialized lease shows: the fields the getters read from the hold
  toJSON(): unknown {
    return { key: this.key, holder: this.holder, mode: this.mode, permits: this.permits, fence: this.fence }
  }
  [Symbol.for("nodejs.util.inspect.custom")](): unknown {
    return this.toJSON()
  }
}

/**
 * Binds a grant to the lease's scope: joins the holder's live hold (re-entry) or starts a new
 * one with its watchdog, and registers the release. The last lease of a hold to close stops the
 * watchdog; every lease releases its own count. Where the hold is kept (the scope owner's fiber,
 * or withLock's body) is the caller's business. It binds when called (as it is, where the grant's
 * reply is handled): the effect returned only finishes what the keeper has left to do.
 * `claimMs`: the grant is a hand-off's claim (see `HandOff`), which the hold keeps until
 * `sentAt` + `claimMs` unless it confirms it sooner.
 */
export const attach = (
  spec: LockSpec,
  request: AcquireRequest,
  fence: number,
  sentAt: number,
  found: Hold | undefined,
  claimMs?: number
): Effect.Effect<Grant> => {
  const bind = (hold: Hold): Grant => {
    if (spec.mode === "exclusive") hold.counts.exclusive = request.count
    else hold.counts.shared = request.count
    const lease = new LeaseImpl(spec.mode, request.permits, hold)
    const close = Effect.suspend(() => {
      if (lease.ended !== undefined) return Effect.void
      // a hold lost before this lease closed stays lost: its release was never confirmed
      lease.ended = hold.dead ? "Lost" : "Released"
      return closeLease(spec, hold)
    })
    return { _tag: "Granted", lease, close }
  }
  if (found !== undefined && isLive(found)) {
    found.leases++
    return Effect.succeed(bind(found))
  }
  const [hold, keeping] = unsafeStartHold(spec, request, fence, sentAt, claimMs)
  const grant = bind(hold)
  return keeping === undefined ? Effect.succeed(grant) : Effect.as(keeping, grant)
}

/**
 * One lease of `hold` closes: its count is released (unless the hold was lost, which released
 * it); the last one ends the hold, which the keeper and the fiber forget.
 */
const closeLease = (spec: LockSpec, hold: Hold): Effect.Effect<void> =>
  Effect.withFiberRuntime((fiber) => {
    hold.leases--
    const count = countIn(hold, spec.mode)
    if (spec.mode === "exclusive") hold.counts.exclusive = Math.max(0, count - 1)
    else hold.counts.shared = Math.max(0, count - 1)
    const released = hold.dead ? Effect.void : release(spec, hold, count)
    if (hold.leases > 0) return released
    hold.stop()
    // the fiber closing the last lease forgets the hold, if it has it (withLock's caller never does)
    const holds = fiber.getFiberRef(fiberHolds)
    if (!HoldSet.has(holds.all, hold) && !HoldSet.has(holds.taken, hold)) return released
    return Effect.zipRight(
      FiberRef.set(fiberHolds, {
        all: HoldSet.remove(holds.all, hold),
        taken: HoldSet.remove(holds.taken, hold)
      }),
      released
    )
  })

/** Releases one count of the hold's holder: its count in the lock's mode goes from `count` down by one. */
const release = (spec: LockSpec, hold: Hold, count: number): Effect.Effect<void> =>
  Effect.matchEffect(
    spec.backend.release({ key: spec.key, holder: hold.holder, mode: spec.mode, count, leaseMs: hold.leaseMs }),
    {
      onSuccess: () => Effect.void,
      onFailure: (error) => Effect.logWarning(`lockstep: release of "${spec.key}" by ${hold.holder} failed`, error.message)
    }
  )
