/**
 * Acquisition: the attempts a lock makes at its backend, the waiting between them and the retries
 * after a backend failure, observed as one span and one set of metrics. A grant it makes is bound
 * to a scope here, or to a body in `criticalSection.ts`.
 */
import { Cause, Clock, Context, DefaultServices, Duration, Effect, Exit, FiberRef, GlobalValue, Option, Schedule, Scope, Tracer } from "effect"
import type { Fiber } from "effect"
import type { Lease } from "../Lease.js"
import type { AcquireRequest, AcquireResult } from "../LockBackend.js"
import type { BackendError, InvalidLockOptions, LockUpgradeNotSupported, SelfDeadlock } from "../LockError.js"
import { isBackendClosed, LockTimeout } from "../LockError.js"
import { fiberHolds, liveOn, selfDeadlock, withHold } from "./fiberHolds.js"
import { countIn } from "./hold.js"
import * as HoldSet from "./holdSet.js"
import type { Grant } from "./lease.js"
import { attach, holdOf } from "./lease.js"
import type { Outcome } from "./metrics.js"
import * as metrics from "./metrics.js"
import type { LockSpec, Restore, Retry } from "./spec.js"
import { driftMs, monotonicMillis } from "./time.js"
import { awaitWakeUp } from "./wakeUp.js"

export type AttemptError = BackendError | InvalidLockOptions | LockUpgradeNotSupported | SelfDeadlock

/**
 * How an acquisition waits, as the caller's options decide it: the part of a request a lock and
 * a multi-lock share.
 */
export interface Waiting {
  /**
   * One attempt and no more (a try without `wait`; a multi-lock: one round): denied, it gives up
   * at once, neither waiting nor retrying a `BackendError`.
   */
  readonly singleAttempt: boolean
  /** Otherwise: how long it may wait in all, in ms, before `LockTimeout` (`Infinity`: no limit). */
  readonly timeoutMs: number
  /** What to do on a `BackendError`: try again after each of this schedule's delays (none: fail). */
  readonly retry: Retry
}

/** One acquisition, as the lock API asks it of a handle: what it takes and how it waits. */
export interface LeaseRequest extends Waiting {
  readonly spec: LockSpec
  /** Permits to take (1 but for a semaphore). */
  readonly permits: number
}

/** The backend refused for now: the backend's own answer, with how long waiting is useful. */
type Denied = Extract<AcquireResult, { readonly _tag: "Denied" }>

/**
 * The hold being re-entered is gone (or the request was refused as a late copy): the acquisition
 * starts over as a new holder.
 */
interface Stale {
  readonly _tag: "Stale"
}

const stale: Stale = { _tag: "Stale" }
const succeedStale = Effect.succeed(stale)

/** How one request to the backend ended. */
type Attempt = Grant | Denied | Stale

type Granting = Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout>

const holderCounter = GlobalValue.globalValue(Symbol.for("@lockstep/core/holderCounter"), () => ({ next: 0 }))

const timedOut = (leaseRequest: LeaseRequest): LockTimeout =>
  new LockTimeout({ key: leaseRequest.spec.key, timeout: Duration.millis(leaseRequest.timeoutMs) })

/**
 * Acquires a lease into the current scope (`None`: a single attempt was denied). Each attempt
 * runs uninterruptibly and its grant is bound to the scope in the same step; only the waiting in
 * between is interruptible. An interruption that arrived while a grant was in flight releases
 * that grant at once, and an attempt whose reply was lost is released best-effort: nothing is
 * left held for a caller that has no lease.
 */
export const scopedLease = (
  leaseRequest: LeaseRequest
): Effect.Effect<Option.Option<Lease>, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(takeGrant(leaseRequest, restore), (grant) => {
      if (Option.isNone(grant)) return Effect.succeedNone
      const { close, lease } = grant.value
      const hold = holdOf(lease)
      return Effect.flatMap(Effect.scope, (scope) =>
        Effect.zipRight(
          Effect.zipRight(
            // a new hold joins the holds of the fiber whose scope owns the lease (a re-entered one is there)
            FiberRef.update(fiberHolds, (holds) =>
              HoldSet.has(holds.all, hold) ? holds : withHold(holds, hold)),
            Scope.addFinalizer(scope, close)
          ),
          // an interruption that arrived while the grant was in flight: the caller gets no
          // lease, so the grant is released now rather than when the caller's scope closes
          Effect.as(Effect.onInterrupt(restore(Effect.void), () => close), Option.some(lease))
        ))
    })
  )

