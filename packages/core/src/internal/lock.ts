import {
  Cause,
  Clock,
  Context,
  DefaultServices,
  Deferred,
  Duration,
  Effect,
  Equal,
  Exit,
  Fiber,
  FiberId,
  FiberRef,
  GlobalValue,
  Option,
  RuntimeFlags,
  RuntimeFlagsPatch,
  Schedule,
  Scope,
  Tracer
} from "effect"
import type { Lease, LeaseState } from "../Lease.js"
import type { AcquireRequest, AcquireResult, HoldMode, Service } from "../LockBackend.js"
import type { BackendError, InvalidLockOptions, LockUpgradeNotSupported } from "../LockError.js"
import { isBackendClosed, LockLost, LockTimeout, SelfDeadlock } from "../LockError.js"
import type { Entry, Keeper } from "./keeper.js"
import { keeperOf } from "./keeper.js"
import { driftMs, monotonicMillis } from "./time.js"
import { awaitWakeUp } from "./wakeUp.js"
import type { HandleLabels, Outcome } from "./metrics.js"
import * as metrics from "./metrics.js"

/** The kinds of handle; read and write locks are views of one key. */
export type LockKind = "Lock" | "FairLock" | "ReadLock" | "WriteLock" | "Semaphore"

/** Everything an acquisition needs to know about a lock handle, fixed at `make`. */
export interface LockSpec {
  readonly kind: LockKind
  readonly backend: Service
  readonly key: string
  readonly mode: HoldMode
  /** Shared capacity (Infinity for read locks); 1 for exclusive locks. */
  readonly limit: number
  readonly fair: boolean
  /** Re-entrant kinds share one holder identity per fiber; semaphores take a fresh one per acquisition. */
  readonly reentrant: boolean
  /** A fixed lease in ms, or `undefined` for a watchdog-renewed lease. */
  readonly leaseMs: number | undefined
  readonly watchdogMs: number
  readonly waiterTtlMs: number
  /** The handle's name for metrics, if it was given one. */
  readonly name: string | undefined
  readonly labels: HandleLabels
}

/** What an acquisition may do on a `BackendError`: try again on this schedule (none: fail). */
export type Retry = Schedule.Schedule<unknown, BackendError> | undefined

/** A critical section: an effect, or a function of the lease that makes one. */
export type Body<A, E, R> = Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>)

export const defaultWatchdogMs = 30_000
export const defaultWaiterTtlMs = 5_000

const isLive = (held: Held): boolean => held.leases > 0 && !held.dead

/**
 * Holds of the current fiber, by backend instance and key (`all`). Holds are per fiber: a forked
 * fiber starts with none, so concurrent children of a holder never enter its critical section
 * together (they wait like any other fiber), and fibers started on a runtime built by a layer
 * that acquired a lock do not inherit it. A joining child (`Effect.timeout`, `Effect.all`,
 * `Fiber.join`) hands the holds it took itself (`taken`, so a join costs what the child took) to
 * the fiber that joins it, whose scope usually owns them.
 */
interface HeldLeases {
  readonly all: ReadonlyArray<Held>
  readonly taken: ReadonlyArray<Held>
}

const noLeases: HeldLeases = { all: [], taken: [] }

/** Whether `held` is a hold on `spec`'s key through the same backend. */
const isOn = (held: Held, spec: LockSpec): boolean => held.key === spec.key && held.backend === spec.backend

/** `helds` without the records that ended, plus `held`. */
const addHeld = (helds: ReadonlyArray<Held>, held: Held): ReadonlyArray<Held> => {
  const out = helds.filter(isLive)
  out.push(held)
  return out
}

const heldLeases = GlobalValue.globalValue(
  Symbol.for("@lockstep/core/heldLeases/perFiber"),
  () =>
    FiberRef.unsafeMake<HeldLeases>(noLeases, {
      fork: () => noLeases,
      join: (parent, child) =>
        child.taken.reduce((acc, held) => {
          // a parent's own live re-entrant hold wins over a child's
          if (
            !isLive(held) || acc.all.includes(held) ||
            (held.reentrant && acc.all.some((h) => h.reentrant && isLive(h) && h.key === held.key && h.backend === held.backend))
          ) {
            return acc
          }
          return { all: addHeld(acc.all, held), taken: addHeld(acc.taken, held) }
        }, parent)
    })
)

