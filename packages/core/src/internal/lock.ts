import {
  Clock,
  Deferred,
  Duration,
  Effect,
  Either,
  ExecutionStrategy,
  Exit,
  Fiber,
  FiberRef,
  GlobalValue,
  HashMap,
  Option,
  Scope
} from "effect"
import type { Lease } from "../Lease.js"
import type { AcquireRequest, AcquireResult, HoldMode, Service } from "../LockBackend.js"
import type { BackendError, InvalidLockOptions, LockUpgradeNotSupported } from "../LockError.js"
import { LockLost, LockTimeout, SelfDeadlock } from "../LockError.js"

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
  readonly reentrant: boolean
  /** The fence of the grant that started the record. */
  readonly fence: number
  /** The holder's hold counts as the backend was last told them: every request names them. */
  readonly counts: { exclusive: number; shared: number }
  /** Permits of the shared hold, and the limit they count against. */
  readonly permits: number
  readonly limit: number
  readonly leaseMs: number
  readonly lost: Effect.Effect<never, LockLost>
  readonly expiresIn: Effect.Effect<Duration.Duration>
  readonly scope: Scope.CloseableScope
  /** Open leases; at 0 the record is done and a later grant starts a new holder. */
  leases: number
  /** Set once `lost` has failed: the hold is gone, nothing may re-enter or renew it. */
  dead: boolean
  /** Fails `lost` (once), stops renewals and releases what may be left of the hold. */
  readonly lose: (reason: LockLost["reason"]) => Effect.Effect<void>
}

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
  readonly all: HashMap.HashMap<string, ReadonlyArray<Held>>
  readonly taken: HashMap.HashMap<string, ReadonlyArray<Held>>
}

const noLeases: HeldLeases = { all: HashMap.empty(), taken: HashMap.empty() }

const addHeld = (map: HashMap.HashMap<string, ReadonlyArray<Held>>, id: string, held: Held) =>
  HashMap.set(map, id, [...Option.getOrElse(HashMap.get(map, id), (): ReadonlyArray<Held> => []).filter(isLive), held])

const heldLeases = GlobalValue.globalValue(
  Symbol.for("@lockstep/core/heldLeases/perFiber"),
  () =>
    FiberRef.unsafeMake<HeldLeases>(noLeases, {
      fork: () => noLeases,
      join: (parent, child) =>
        HashMap.reduce(child.taken, parent, (merged, helds, id) =>
          helds.reduce((acc, held) => {
            const mine = Option.getOrElse(HashMap.get(acc.all, id), (): ReadonlyArray<Held> => [])
            // a parent's own live re-entrant hold wins over a child's
            if (!isLive(held) || mine.includes(held) || (held.reentrant && mine.some((h) => h.reentrant && isLive(h)))) {
              return acc
            }
            return { all: addHeld(acc.all, id, held), taken: addHeld(acc.taken, id, held) }
          }, merged))
    })
)

/**
 * Runs `effect` (in a fiber forked only to race it, as `withLock` does) with the current fiber's
 * holds, so it re-enters them as the current fiber would.
 */
export const withCurrentHolds = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<Effect.Effect<A, E, R>> =>
  Effect.map(FiberRef.get(heldLeases), (held) => Effect.locally(effect, heldLeases, { all: held.all, taken: HashMap.empty() }))

const holderCounter = GlobalValue.globalValue(Symbol.for("@lockstep/core/holderCounter"), () => ({ next: 0 }))

const heldId = (spec: LockSpec): string => `${spec.backend.clientId}\u0000${spec.key}`

/** The current fiber's live holds on the lock's key, of every kind. */
const liveHolds = (spec: LockSpec): Effect.Effect<ReadonlyArray<Held>> =>
  Effect.map(FiberRef.get(heldLeases), (held) =>
    Option.match(HashMap.get(held.all, heldId(spec)), { onNone: () => [], onSome: (helds) => helds.filter(isLive) }))