/** Effect's built-in tracer: its spans go nowhere, so an acquisition under it makes none. */
const nativeTracer = Context.get(DefaultServices.liveServices, Tracer.Tracer)

/**
 * One acquisition, observed: a `lockstep.acquire` span (key, kind, permits, then fence, wait and
 * outcome) when a tracer is installed, and the acquisition metrics. Stack traces are not
 * captured: this is every lock's path. `restore` is where it may be interrupted (the caller runs
 * it uninterruptibly).
 */
export const takeGrant = (leaseRequest: LeaseRequest, restore: Restore): Granting =>
  Effect.withFiberRuntime((fiber) =>
    Context.get(fiber.currentDefaultServices, Tracer.Tracer) === nativeTracer
      ? observedOn(leaseRequest, restore, fiber, undefined)
      : Effect.useSpan(
        "lockstep.acquire",
        {
          kind: "client",
          captureStackTrace: false,
          attributes: { "lockstep.key": leaseRequest.spec.key, "lockstep.kind": leaseRequest.spec.kind, "lockstep.permits": leaseRequest.permits }
        },
        (span) => Effect.withFiberRuntime((fiber) => observedOn(leaseRequest, restore, fiber, span))
      )
  )

/** The attempts, timed on the fiber's clock and observed (with `span`, if any) when they end. */
const observedOn = (
  leaseRequest: LeaseRequest,
  restore: Restore,
  fiber: Fiber.RuntimeFiber<unknown, unknown>,
  span: Tracer.Span | undefined
): Granting => {
  const clock = Context.get(fiber.currentDefaultServices, Clock.Clock)
  const startedAt = clock.unsafeCurrentTimeNanos()
  // the caller runs this uninterruptibly (only `restore` is interruptible): observing the
  // exit needs no `onExit` of its own, which would mask interruption once more
  return Effect.flatMap(Effect.exit(grantWithRetry(leaseRequest, restore)), (exit) => {
    observeAcquisition(leaseRequest.spec, span, exit, startedAt, clock.unsafeCurrentTimeNanos())
    return exit
  })
}

const observeAcquisition = (
  spec: LockSpec,
  span: Tracer.Span | undefined,
  exit: Exit.Exit<Option.Option<Grant>, AttemptError | LockTimeout>,
  startedAt: bigint,
  endedAt: bigint
): void => {
  const seconds = Number(endedAt - startedAt) / 1e9
  let outcome: Outcome
  if (Exit.isSuccess(exit)) {
    if (Option.isSome(exit.value)) {
      outcome = "granted"
      if (span !== undefined) {
        span.attribute("lockstep.fence", exit.value.value.lease.fence)
        span.attribute("lockstep.holder", exit.value.value.lease.holder)
      }
    } else {
      outcome = "unavailable"
    }
  } else {
    const failure = Cause.failureOption(exit.cause)
    if (Option.isNone(failure)) return // interrupted: neither granted nor failed
    outcome = failure.value._tag === "LockTimeout" ? "timeout" : "error"
  }
  if (span !== undefined) {
    span.attribute("lockstep.wait_ms", seconds * 1000)
    span.attribute("lockstep.outcome", outcome)
  }
  metrics.recordAcquisition(spec.labels, outcome, seconds)
}

/**
 * An acquisition that, after a `BackendError`, starts over (as a new holder: the failed attempt's
 * clean-up ended the old one) after each of `retry`'s delays, until the schedule is done (that
 * error) or the timeout passed (`LockTimeout`). A single attempt is not retried: it must not
 * wait. The delays are interruptible.
 */
const grantWithRetry = (leaseRequest: LeaseRequest, restore: Restore): Granting => {
  const retry = leaseRequest.retry
  if (retry === undefined || leaseRequest.singleAttempt) return grantAsHolder(leaseRequest, restore)
  return Effect.flatMap(Effect.zip(Schedule.driver(retry), monotonicMillis), ([driver, startedAt]) => {
    const from = (attempt: LeaseRequest): Granting =>
      // a closed backend never answers again: nothing to retry
      Effect.catchIf(grantAsHolder(attempt, restore), (error): error is BackendError => error._tag === "BackendError" && !isBackendClosed(error), (error) =>
        Effect.matchEffect(restore(driver.next(error)), {
          onFailure: () => Effect.fail(error),
          onSuccess: () =>
            Effect.flatMap(monotonicMillis, (now) => {
              if (leaseRequest.timeoutMs === Infinity) return from(leaseRequest)
              const rest = leaseRequest.timeoutMs - (now - startedAt)
              return rest > 0 ? from({ ...leaseRequest, timeoutMs: rest }) : Effect.fail(timedOut(leaseRequest))
            })
        }))
    return from(leaseRequest)
  })
}