/** Where a lease keeps its holder's record, for `whileHeld`. */
const heldOf = Symbol.for("@lockstep/core/Lease/held")

/**
 * Runs `body` under `leases` (one for a lock, one per part for a multi-lock) in a fiber of its
 * own, with the current fiber's holds (it re-enters them as the current fiber would: it is still
 * this fiber's critical section) and a scope of its own, closed when it ends. If any hold is lost
 * meanwhile, the body is interrupted and this fails with that `LockLost`; otherwise it ends as the
 * body did, and the body's fiber refs are inherited as with `Fiber.join`. `close` ends the leases
 * after the body's scope closed, however it ended. Call it uninterruptibly; `restore` is where it
 * may be interrupted.
 */
export const whileHeld = <A, E, R>(
  leases: ReadonlyArray<Lease>,
  body: Effect.Effect<A, E, R>,
  restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>,
  close: Effect.Effect<void>
): Effect.Effect<A, E | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.flatMap(Scope.make(), (scope) => Effect.withFiberRuntime((parent) => {
    const helds = leases.map((lease) => (lease as Lease & { readonly [heldOf]: Held })[heldOf])
    // withLock leaves the caller's holds alone: the records are the body's
    let all = parent.getFiberRef(heldLeases).all
    for (const held of helds) if (!all.includes(held)) all = addHeld(all, held)
    const holds: HeldLeases = { all, taken: [] }
    const callerContext = parent.getFiberRef(FiberRef.currentContext)
    // the body's fiber is new and ends with the body: its refs are set, not scoped
    const inside = Effect.zipRight(
      Effect.zipRight(
        FiberRef.set(heldLeases, holds),
        FiberRef.set(FiberRef.currentContext, Context.add(callerContext, Scope.Scope, scope))
      ),
      body as Effect.Effect<A, E, Exclude<R, Scope.Scope>>
    )
    return Effect.flatMap(
      Effect.fork(restore(inside)),
      (fiber) => {
        for (const held of helds) held.bodies.push(fiber)
        if (helds.some((held) => held.dead)) fiber.unsafeInterruptAsFork(FiberId.none)
        // the body's scoped resources close before the lease does
        const done = (exit: Exit.Exit<unknown, unknown>) => {
          for (const held of helds) {
            const i = held.bodies.indexOf(fiber)
            if (i !== -1) held.bodies.splice(i, 1)
          }
          // the lease ends even if a finalizer of the body dies
          return Effect.ensuring(Scope.close(scope, exit), close)
        }
        return Effect.matchCauseEffect(restore(Fiber.await(fiber)), {
          // interrupted while waiting for the body: interrupt it too
          onFailure: (cause) => Effect.zipRight(Effect.flatMap(Fiber.interrupt(fiber), done), Effect.failCause(cause)),
          onSuccess: (exit) => {
            const dead = Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause) ? helds.find((held) => held.dead) : undefined
            if (dead !== undefined) return Effect.zipRight(done(exit), dead.lost)
            return Effect.withFiberRuntime((_, status) =>
              inheritsNothing(fiber, parent, holds, status.runtimeFlags)
                ? Effect.zipRight(done(exit), exit)
                // inherited before the body's scope closes, so that what its finalizers restore
                // (a scoped fiber ref) stays restored; the body's context carries that scope: the
                // caller keeps its own
                : Effect.zipRight(
                  Effect.zipRight(Fiber.inheritAll(fiber), FiberRef.set(FiberRef.currentContext, callerContext)),
                  Effect.zipRight(done(exit), exit)
                )
            )
          }
        })
      }
    )
  }))

/**
 * Whether joining `body`, a body's fiber that has ended, would change nothing of `parent`, the
 * fiber that forked it and has been waiting for it since, whose runtime flags are `flags` now:
 * the body wrote no fiber ref (a ref it wrote, even back to the value it had, is joined as
 * `Fiber.join` joins it: a ref's `join` may combine equal values), and left the runtime flags
 * that a join passes on as they are. Its holds and context are not inherited this way (the
 * caller keeps its own).
 */