/** The holder identity of the current fiber for this lock, if it holds it. */
export const currentHolder = (spec: LockSpec): Effect.Effect<Option.Option<string>> =>
  Effect.map(liveHolds(spec), (helds) =>
    Option.map(Option.fromNullable(helds.find((h) => h.reentrant === spec.reentrant && spec.reentrant)), (h) => h.holder))

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

/** Monotonic milliseconds from Effect's Clock (hrtime-based live, driven by TestClock in tests). */
const monotonicMillis = Effect.map(Clock.currentTimeNanos, (nanos) => Number(nanos) / 1_000_000)

export type AttemptError = BackendError | InvalidLockOptions | LockUpgradeNotSupported | SelfDeadlock

/**
 * Acquires a lease into the current scope. `timeoutMs`: `undefined` waits forever, `0` makes a
 * single attempt (try-acquire). Each attempt runs uninterruptibly and its grant is bound to the
 * lease's scope in the same step; only the waiting in between is interruptible. An interruption
 * that arrived while a grant was in flight releases that grant at once, and an attempt whose
 * reply was lost is released best-effort: nothing is left held for a caller that has no lease.
 */
export const acquire = (
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined
): Effect.Effect<Option.Option<Lease>, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const scope = yield* Effect.scope
      const mine = yield* liveHolds(spec)
      const found = spec.reentrant ? mine.find((h) => h.reentrant) : undefined
      const deadlock = selfDeadlock(spec, permits, mine, found)
      if (deadlock !== undefined) return yield* Effect.fail(deadlock)
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
      // the lease's own scope, a child of the caller's: closing it early releases the grant
      const leaseScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
      const startedAt = yield* monotonicMillis
      let granted: Lease | undefined
      let stale = false
      const attempt = Effect.flatMap(monotonicMillis, (sentAt) =>
        spec.backend.acquire(request).pipe(
          Effect.tap((result) => {
            if (result._tag === "Denied") return Effect.void
            if (found !== undefined && result.fence !== found.fence) {
              // granted afresh (a writer taking the read lock of a key the backend forgot): the
              // hold being re-entered is gone; give the new grant back and start over
              stale = true
              return Effect.zipRight(found.lose("NotHeld"), cleanUpAttempt(spec, request))
            }
            return Effect.map(attach(spec, request, result.fence, sentAt, leaseScope, found), (lease) => {
              granted = lease
            })
          }),
          Effect.catchTags({
            // the hold being re-entered is gone (or, for a new holder, refused as a late copy):
            // start over as a new holder
            NotHeld: () => {
              stale = true
              const denied: AcquireResult = { _tag: "Denied", retryAfterMs: 1 }
              return found === undefined ? Effect.succeed(denied) : Effect.as(found.lose("NotHeld"), denied)
            },
            // the reply may have been lost after the backend granted (or queued) the request
            BackendError: (error) => Effect.zipRight(cleanUpAttempt(spec, request), Effect.fail(error))
          })
        ))

      const first = yield* attempt
      if (first._tag === "Denied" && !stale && timeoutMs !== 0) {
        yield* waitForGrant(spec, request, attempt, () => stale, startedAt, timeoutMs, restore)
      } else if (first._tag === "Denied" && !stale && spec.fair) {
        // a denied fair attempt queued us; a try-acquire must not stay in the queue
        yield* cancel(spec, holder)
      }
      if (stale) {
        yield* Scope.close(leaseScope, Exit.void)
        // start over as a new holder, within what is left of the wait
        const elapsed = (yield* monotonicMillis) - startedAt
        const left = timeoutMs === undefined || timeoutMs === 0 ? timeoutMs : Math.max(1, timeoutMs - elapsed)
        return yield* restore(acquire(spec, permits, left))
      }
      if (granted === undefined) {
        yield* Scope.close(leaseScope, Exit.void)
        return Option.none()
      }
      // an interruption that arrived while the grant was in flight: the caller gets no lease, so
      // the grant is released now rather than when the caller's scope closes
      yield* restore(Effect.void).pipe(Effect.onInterrupt(() => Scope.close(leaseScope, Exit.void)))
      return Option.some(granted)
    })
  ).pipe(Effect.withSpan("lockstep.acquire", { attributes: { key: spec.key, mode: spec.mode, permits } }))

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
  found: Held | undefined
): Effect.Effect<Lease> =>
  Effect.gen(function*() {
    let held: Held
    if (found !== undefined && isLive(found)) {
      held = found
      held.leases++
    } else {
      held = yield* startHeld(spec, request, fence, sentAt)
      const id = heldId(spec)
      yield* FiberRef.update(heldLeases, (leases) => ({
        all: addHeld(leases.all, id, held),
        taken: addHeld(leases.taken, id, held)
      }))
    }
    if (spec.mode === "exclusive") held.counts.exclusive = request.count
    else held.counts.shared = request.count
    const record = held
    yield* Scope.addFinalizer(
      scope,
      Effect.suspend(() => {
        record.leases--
        const count = countIn(record, spec.mode)
        if (spec.mode === "exclusive") record.counts.exclusive = Math.max(0, count - 1)
        else record.counts.shared = Math.max(0, count - 1)
        const stop = record.leases === 0
          ? Effect.zipRight(
            Scope.close(record.scope, Exit.void),
            FiberRef.update(heldLeases, (leases) => {
              const id = heldId(spec)
              const without = (map: HashMap.HashMap<string, ReadonlyArray<Held>>) =>
                Option.match(HashMap.get(map, id), {
                  onNone: () => map,
                  onSome: (helds) => {
                    const rest = helds.filter((h) => h !== record && isLive(h))
                    return rest.length === 0 ? HashMap.remove(map, id) : HashMap.set(map, id, rest)
                  }
                })
              return { all: without(leases.all), taken: without(leases.taken) }
            })
          )
          : Effect.void
        // a lost hold was released when it was lost
        return Effect.zipRight(stop, record.dead ? Effect.void : release(spec, record, count))
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
  isStale: () => boolean,
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
      if (result._tag === "Granted" || isStale()) return result
      const now = yield* monotonicMillis
      if (now >= deadline) {
        return yield* Effect.fail(new LockTimeout({ key: spec.key, timeout: Duration.millis(timeoutMs ?? Infinity) }))
      }
      const sleepMs = Math.max(1, Math.ceil(Math.min(result.retryAfterMs, heartbeatMs, deadline - now, maxSleepMs)))
      yield* restore(Effect.raceFirst(subscription.await, Effect.sleep(sleepMs)))
    }
  }).pipe(
    Effect.scoped,
    Effect.onExit((exit) => Exit.isSuccess(exit) || !spec.fair ? Effect.void : cancel(spec, request.holder))
  )

/** Releases one hold of the record's holder: its count in the lock's mode goes from `count` down by one. */
const release = (spec: LockSpec, record: Held, count: number): Effect.Effect<void> =>
  spec.backend.release({ key: spec.key, holder: record.holder, mode: spec.mode, count, leaseMs: record.leaseMs }).pipe(
    Effect.asVoid,
    Effect.catchAll((error) =>
      Effect.logWarning(`lockstep: release of "${spec.key}" by ${record.holder} failed`, error.message)
    ),
    Effect.withSpan("lockstep.release", { attributes: { key: spec.key, mode: spec.mode } })
  )

/** Longest single sleep: Effect's clock never fires a timer set further out than 2^31 - 1 ms. */
export const maxSleepMs = 2 ** 31 - 1

/**
 * Time given away on every local deadline: the backend's clock may run faster than ours, and a
 * timer may fire late. 1% of the lease plus 5 ms, as Redisson's RedLock allows for clock drift.
 */
export const driftMs = (leaseMs: number) => Math.floor(leaseMs / 100) + 5

/**
 * Starts a holder's record. Two fibers run in the record's own scope: a timer that fails `lost`
 * when the local deadline passes unconfirmed, and (without a fixed lease) the watchdog, which
 * renews every watchdog / 3, moves the deadline on each confirmed renewal, and fails `lost` when
 * a renewal reports the hold gone. Any other failure of a renewal, a defect included, is retried
 * until the deadline decides. Once lost, the hold is dead: the watchdog stops and what may be
 * left of the hold on the backend is released.
 */
const startHeld = (spec: LockSpec, request: AcquireRequest, fence: number, sentAt: number): Effect.Effect<Held> =>
  Effect.gen(function*() {
    const lost = yield* Deferred.make<never, LockLost>()
    // measured from before the granted request was sent, less the drift allowance, so it never
    // outlasts the backend's expiry
    let deadline = sentAt + request.leaseMs - driftMs(request.leaseMs)
    const expiresIn = Effect.map(monotonicMillis, (now) => Duration.millis(Math.max(0, deadline - now)))
    const scope = yield* Scope.make()
    let watchdogFiber: Fiber.RuntimeFiber<void> | undefined
    const held: Held = {
      holder: request.holder,
      reentrant: spec.reentrant,
      fence,
      counts: { exclusive: 0, shared: 0 },
      permits: spec.mode === "shared" ? request.permits : 0,
      limit: spec.limit,
      leaseMs: request.leaseMs,
      lost: Deferred.await(lost),
      expiresIn,
      scope,
      leases: 1,
      dead: false,
      lose: (reason) =>
        Effect.uninterruptible(Effect.suspend(() => {
          if (held.dead) return Effect.void
          held.dead = true
          const remnant = (["exclusive", "shared"] as const).filter((mode) => countIn(held, mode) > 0)
          return Effect.zipRight(
            Deferred.fail(lost, new LockLost({ key: spec.key, holder: request.holder, reason })),
            Effect.zipRight(
              watchdogFiber === undefined ? Effect.void : Fiber.interruptFork(watchdogFiber),
              // a release from count 1 ends the holder whatever its count was
              Effect.forEach(remnant, (mode) =>
                Effect.ignore(spec.backend.release({
                  key: spec.key,
                  holder: request.holder,
                  mode,
                  count: 1,
                  leaseMs: request.leaseMs
                })), { discard: true })
            )
          )
        }))
    }
    const sleepUntil = (at: number) =>
      Effect.flatMap(monotonicMillis, (now) => Effect.sleep(Duration.millis(Math.min(maxSleepMs, Math.max(0, at - now)))))

    const timer = Effect.gen(function*() {
      while ((yield* monotonicMillis) < deadline) yield* sleepUntil(deadline)
      yield* held.lose("DeadlinePassed")
    })
    const watchdog = Effect.gen(function*() {
      const intervalMs = spec.watchdogMs / 3
      // renewals fall on a grid shared by all leases with this watchdog, so a backend that
      // batches concurrent renewals sees them together
      const quantum = intervalMs / 4
      let confirmedAt = sentAt
      let attemptedAt = -Infinity
      while (!held.dead) {
        let next = Math.ceil((confirmedAt + intervalMs * 0.75) / quantum) * quantum
        // after a failed renewal, try again at the next grid point, never in a tight loop
        while (next <= attemptedAt) next += quantum
        yield* sleepUntil(next)
        if (held.dead) return
        attemptedAt = yield* monotonicMillis
        const renewed = yield* spec.backend.renew([{ key: spec.key, holder: request.holder, leaseMs: spec.watchdogMs }])
          .pipe(
            Effect.map((results) => Option.flatMap(Option.fromNullable(results[0]), Either.getRight)),
            Effect.catchAllCause(() => Effect.succeed(Option.none<boolean>()))
          )
        // a renewal that arrives after the deadline passed must not bring the lease back
        if (held.dead) return
        if (Option.isSome(renewed) && !renewed.value) return yield* held.lose("NotHeld")
        if (Option.isSome(renewed)) {
          confirmedAt = attemptedAt
          deadline = Math.max(deadline, attemptedAt + spec.watchdogMs - driftMs(spec.watchdogMs))
        }
      }
    })
    // forked from an uninterruptible region: both must stay interruptible so the scope can close
    yield* Effect.forkIn(Effect.interruptible(timer), scope)
    if (spec.leaseMs === undefined) watchdogFiber = yield* Effect.forkIn(Effect.interruptible(watchdog), scope)
    return held
  })
