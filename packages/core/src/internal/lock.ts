import { Clock, Scope, Deferred, Duration, Effect, Exit, FiberRef, GlobalValue, HashMap, Option } from "effect"
import type { Lease } from "../Lease.js"
import type { AcquireRequest, AcquireResult, HoldMode, Service } from "../LockBackend.js"
import type { BackendError, InvalidLockOptions, LockUpgradeNotSupported } from "../LockError.js"
import { LockLost, LockTimeout } from "../LockError.js"

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
  /** Re-entrant kinds share one holder identity per fiber lineage; semaphores take a fresh one per acquisition. */
  readonly reentrant: boolean
  /** A fixed lease in ms, or `undefined` for a watchdog-renewed lease. */
  readonly leaseMs: number | undefined
  readonly watchdogMs: number
  readonly waiterTtlMs: number
}

export const defaultWatchdogMs = 30_000
export const defaultWaiterTtlMs = 5_000

/**
 * One holder's live holds on one key, shared by all its leases (the outer one and re-entrant
 * ones, which may be released in any order). The watchdog runs in `scope` for as long as any of
 * them is open.
 */
interface Held {
  readonly holder: string
  /** The fence of the grant that started the record: a re-entrant grant with another fence is not one. */
  readonly fence: number
  readonly lost: Effect.Effect<never, LockLost>
  readonly expiresIn: Effect.Effect<Duration.Duration>
  readonly scope: Scope.CloseableScope
  /** Open leases; at 0 the record is done and a later grant to the same holder starts a new one. */
  leases: number
  /** Set once `lost` has failed: the hold is gone, so nothing may re-enter it. */
  dead: boolean
  /** Fails `lost` (once) and marks the record dead. */
  readonly lose: (reason: LockLost["reason"]) => Effect.Effect<void>
}

const isLive = (held: Held): boolean => held.leases > 0 && !held.dead

/**
 * Holds of the current fiber and of the fibers it forked while holding them, by backend instance
 * and key (`all`). A child gets a copy; a joining child (`Effect.timeout`, `Effect.all`,
 * `Fiber.join`) hands the holds it took itself (`taken`, so a join costs what the child took, not
 * what the parent holds) to the parent, whose scope usually owns them, without overriding the
 * parent's own live ones.
 */
interface HeldLeases {
  readonly all: HashMap.HashMap<string, Held>
  readonly taken: HashMap.HashMap<string, Held>
}

const heldLeases = GlobalValue.globalValue(
  Symbol.for("@lockstep/core/heldLeases"),
  () =>
    FiberRef.unsafeMake<HeldLeases>({ all: HashMap.empty(), taken: HashMap.empty() }, {
      fork: (parent) => (HashMap.isEmpty(parent.taken) ? parent : { all: parent.all, taken: HashMap.empty() }),
      join: (parent, child) =>
        HashMap.reduce(child.taken, parent, (merged, held, id) =>
          isLive(held) && !Option.exists(HashMap.get(merged.all, id), isLive)
            ? { all: HashMap.set(merged.all, id, held), taken: HashMap.set(merged.taken, id, held) }
            : merged)
    })
)

const holderCounter = GlobalValue.globalValue(Symbol.for("@lockstep/core/holderCounter"), () => ({ next: 0 }))

const heldId = (spec: LockSpec): string => `${spec.backend.clientId}\u0000${spec.key}`

const liveHeld = (spec: LockSpec): Effect.Effect<Option.Option<Held>> =>
  spec.reentrant
    ? Effect.map(FiberRef.get(heldLeases), (held) => Option.filter(HashMap.get(held.all, heldId(spec)), isLive))
    : Effect.succeed(Option.none())

/** The holder identity of the current fiber for this lock, if it holds it. */
export const currentHolder = (spec: LockSpec): Effect.Effect<Option.Option<string>> =>
  Effect.map(liveHeld(spec), Option.map((h) => h.holder))

/** Monotonic milliseconds from Effect's Clock (hrtime-based live, driven by TestClock in tests). */
const monotonicMillis = Effect.map(Clock.currentTimeNanos, (nanos) => Number(nanos) / 1_000_000)

export type AttemptError = BackendError | InvalidLockOptions | LockUpgradeNotSupported

/**
 * Acquires a lease into the current scope. `timeoutMs`: `undefined` waits forever, `0` makes a
 * single attempt (try-acquire). Grants and the registration of their release are one
 * uninterruptible step; only the waiting in between is interruptible, so an interruption never
 * leaks a grant.
 */