const inheritsNothing = (
  body: Fiber.RuntimeFiber<unknown, unknown>,
  parent: Fiber.RuntimeFiber<unknown, unknown>,
  holds: HeldLeases,
  flags: RuntimeFlags.RuntimeFlags
): boolean => {
  const id = body.id()
  for (const [ref, stack] of body.getFiberRefs().locals) {
    const [writer, value] = stack[0]
    if (ref === FiberRef.currentContext) continue
    if (ref === FiberRef.currentRuntimeFlags) {
      // what `Fiber.inheritAll` applies: the difference, less interruptibility and wind-down
      const patch = RuntimeFlagsPatch.exclude(
        RuntimeFlagsPatch.exclude(RuntimeFlags.diff(flags, value as RuntimeFlags.RuntimeFlags), RuntimeFlags.Interruption),
        RuntimeFlags.WindDown
      )
      if (!RuntimeFlagsPatch.isEmpty(patch)) return false
    } else if (ref === heldLeases) {
      if (value !== holds) return false
    } else if (Equal.equals(writer, id) || value !== parent.getFiberRef(ref)) {
      return false
    }
  }
  return true
}

const holderCounter = GlobalValue.globalValue(Symbol.for("@lockstep/core/holderCounter"), () => ({ next: 0 }))

/** The live holds among `holds` on the lock's key, of every kind. */
const liveOn = (holds: HeldLeases, spec: LockSpec): ReadonlyArray<Held> =>
  holds.all.length === 0 ? holds.all : holds.all.filter((h) => isLive(h) && isOn(h, spec))

/** The current fiber's live holds on the lock's key, of every kind. */
const liveHolds = (spec: LockSpec): Effect.Effect<ReadonlyArray<Held>> => Effect.map(FiberRef.get(heldLeases), (holds) => liveOn(holds, spec))

/** The holder identity of the current fiber for this lock, if it holds it. */
export const currentHolder = (spec: LockSpec): Effect.Effect<Option.Option<string>> =>
  Effect.map(liveHolds(spec), (helds) =>
    Option.map(Option.fromNullable(helds.find((h) => h.reentrant === spec.reentrant && spec.reentrant)), (h) => h.holder))

/**
 * Whether the current fiber holds the handle in its mode with a lease whose local deadline has not
 * passed: answered from the fiber's own records, without asking the backend.
 */
export const isHeldByCurrentFiber = (spec: LockSpec): Effect.Effect<boolean> =>
  Effect.withFiberRuntime((fiber) => {
    const helds = liveOn(fiber.getFiberRef(heldLeases), spec)
    if (helds.length === 0) return Effect.succeed(false)
    return Effect.map(monotonicMillis, (now) =>
      helds.some((h) => countIn(h, spec.mode) > 0 && (spec.reentrant || !h.reentrant) && now < h.deadline))
  })

/**
 * A request that could only be granted once the current fiber released a hold of its own on the
 * key (other than the one it re-enters) would wait forever: say so instead.
 */
const selfDeadlock = (spec: LockSpec, permits: number, mine: ReadonlyArray<Held>, reentered: Held | undefined) => {
  const others = mine.filter((h) => h !== reentered)
  if (others.length === 0) return undefined
  const describe = (h: Held) => (h.counts.exclusive > 0 ? "exclusively" : `with ${h.permits} shared permit(s)`)
  if (spec.mode === "exclusive") {
    return new SelfDeadlock({ key: spec.key, reason: `it holds the key ${describe(others[0]!)} under another lock handle` })
  }
  const writer = others.find((h) => h.counts.exclusive > 0)
  if (writer !== undefined) {
    return new SelfDeadlock({ key: spec.key, reason: "it holds the key exclusively under another lock handle" })
  }
  const taken = others.filter((h) => h.limit === spec.limit).reduce((sum, h) => sum + h.permits, 0)
  if (taken + permits > spec.limit) {
    return new SelfDeadlock({
      key: spec.key,
      reason: `it holds ${taken} of the ${spec.limit} permits itself and asks for ${permits} more`
    })
  }
  return undefined
}