/**
 * An acquisition as one holder: re-enters the current fiber's hold on the key (or takes a new
 * holder identity), makes the first attempt and, when denied, waits and tries again (a single
 * attempt: no waiting). A hold found gone meanwhile starts it over as a new holder.
 */
const grantAsHolder = (leaseRequest: LeaseRequest, restore: Restore): Granting =>
  // what the first attempt needs is read synchronously: this is the path every lock takes
  Effect.withFiberRuntime((fiber) => {
    const { permits, spec } = leaseRequest
    const clock = Context.get(fiber.currentDefaultServices, Clock.Clock)
    const mine = liveOn(fiber.getFiberRef(fiberHolds), spec)
    const found = spec.reentrant ? mine.find((h) => h.reentrant) : undefined
    const deadlock = mine.length === 0 ? undefined : selfDeadlock(spec, permits, mine, found)
    if (deadlock !== undefined) return Effect.fail(deadlock)
    const holder = found?.holder ?? `${spec.backend.clientId}:${++holderCounter.next}`
    const request: AcquireRequest = {
      key: spec.key,
      holder,
      mode: spec.mode,
      permits,
      limit: spec.limit,
      leaseMs: spec.leaseMs ?? spec.watchdogMs,
      fair: spec.fair,
      waiterTtlMs: spec.waiterTtlMs,
      count: found === undefined ? 1 : countIn(found, spec.mode) + 1
    }
    const startedAt = Number(clock.unsafeCurrentTimeNanos()) / 1_000_000
    const attemptAt = (sentAt: number): Effect.Effect<Attempt, AttemptError> =>
      Effect.matchEffect(spec.backend.acquire(request), {
        onSuccess: (result): Effect.Effect<Attempt> => {
          if (result._tag === "Denied") return Effect.succeed(result)
          if (found !== undefined && result.fence !== found.fence) {
            // granted afresh (a writer taking the read lock of a key the backend forgot): the
            // hold being re-entered is gone; give the new grant back and start over
            return Effect.as(Effect.zipRight(found.lose("NotHeld"), cleanUpAttempt(spec, request)), stale)
          }
          return attach(spec, request, result.fence, sentAt, found)
        },
        onFailure: (error): Effect.Effect<Attempt, AttemptError> => {
          switch (error._tag) {
            case "NotHeld":
              // the hold being re-entered is gone (or, for a new holder, refused as a late
              // copy): start over as a new holder
              return found === undefined ? succeedStale : Effect.as(found.lose("NotHeld"), stale)
            case "BackendError":
              // the reply may have been lost after the backend granted (or queued) the request
              return Effect.zipRight(cleanUpAttempt(spec, request), Effect.fail(error))
            default:
              return Effect.fail(error)
          }
        }
      })
    /**
     * A hand-off the backend granted while the waiter waited, measured from `sentAt` (when the
     * attempt the backend denied last was sent); undefined for a re-entry, which never waits.
     */
    const handedOver = (fence: number, sentAt: number, claimMs: number): Effect.Effect<Grant> | undefined =>
      found === undefined ? attach(spec, request, fence, sentAt, undefined, claimMs) : undefined
    const settle = (outcome: Attempt): Granting => {
      switch (outcome._tag) {
        case "Granted":
          return Effect.succeed(Option.some(outcome))
        case "Stale":
          return Effect.flatMap(monotonicMillis, (now) => {
            // start over as a new holder, within what is left of the wait; like the first
            // attempt, each attempt runs uninterruptibly (only the waiting is restored), so an
            // interruption cannot cut a grant in flight loose from its release
            if (leaseRequest.singleAttempt || leaseRequest.timeoutMs === Infinity) return grantAsHolder(leaseRequest, restore)
            return grantAsHolder({ ...leaseRequest, timeoutMs: Math.max(1, leaseRequest.timeoutMs - (now - startedAt)) }, restore)
          })
        case "Denied":
          // waiting ends granted or stale, never denied
          if (!leaseRequest.singleAttempt) {
            const waiter: Waiter = { leaseRequest, request, attemptAt, handedOver, startedAt, restore }
            return Effect.flatMap(waitForGrant(waiter), settle)
          }
          // a denied fair attempt queued us; a try-acquire must not stay in the queue
          return spec.fair ? Effect.zipRight(cancel(spec, holder), Effect.succeedNone) : Effect.succeedNone
      }
    }
    return Effect.flatMap(attemptAt(startedAt), settle)
  })

