/**
 * A lease's life: bound to its holder's record when granted, and closed once, which releases its
 * hold and, for the last lease of the record, ends the record.
 */
import { Duration, Effect, FiberRef } from "effect"
import type { Lease, LeaseState } from "../Lease.js"
import type { AcquireRequest, HoldMode } from "../LockBackend.js"
import type { LockLost } from "../LockError.js"
import { heldLeases } from "./fiberHolds.js"
import * as HeldSet from "./heldSet.js"
import type { Held } from "./holdRecord.js"
import { countIn, isLive, unsafeStartHeld } from "./holdRecord.js"
import type { LockSpec } from "./spec.js"

/** Where a lease keeps its holder's record, for `whileHeld`. */
const heldOf = Symbol.for("@lockstep/core/Lease/held")

/** The holder's record behind a lease made here. */
export const recordOf = (lease: Lease): Held => (lease as Lease & { readonly [heldOf]: Held })[heldOf]

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
 * A lease: one acquisition's view of its holder's record, which re-entrant leases share. Once
 * closed it answers for itself (no time left, released) whatever the record does next.
 */
class LeaseImpl implements Lease {
  /** How the lease ended, once its scope closed. */
  ended: "Released" | "Lost" | undefined = undefined
  readonly [heldOf]: Held
  constructor(
    readonly key: string,
    readonly holder: string,
    readonly mode: HoldMode,
    readonly permits: number,
    readonly fence: number,
    record: Held
  ) {
    this[heldOf] = record
  }
  // getters: nothing is allocated per lease unless asked; each effect reads the lease when run,
  // so one kept past the lease's scope answers for then
  get expiresIn(): Effect.Effect<Duration.Duration> {
    return Effect.suspend(() => (this.ended !== undefined || this[heldOf].dead ? noTimeLeft : this[heldOf].expiresIn))
  }
  get lost(): Effect.Effect<never, LockLost> {
    return this[heldOf].lost
  }
  get state(): Effect.Effect<LeaseState> {
    return Effect.sync(() => this.ended ?? (this[heldOf].dead ? "Lost" : "Held"))
  }
}

/**
 * Binds a grant to the lease's scope: joins the holder's live record (re-entry) or starts a new
 * one with its watchdog, and registers the release. The last lease of a record to close stops the
 * watchdog; every lease releases its own hold. Where the record is held (the scope owner's fiber,
 * or withLock's body) is the caller's business. It binds when called (as it is, where the grant's
 * reply is handled): the effect returned only finishes what the keeper has left to do.
 * `claimMs`: the grant is a hand-off's claim (see `HandOff`), which the record holds until
 * `sentAt` + `claimMs` unless it confirms it sooner.
 */
export const attach = (
  spec: LockSpec,
  request: AcquireRequest,
  fence: number,
  sentAt: number,
  found: Held | undefined,
  claimMs?: number
): Effect.Effect<Grant> => {
  const bind = (record: Held): Grant => {
    if (spec.mode === "exclusive") record.counts.exclusive = request.count
    else record.counts.shared = request.count
    const lease = new LeaseImpl(spec.key, request.holder, spec.mode, request.permits, fence, record)
    const close = Effect.suspend(() => {
      if (lease.ended !== undefined) return Effect.void
      // a hold lost before this lease closed stays lost: its release was never confirmed
      lease.ended = record.dead ? "Lost" : "Released"
      return closeLease(spec, record)
    })
    return { _tag: "Granted", lease, close }
  }
  if (found !== undefined && isLive(found)) {
    found.leases++
    return Effect.succeed(bind(found))
  }
  const [record, keeping] = unsafeStartHeld(spec, request, fence, sentAt, claimMs)
  const grant = bind(record)
  return keeping === undefined ? Effect.succeed(grant) : Effect.as(keeping, grant)
}

/**
 * One lease of `record` closes: its hold is released (unless the hold was lost, which released
 * it); the last one ends the record, which the keeper and the fiber forget.
 */
const closeLease = (spec: LockSpec, record: Held): Effect.Effect<void> =>
  Effect.withFiberRuntime((fiber) => {
    record.leases--
    const count = countIn(record, spec.mode)
    if (spec.mode === "exclusive") record.counts.exclusive = Math.max(0, count - 1)
    else record.counts.shared = Math.max(0, count - 1)
    const released = record.dead ? Effect.void : release(spec, record, count)
    if (record.leases > 0) return released
    record.stop()
    // the fiber closing the last lease forgets the record, if it has it (withLock's caller never does)
    const leases = fiber.getFiberRef(heldLeases)
    if (!HeldSet.has(leases.all, record) && !HeldSet.has(leases.taken, record)) return released
    return Effect.zipRight(
      FiberRef.set(heldLeases, {
        all: HeldSet.remove(leases.all, record),
        taken: HeldSet.remove(leases.taken, record)
      }),
      released
    )
  })

/** Releases one hold of the record's holder: its count in the lock's mode goes from `count` down by one. */
const release = (spec: LockSpec, record: Held, count: number): Effect.Effect<void> =>
  Effect.matchEffect(
    spec.backend.release({ key: spec.key, holder: record.holder, mode: spec.mode, count, leaseMs: record.leaseMs }),
    {
      onSuccess: () => Effect.void,
      onFailure: (error) => Effect.logWarning(`lockstep: release of "${spec.key}" by ${record.holder} failed`, error.message)
    }
  )