export type AttemptError = BackendError | InvalidLockOptions | LockUpgradeNotSupported | SelfDeadlock

/** A granted lease and what ends it (once; later calls do nothing). */
interface Grant {
  readonly lease: Lease
  readonly close: Effect.Effect<void>
}

/**
 * Acquires a lease into the current scope. `timeoutMs`: `undefined` waits forever, `0` makes a
 * single attempt (try-acquire). Each attempt runs uninterruptibly and its grant is bound to the
 * scope in the same step; only the waiting in between is interruptible. An interruption that
 * arrived while a grant was in flight releases that grant at once, and an attempt whose reply was
 * lost is released best-effort: nothing is left held for a caller that has no lease.
 */
export const acquire = (
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined,
  retry?: Retry
): Effect.Effect<Option.Option<Lease>, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(acquireGrant(spec, permits, timeoutMs, retry, restore), (grant) => {
      if (Option.isNone(grant)) return Effect.succeedNone
      const { close, lease } = grant.value
      const held = (lease as Lease & { readonly [heldOf]: Held })[heldOf]
      return Effect.flatMap(Effect.scope, (scope) =>
        Effect.zipRight(
          Effect.zipRight(
            // a new record joins the holds of the fiber whose scope owns the lease (a re-entered one is there)
            FiberRef.update(heldLeases, (leases) =>
              leases.all.includes(held) ? leases : { all: addHeld(leases.all, held), taken: addHeld(leases.taken, held) }),
            Scope.addFinalizer(scope, close)
          ),
          // an interruption that arrived while the grant was in flight: the caller gets no
          // lease, so the grant is released now rather than when the caller's scope closes
          Effect.as(Effect.onInterrupt(restore(Effect.void), () => close), Option.some(lease))
        ))
    })
  )

/**
 * Runs `body` while holding a lease (waiting forever, or up to `timeoutMs`): the body's own scoped
 * resources close before the release, and the body is interrupted with `LockLost` if the lease is
 * lost. No scope is made for the lease: it ends when the body does.
 */
export const withLease = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined,
  retry?: Retry
): Effect.Effect<A, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(acquireGrant(spec, permits, timeoutMs, retry, restore), (grant) =>
      // only a zero timeout ends without a grant or a LockTimeout, and withLock never makes one
      Option.isNone(grant)
        ? Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")
        : runGranted(grant.value, body, restore))
  )

/**
 * `withLease` when the lock is free within `waitMs` (0: a single attempt): `Some` of what the body
 * returned, or `None` without running it.
 */
export const withLeaseIfGranted = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  waitMs: number,
  retry?: Retry
): Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(
      Effect.catchTag(acquireGrant(spec, permits, waitMs, retry, restore), "LockTimeout", () => Effect.succeedNone),
      (grant) => Option.isNone(grant) ? Effect.succeedNone : Effect.asSome(runGranted(grant.value, body, restore))
    )
  )

/** Runs a body under a grant just made (uninterruptibly: `restore` is where it may be interrupted). */
const runGranted = <A, E, R>(
  grant: Grant,
  body: Body<A, E, R>,
  restore: <X, Y, Z>(effect: Effect.Effect<X, Y, Z>) => Effect.Effect<X, Y, Z>
): Effect.Effect<A, E | LockLost, Exclude<R, Scope.Scope>> => {
  const { close, lease } = grant
  // an interruption that arrived while the grant was in flight stops here, before the body
  return Effect.matchCauseEffect(restore(Effect.void), {
    onFailure: (cause) => Effect.zipRight(close, Effect.failCause(cause)),
    onSuccess: () => whileHeld([lease], typeof body === "function" ? Effect.suspend(() => body(lease)) : body, restore, close)
  })
}

/** Effect's built-in tracer: its spans go nowhere, so an acquisition under it makes none. */
const nativeTracer = Context.get(DefaultServices.liveServices, Tracer.Tracer)