export const acquire = (
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined
): Effect.Effect<Option.Option<Lease>, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      const found = yield* liveHeld(spec)
      const holder = Option.isSome(found) ? found.value.holder : `${spec.backend.clientId}:${++holderCounter.next}`
      const request: AcquireRequest = {
        key: spec.key,
        holder,
        mode: spec.mode,
        permits,
        limit: spec.limit,
        leaseMs: spec.leaseMs ?? spec.watchdogMs,
        fair: spec.fair,
        waiterTtlMs: spec.waiterTtlMs
      }
      const startedAt = yield* monotonicMillis
      let granted: Lease | undefined
      let stale = false
      // a grant and the registration of its release happen in one uninterruptible step
      const attempt = Effect.flatMap(monotonicMillis, (sentAt) =>
        Effect.tap(spec.backend.acquire(request), (result) => {
          if (result._tag === "Denied") return Effect.void
          if (Option.isSome(found) && result.fence !== found.value.fence) {
            // the backend granted afresh: the hold being re-entered was lost in the meantime
            stale = true
            return Effect.zipRight(found.value.lose("NotHeld"), release(spec, holder))
          }
          return Effect.map(attach(spec, request, result.fence, sentAt, scope, found), (lease) => {
            granted = lease
          })
        })).pipe(
          // a fair attempt whose reply was lost may have queued us
          spec.fair ? Effect.tapError(() => Effect.ignore(spec.backend.cancel(spec.key, holder))) : (e) => e
        )

      const first = yield* attempt
      if (first._tag === "Denied" && timeoutMs !== 0) {
        yield* waitForGrant(spec, request, attempt, startedAt, timeoutMs, restore)
      } else if (first._tag === "Denied" && spec.fair) {
        // a denied fair attempt queued us; a try-acquire must not stay in the queue
        yield* spec.backend.cancel(spec.key, holder)
      }
      if (stale) {
        // start over as a new holder, within what is left of the wait
        const elapsed = (yield* monotonicMillis) - startedAt
        const left = timeoutMs === undefined || timeoutMs === 0 ? timeoutMs : Math.max(1, timeoutMs - elapsed)
        return yield* restore(acquire(spec, permits, left))
      }
      return Option.fromNullable(granted)
    })
  ).pipe(Effect.withSpan("lockstep.acquire", { attributes: { key: spec.key, mode: spec.mode, permits } }))

/**
 * Binds a grant to the lease's scope: joins the holder's live record (re-entry) or starts a new
 * one with its watchdog, and registers the release. The last lease of a record to close stops the
 * watchdog; every lease releases its own hold.
 */
