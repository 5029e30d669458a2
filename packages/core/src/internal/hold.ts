/**
 * A holder's hold on a key: the counts the backend was told, the local deadline the keeper watches
 * and renews, and the loss of the hold. Every lease of the holder on the key reads it.
 */
import { Deferred, Duration, Effect, FiberId } from "effect"
import type { Fiber } from "effect"
import type { AcquireRequest, HoldMode, Service } from "../LockBackend.js"
import { LockLost } from "../LockError.js"
import type { Entry, Keeper } from "./keeper.js"
import { keeperOf } from "./keeper.js"
import * as metrics from "./metrics.js"
import type { LockSpec } from "./spec.js"
import { driftMs, monotonicMillis } from "./time.js"

/** Whether the hold is still held: some lease of it is open and it was not lost. */
export const isLive = (hold: Hold): boolean => hold.leases > 0 && !hold.dead

/** The hold's count in `mode`, as the backend was last told it. */
export const countIn = (hold: Hold, mode: HoldMode): number =>
  mode === "exclusive" ? hold.counts.exclusive : hold.counts.shared

/**
 * One holder's live holds on one key, shared by all its leases (the outer one and re-entrant
 * ones, which may be released in any order), and the backend keeper's entry for it: the keeper
 * fails `lost` when the local deadline passes unconfirmed and (without a fixed lease) renews the
 * hold every watchdog / 3, moving the deadline on each confirmed renewal and failing `lost` when a
 * renewal reports the hold gone. Any other failure of a renewal is retried until the deadline
 * decides. Once lost, the hold is dead: the keeper forgets it, the bodies running under it are
 * interrupted and what may be left of it on the backend is released.
 */
export class Hold implements Entry {
  /** The holder's hold counts as the backend was last told them: every request names them. */
  readonly counts = { exclusive: 0, shared: 0 }
  /** Permits of the shared hold (0 for an exclusive one), counted against the lock's `limit`. */
  readonly permits: number
  readonly leaseMs: number
  /** The `withLock` bodies running under the hold: interrupted when it is lost. */
  readonly bodies: Array<Fiber.RuntimeFiber<unknown, unknown>> = []
  /** Open leases; at 0 the hold is done and a later grant starts a new holder. */
  leases = 1
  /** Set once `lost` has failed: the hold is gone, nothing may re-enter or renew it. */
  dead = false
  // the keeper's entry
  readonly watchdogMs: number | undefined
  /** The local deadline (monotonic ms): past it, unconfirmed, the hold is lost. */
  deadline: number
  confirmedAt: number
  /** A hand-off's claim not confirmed yet: the keeper renews it to the full lease soon. */
  unconfirmed: boolean
  attemptedAt = -Infinity
  renewing = false
  done = false
  at = Infinity
  index = -1
  /** Made when someone first waits on `lost`: most leases end without anyone asking. */
  private lostSignal: Deferred.Deferred<never, LockLost> | undefined = undefined
  private lostWith: LockLost | undefined = undefined

  constructor(
    /** The handle whose grant started the hold: its key, backend and kind are the hold's. */
    readonly spec: LockSpec,
    readonly keeper: Keeper,
    readonly holder: string,
    /** The fence of the grant that started the hold; every lease of it carries it. */
    readonly fence: number,
    permits: number,
    leaseMs: number,
    sentAt: number,
    /** The grant is a hand-off's claim of that many ms (see `HandOff`). */
    claimMs?: number
  ) {
    this.permits = spec.mode === "shared" ? permits : 0
    this.leaseMs = leaseMs
    this.watchdogMs = spec.leaseMs === undefined ? spec.watchdogMs : undefined
    // measured from before the granted request was sent, less the drift allowance, so it never
    // outlasts the backend's expiry (a claim's: from before the waiter's last denied attempt was
    // sent, which the backend processed before it granted the claim)
    const grantedMs = claimMs ?? leaseMs
    this.deadline = sentAt + grantedMs - driftMs(grantedMs)
    this.confirmedAt = sentAt
    this.unconfirmed = claimMs !== undefined
  }

  // read from the handle, not copied: a hold keeps each of them once
  get key(): string {
    return this.spec.key
  }
  get backend(): Service {
    return this.spec.backend
  }
  get reentrant(): boolean {
    return this.spec.reentrant
  }
  /** The limit the shared permits count against. */
  get limit(): number {
    return this.spec.limit
  }

  get lost(): Effect.Effect<never, LockLost> {
    return Effect.suspend(() => {
      if (this.lostWith !== undefined) return Effect.fail(this.lostWith)
      this.lostSignal ??= Deferred.unsafeMake<never, LockLost>(FiberId.none)
      return Deferred.await(this.lostSignal)
    })
  }

  get expiresIn(): Effect.Effect<Duration.Duration> {
    return Effect.map(monotonicMillis, (now) => Duration.millis(Math.max(0, this.deadline - now)))
  }

  /** Tells the keeper the hold ended normally: no more renewals, no deadline. */
  stop(): void {
    this.forget()
  }

  /** The keeper and the held-leases gauge let go of the hold once, however it ends. */
  private forget(): void {
    if (this.done) return
    this.keeper.remove(this)
    metrics.recordHeld(this.spec.labels, -1)
  }

  onLost(reason: LockLost["reason"]): Effect.Effect<void> {
    return this.lose(reason)
  }

  /** Fails `lost` (once), stops renewals and releases what may be left of the hold. */
  lose(reason: LockLost["reason"]): Effect.Effect<void> {
    return Effect.uninterruptible(Effect.suspend(() => {
      if (this.dead) return Effect.void
      this.dead = true
      this.forget()
      const spec = this.spec
      metrics.recordLost(spec.labels, reason)
      const remnant = (["exclusive", "shared"] as const).filter((mode) => countIn(this, mode) > 0)
      const lostWith = new LockLost({
        key: spec.key,
        holder: this.holder,
        reason,
        fixedLease: spec.leaseMs === undefined ? undefined : Duration.millis(spec.leaseMs)
      })
      this.lostWith = lostWith
      if (this.lostSignal !== undefined) Deferred.unsafeDone(this.lostSignal, Effect.fail(lostWith))
      for (const body of this.bodies) body.unsafeInterruptAsFork(FiberId.none)
      const logged = Effect.annotateLogs(Effect.logWarning("lockstep: lease lost"), {
        "lockstep.key": spec.key,
        "lockstep.holder": this.holder,
        "lockstep.reason": reason
      })
      // a release from count 1 ends the holder whatever its count was
      return Effect.zipRight(logged, Effect.forEach(remnant, (mode) =>
        Effect.ignore(spec.backend.release({
          key: spec.key,
          holder: this.holder,
          mode,
          count: 1,
          leaseMs: this.leaseMs
        })), { discard: true }))
    }))
  }
}

/**
 * Starts a holder's hold and hands it to the backend's keeper, now; what is left to do for the
 * keeper (see `Keeper.add`) is returned with it. `claimMs`: the grant is a hand-off's claim.
 */
export const unsafeStartHold = (
  spec: LockSpec,
  request: AcquireRequest,
  fence: number,
  sentAt: number,
  claimMs?: number
): readonly [Hold, Effect.Effect<void> | undefined] => {
  const hold = new Hold(spec, keeperOf(spec.backend), request.holder, fence, request.permits, request.leaseMs, sentAt, claimMs)
  metrics.recordHeld(spec.labels, 1)
  return [hold, hold.keeper.add(hold)]
}