/** After an attempt failed without a reply: undo whatever it may have done. Best-effort. */
const cleanUpAttempt = (spec: LockSpec, request: AcquireRequest): Effect.Effect<void> =>
  Effect.zipRight(
    Effect.ignore(spec.backend.release({
      key: spec.key,
      holder: request.holder,
      mode: spec.mode,
      count: request.count,
      leaseMs: request.leaseMs
    })),
    spec.fair && request.count === 1 ? cancel(spec, request.holder) : Effect.void
  )

const cancel = (spec: LockSpec, holder: string): Effect.Effect<void> =>
  Effect.ignore(spec.backend.cancel({ key: spec.key, holder, leaseMs: spec.leaseMs ?? spec.watchdogMs }))

/** A holder's acquisition once its first attempt was denied: what its waiting works with. */
interface Waiter {
  readonly leaseRequest: LeaseRequest
  /** The request each attempt sends. */
  readonly request: AcquireRequest
  readonly attemptAt: (sentAt: number) => Effect.Effect<Attempt, AttemptError>
  readonly handedOver: (fence: number, sentAt: number, claimMs: number) => Effect.Effect<Grant> | undefined
  /** When the first attempt was sent (monotonic ms): the timeout counts from there. */
  readonly startedAt: number
  readonly restore: Restore
}

/**
 * Subscribe, then retry; sleep until a wake-up, the blocking hold's expiry, the fair-queue
 * heartbeat or the caller's deadline, whichever is first; retry. A wake-up that hands the lock
 * over (the backend granted it to this waiter: `HandOff`) ends the wait without another attempt
 * while its claim is surely live. Leaving without a grant drops the fair-queue entry and (through
 * the subscription's scope) hands any wake-up, or a claim, on.
 */
const waitForGrant = (waiter: Waiter): Effect.Effect<Grant | Stale, AttemptError | LockTimeout> => {
  const { attemptAt, handedOver, leaseRequest, request, restore } = waiter
  const spec = leaseRequest.spec
  return Effect.gen(function*() {
    const deadline = waiter.startedAt + leaseRequest.timeoutMs
    const subscription = yield* spec.backend.subscribe(spec.key, request.holder, spec.mode)
    // fair waiters refresh their queue entry well before it expires; every waiter tries again at
    // least once per waiter timeout, so a wake-up lost with a crashed waiter (or a network) delays
    // the others by that much at most, never by the blocking lease
    const heartbeatMs = Math.max(1, Math.floor(spec.fair ? spec.waiterTtlMs / 3 : spec.waiterTtlMs))
    while (true) {
      const sentAt = yield* monotonicMillis
      const result = yield* attemptAt(sentAt)
      if (result._tag !== "Denied") return result
      const now = yield* monotonicMillis
      if (now >= deadline) return yield* Effect.fail(timedOut(leaseRequest))
      yield* restore(awaitWakeUp(subscription, result.retryAfterMs, heartbeatMs, deadline - now))
      if (subscription.takeHandOff === undefined) continue
      const handOff = yield* subscription.takeHandOff
      if (handOff === undefined) continue
      // The claim's lease started on the backend when the release granted it, which was after
      // this waiter's last attempt was processed (the backend hands over only such claims), so
      // after it was sent: sentAt + claimMs, less the drift allowance, is never later than the
      // backend's expiry of the claim. While at least half of that is ahead, the hold is ours at
      // once (its keeper entry confirms it off the critical path, with the other half to spare:
      // see `Hold`); later, the claim may be gone before a confirmation reaches it, and the next
      // attempt confirms it instead (a holder's acquire answers its fence and count 1) or finds
      // it gone.
      const woke = yield* monotonicMillis
      const grant = woke - sentAt <= (handOff.claimMs - driftMs(handOff.claimMs)) / 2
        ? handedOver(handOff.fence, sentAt, handOff.claimMs)
        : undefined
      if (grant !== undefined) return yield* grant
    }
  }).pipe(
    Effect.scoped,
    Effect.onExit((exit) => Exit.isSuccess(exit) || !spec.fair ? Effect.void : cancel(spec, request.holder))
  )
}