const attach = (
  spec: LockSpec,
  request: AcquireRequest,
  fence: number,
  sentAt: number,
  scope: Scope.Scope,
  found: Option.Option<Held>
): Effect.Effect<Lease> =>
  Effect.gen(function*() {
    let held: Held
    if (Option.isSome(found) && isLive(found.value)) {
      held = found.value
      held.leases++
    } else {
      held = yield* startHeld(spec, request, fence, sentAt)
      if (spec.reentrant) {
        const id = heldId(spec)
        yield* FiberRef.update(heldLeases, (leases) => ({
          all: HashMap.set(leases.all, id, held),
          taken: HashMap.set(leases.taken, id, held)
        }))
      }
    }
    const record = held
    yield* Scope.addFinalizer(
      scope,
      Effect.suspend(() => {
        record.leases--
        const stop = record.leases === 0
          ? Effect.zipRight(
            Scope.close(record.scope, Exit.void),
            FiberRef.update(heldLeases, (leases) =>
              Option.exists(HashMap.get(leases.all, heldId(spec)), (h) => h === record)
                ? { all: HashMap.remove(leases.all, heldId(spec)), taken: HashMap.remove(leases.taken, heldId(spec)) }
                : leases)
          )
          : Effect.void
        return Effect.zipRight(stop, release(spec, request.holder))
      })
    )
    return {
      key: spec.key,
      holder: request.holder,
      mode: spec.mode,
      permits: request.permits,
      fence,
      expiresIn: record.expiresIn,
      lost: record.lost
    }
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
  startedAt: number,
  timeoutMs: number | undefined,
  restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
): Effect.Effect<AcquireResult, AttemptError | LockTimeout> =>
  Effect.gen(function*() {
    const deadline = timeoutMs === undefined ? Infinity : startedAt + timeoutMs
    const subscription = yield* spec.backend.subscribe(spec.key, request.holder, spec.mode)
    // waiters refresh their fair-queue entry well before it expires
    const heartbeatMs = spec.fair ? Math.max(1, Math.floor(spec.waiterTtlMs / 3)) : Infinity
    while (true) {
      const result = yield* attempt
      if (result._tag === "Granted") return result
      const now = yield* monotonicMillis
      if (now >= deadline) {
        return yield* Effect.fail(new LockTimeout({ key: spec.key, timeout: Duration.millis(timeoutMs ?? Infinity) }))
      }
      const sleepMs = Math.max(1, Math.ceil(Math.min(result.retryAfterMs, heartbeatMs, deadline - now, maxSleepMs)))
      yield* restore(Effect.raceFirst(subscription.await, Effect.sleep(sleepMs)))
    }
  }).pipe(
    Effect.scoped,
    Effect.onExit((exit) =>
      Exit.isSuccess(exit) || !spec.fair ? Effect.void : Effect.ignore(spec.backend.cancel(spec.key, request.holder))
    )
  )

const release = (spec: LockSpec, holder: string): Effect.Effect<void> =>
  spec.backend.release({ key: spec.key, holder, mode: spec.mode }).pipe(
    Effect.asVoid,
    Effect.catchAll((error) =>
      Effect.logWarning(`lockstep: release of "${spec.key}" by ${holder} failed`, error.message)
    ),
    Effect.withSpan("lockstep.release", { attributes: { key: spec.key, mode: spec.mode } })
  )

/** Longest single sleep: Effect's clock never fires a timer set further out than 2^31 - 1 ms. */
export const maxSleepMs = 2 ** 31 - 1

/**
 * Time given away on every local deadline: the backend's clock may run faster than ours, and a
 * timer may fire late. 1% of the lease plus 5 ms, as Redisson's RedLock allows for clock drift.
 */
const driftMs = (leaseMs: number) => Math.floor(leaseMs / 100) + 5

/**
 * Starts a holder's record. Two fibers run in the record's own scope: a timer that fails `lost`
 * when the local deadline passes unconfirmed, and (without a fixed lease) the watchdog, which
 * renews every watchdog / 3, moves the deadline on each confirmed renewal, and fails `lost` when
 * a renewal reports the hold gone. Any other failure of a renewal, a defect included, is retried
 * until the deadline decides.
 */
const startHeld = (spec: LockSpec, request: AcquireRequest, fence: number, sentAt: number): Effect.Effect<Held> =>
  Effect.gen(function*() {
    const lost = yield* Deferred.make<never, LockLost>()
    // measured from before the granted request was sent, less the drift allowance, so it never
    // outlasts the backend's expiry
    let deadline = sentAt + request.leaseMs - driftMs(request.leaseMs)
    const expiresIn = Effect.map(monotonicMillis, (now) => Duration.millis(Math.max(0, deadline - now)))
    const scope = yield* Scope.make()
    const held: Held = {
      holder: request.holder,
      fence,
      lost: Deferred.await(lost),
      expiresIn,
      scope,
      leases: 1,
      dead: false,
      lose: (reason) =>
        Effect.suspend(() => {
          held.dead = true
          return Deferred.fail(lost, new LockLost({ key: spec.key, holder: request.holder, reason }))
        })
    }
    const fail = held.lose
    const sleepUntil = (at: number) =>
      Effect.flatMap(monotonicMillis, (now) => Effect.sleep(Duration.millis(Math.min(maxSleepMs, Math.max(0, at - now)))))

    const timer = Effect.gen(function*() {
      while ((yield* monotonicMillis) < deadline) yield* sleepUntil(deadline)
      yield* fail("DeadlinePassed")
    })
    const watchdog = Effect.gen(function*() {
      const intervalMs = spec.watchdogMs / 3
      // renewals fall on a grid shared by all leases with this watchdog, so a backend that
      // batches concurrent renewals sees them together
      const quantum = intervalMs / 4
      let confirmedAt = sentAt
      let attemptedAt = -Infinity
      while (true) {
        let next = Math.ceil((confirmedAt + intervalMs * 0.75) / quantum) * quantum
        // after a failed renewal, try again at the next grid point, never in a tight loop
        while (next <= attemptedAt) next += quantum
        yield* sleepUntil(next)
        attemptedAt = yield* monotonicMillis
        const renewed = yield* spec.backend.renew([{ key: spec.key, holder: request.holder, leaseMs: spec.watchdogMs }])
          .pipe(
            Effect.map((results) => Option.fromNullable(results[0])),
            Effect.catchAllCause(() => Effect.succeed(Option.none<boolean>()))
          )
        if (Option.isSome(renewed) && !renewed.value) return yield* fail("NotHeld")
        if (Option.isSome(renewed)) {
          confirmedAt = attemptedAt
          deadline = Math.max(deadline, attemptedAt + spec.watchdogMs - driftMs(spec.watchdogMs))
        }
      }
    })
    // forked from an uninterruptible region: both must stay interruptible so the scope can close
    yield* Effect.forkIn(Effect.interruptible(timer), scope)
    if (spec.leaseMs === undefined) yield* Effect.forkIn(Effect.interruptible(watchdog), scope)
    return held
  })