/**
 * One acquisition, observed: a `lockstep.acquire` span (key, kind, permits, then fence, wait and
 * outcome) when a tracer is installed, and the acquisition metrics. Stack traces are not
 * captured: this is every lock's path.
 */
const acquireGrant = (
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined,
  retry: Retry,
  restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> => {
  /** The attempts, timed on the fiber's clock and observed (with `span`, if any) when they end. */
  const observed = (span: Tracer.Span | undefined): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> =>
    Effect.withFiberRuntime((fiber) => {
      const clock = Context.get(fiber.currentDefaultServices, Clock.Clock)
      const startedAt = clock.unsafeCurrentTimeNanos()
      return Effect.onExit(
        attemptGrant(spec, permits, timeoutMs, retry, restore),
        (exit) => Effect.sync(() => observeAcquisition(spec, span, exit, startedAt, clock.unsafeCurrentTimeNanos()))
      )
    })
  return Effect.withFiberRuntime((fiber) =>
    Context.get(fiber.currentDefaultServices, Tracer.Tracer) === nativeTracer
      ? observed(undefined)
      : Effect.useSpan(
        "lockstep.acquire",
        {
          kind: "client",
          captureStackTrace: false,
          attributes: { "lockstep.key": spec.key, "lockstep.kind": spec.kind, "lockstep.permits": permits }
        },
        observed
      )
  )
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
 * error) or the deadline passed (`LockTimeout`). A single attempt (`timeoutMs` 0) is not retried:
 * it must not wait. The delays are interruptible.
 */
const attemptGrant = (
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined,
  retry: Retry,
  restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> => {
  if (retry === undefined || timeoutMs === 0) return attemptOnce(spec, permits, timeoutMs, restore)
  return Effect.flatMap(Effect.zip(Schedule.driver(retry), monotonicMillis), ([driver, startedAt]) => {
    const from = (left: number | undefined): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> =>
      // a closed backend never answers again: nothing to retry
      Effect.catchIf(attemptOnce(spec, permits, left, restore), (error): error is BackendError => error._tag === "BackendError" && !isBackendClosed(error), (error) =>
        Effect.matchEffect(restore(driver.next(error)), {
          onFailure: () => Effect.fail(error),
          onSuccess: () =>
            Effect.flatMap(monotonicMillis, (now) => {
              if (timeoutMs === undefined) return from(undefined)
              const rest = timeoutMs - (now - startedAt)
              return rest > 0
                ? from(rest)
                : Effect.fail(new LockTimeout({ key: spec.key, timeout: Duration.millis(timeoutMs) }))
            })
        }))
    return from(timeoutMs)
  })
}

const attemptOnce = (
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined,
  restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> =>
  // what the first attempt needs is read synchronously: this is the path every lock takes
  Effect.withFiberRuntime((fiber) => {
      const clock = Context.get(fiber.currentDefaultServices, Clock.Clock)
      const mine = liveOn(fiber.getFiberRef(heldLeases), spec)
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
      let granted: Grant | undefined
      let stale = false
      {
        const attemptAt = (sentAt: number): Effect.Effect<AcquireResult, AttemptError> =>
          Effect.matchEffect(spec.backend.acquire(request), {
            onSuccess: (result): Effect.Effect<AcquireResult> => {
              if (result._tag === "Denied") return Effect.succeed(result)
              if (found !== undefined && result.fence !== found.fence) {
                // granted afresh (a writer taking the read lock of a key the backend forgot): the
                // hold being re-entered is gone; give the new grant back and start over
                stale = true
                return Effect.as(Effect.zipRight(found.lose("NotHeld"), cleanUpAttempt(spec, request)), result)
              }
              return Effect.map(attach(spec, request, result.fence, sentAt, found), (grant) => {
                granted = grant
                return result
              })
            },
            onFailure: (error): Effect.Effect<AcquireResult, AttemptError> => {
              switch (error._tag) {
                case "NotHeld": {
                  // the hold being re-entered is gone (or, for a new holder, refused as a late
                  // copy): start over as a new holder
                  stale = true
                  const denied: AcquireResult = { _tag: "Denied", retryAfterMs: 1 }
                  return found === undefined ? Effect.succeed(denied) : Effect.as(found.lose("NotHeld"), denied)
                }
                case "BackendError":
                  // the reply may have been lost after the backend granted (or queued) the request
                  return Effect.zipRight(cleanUpAttempt(spec, request), Effect.fail(error))
                default:
                  return Effect.fail(error)
              }
            }
          })
        const attempt = Effect.flatMap(monotonicMillis, attemptAt)

        const settle = (first: AcquireResult): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> => {
          if (first._tag === "Denied" && !stale && timeoutMs !== 0) {
            return Effect.flatMap(
              waitForGrant(spec, request, attempt, () => stale, startedAt, timeoutMs, restore),
              finish
            )
          }
          if (first._tag === "Denied" && !stale && spec.fair) {
            // a denied fair attempt queued us; a try-acquire must not stay in the queue
            return Effect.zipRight(cancel(spec, holder), Effect.suspend(finish))
          }
          return finish()
        }
        const finish = (): Effect.Effect<Option.Option<Grant>, AttemptError | LockTimeout> => {
          if (stale) {
            return Effect.flatMap(monotonicMillis, (now) => {
              // start over as a new holder, within what is left of the wait; like the first
              // attempt, each attempt runs uninterruptibly (only the waiting is restored), so an
              // interruption cannot cut a grant in flight loose from its release
              const left = timeoutMs === undefined || timeoutMs === 0 ? timeoutMs : Math.max(1, timeoutMs - (now - startedAt))
              return attemptOnce(spec, permits, left, restore)
            })
          }
          return Effect.succeed(Option.fromNullable(granted))
        }
        return Effect.flatMap(attemptAt(startedAt), settle)
      }
    })

const countIn = (held: Held, mode: HoldMode): number =>
  mode === "exclusive" ? held.counts.exclusive : held.counts.shared

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
 * or withLock's body) is the caller's business.
 */
const attach = (
  spec: LockSpec,
  request: AcquireRequest,
  fence: number,
  sentAt: number,
  found: Held | undefined
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
    return { lease, close }
  }
  if (found !== undefined && isLive(found)) {
    found.leases++
    return Effect.succeed(bind(found))
  }
  return Effect.map(startHeld(spec, request, fence, sentAt), bind)
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
    if (!leases.all.includes(record) && !leases.taken.includes(record)) return released
    return Effect.zipRight(
      FiberRef.set(heldLeases, {
        all: leases.all.filter((h) => h !== record && isLive(h)),
        taken: leases.taken.filter((h) => h !== record && isLive(h))
      }),
      released
    )
  })

/**
 * Subscribe, then retry; sleep until a wake-up, the blocking hold's expiry, the fair-queue
 * heartbeat or the caller's deadline, whichever is first; retry. Leaving without a grant drops
 * the fair-queue entry and (through the subscription's scope) hands any wake-up on.
 */
const waitForGrant = (
  spec: LockSpec,
  request: AcquireRequest,
  attempt: Effect.Effect<AcquireResult, AttemptError>,
  isStale: () => boolean,
  startedAt: number,
  timeoutMs: number | undefined,
  restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
): Effect.Effect<AcquireResult, AttemptError | LockTimeout> =>
  Effect.gen(function*() {
    const deadline = timeoutMs === undefined ? Infinity : startedAt + timeoutMs
    const subscription = yield* spec.backend.subscribe(spec.key, request.holder, spec.mode)
    // fair waiters refresh their queue entry well before it expires; every waiter tries again at
    // least once per waiter timeout, so a wake-up lost with a crashed waiter (or a network) delays
    // the others by that much at most, never by the blocking lease
    const heartbeatMs = Math.max(1, Math.floor(spec.fair ? spec.waiterTtlMs / 3 : spec.waiterTtlMs))
    while (true) {
      const result = yield* attempt
      if (result._tag === "Granted" || isStale()) return result
      const now = yield* monotonicMillis
      if (now >= deadline) {
        return yield* Effect.fail(new LockTimeout({ key: spec.key, timeout: Duration.millis(timeoutMs ?? Infinity) }))
      }
      yield* restore(awaitWakeUp(subscription, result.retryAfterMs, heartbeatMs, deadline - now))
    }
  }).pipe(
    Effect.scoped,
    Effect.onExit((exit) => Exit.isSuccess(exit) || !spec.fair ? Effect.void : cancel(spec, request.holder))
  )

/** Releases one hold of the record's holder: its count in the lock's mode goes from `count` down by one. */
const release = (spec: LockSpec, record: Held, count: number): Effect.Effect<void> =>
  Effect.matchEffect(
    spec.backend.release({ key: spec.key, holder: record.holder, mode: spec.mode, count, leaseMs: record.leaseMs }),
    {
      onSuccess: () => Effect.void,
      onFailure: (error) => Effect.logWarning(`lockstep: release of "${spec.key}" by ${record.holder} failed`, error.message)
    }
  )

/**
 * One holder's live holds on one key, shared by all its leases (the outer one and re-entrant
 * ones, which may be released in any order), and the backend keeper's entry for it: the keeper
 * fails `lost` when the local deadline passes unconfirmed and (without a fixed lease) renews the
 * hold every watchdog / 3, moving the deadline on each confirmed renewal and failing `lost` when a
 * renewal reports the hold gone. Any other failure of a renewal is retried until the deadline
 * decides. Once lost, the hold is dead: the keeper forgets it, the bodies running under it are
 * interrupted and what may be left of it on the backend is released.
 */
class Held implements Entry {
  readonly backend: Service
  readonly key: string
  readonly reentrant: boolean
  /** The holder's hold counts as the backend was last told them: every request names them. */
  readonly counts = { exclusive: 0, shared: 0 }
  /** Permits of the shared hold, and the limit they count against. */
  readonly permits: number
  readonly limit: number
  readonly leaseMs: number
  /** The `withLock` bodies running under the hold: interrupted when it is lost. */
  readonly bodies: Array<Fiber.RuntimeFiber<unknown, unknown>> = []
  /** Open leases; at 0 the record is done and a later grant starts a new holder. */
  leases = 1
  /** Set once `lost` has failed: the hold is gone, nothing may re-enter or renew it. */
  dead = false
  // the keeper's entry
  readonly watchdogMs: number | undefined
  /** The local deadline (monotonic ms): past it, unconfirmed, the hold is lost. */
  deadline: number
  confirmedAt: number
  attemptedAt = -Infinity
  renewing = false
  done = false
  at = Infinity
  index = -1
  /** Made when someone first waits on `lost`: most leases end without anyone asking. */
  private lostSignal: Deferred.Deferred<never, LockLost> | undefined = undefined
  private lostWith: LockLost | undefined = undefined

  constructor(
    readonly spec: LockSpec,
    readonly keeper: Keeper,
    readonly holder: string,
    /** The fence of the grant that started the record. */
    readonly fence: number,
    permits: number,
    leaseMs: number,
    sentAt: number
  ) {
    this.backend = spec.backend
    this.key = spec.key
    this.reentrant = spec.reentrant
    this.permits = spec.mode === "shared" ? permits : 0
    this.limit = spec.limit
    this.leaseMs = leaseMs
    this.watchdogMs = spec.leaseMs === undefined ? spec.watchdogMs : undefined
    // measured from before the granted request was sent, less the drift allowance, so it never
    // outlasts the backend's expiry
    this.deadline = sentAt + leaseMs - driftMs(leaseMs)
    this.confirmedAt = sentAt
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

  /** The keeper and the held-leases gauge let go of the record once, however it ends. */
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

/** Starts a holder's record and hands it to the backend's keeper. */
const startHeld = (spec: LockSpec, request: AcquireRequest, fence: number, sentAt: number): Effect.Effect<Held> =>
  Effect.suspend(() => {
    const held = new Held(spec, keeperOf(spec.backend), request.holder, fence, request.permits, request.leaseMs, sentAt)
    metrics.recordHeld(spec.labels, 1)
    return Effect.as(held.keeper.add(held), held)
  })
