/**
 * `Lock`: a re-entrant distributed mutex, and the functions that work on every lock handle
 * (`Lock`, `FairLock`, and the read and write views of a `ReadWriteLock`).
 *
 * - `acquire` is the scoped form: it yields a `Lease` and releases it when the scope closes —
 *   exactly once, on success, failure or interruption. `Effect.scoped` around it is the normal use.
 * - `withLock` runs an effect while holding the lock and interrupts it with `LockLost` if the
 *   lease is lost.
 * - Without a fixed `lease`, a watchdog renews the lease every `watchdog / 3` (default watchdog:
 *   30 seconds) for as long as the scope is open.
 * - Re-entrant per fiber: the fiber that acquired (and the body of its `withLock`) re-enters: hold
 *   count + 1, same fence. A fiber it forks does not hold the lock and waits like any other, so
 *   concurrent children never share the critical section, and fibers run on a runtime built from
 *   a layer that acquired a lock do not hold it. A lease acquired in a child that is then joined
 *   (as `Effect.timeout` or `Effect.all` do) passes to the joining fiber.
 * - A request that could only be granted once the current fiber released a hold of its own on the
 *   key fails at once with `SelfDeadlock`.
 *
 * @since 0.1.0
 */
import type { Duration, Option, Pipeable, Schedule, Scope } from "effect"
import { Effect } from "effect"
import { dual } from "effect/Function"
import type { HolderState } from "./LockBackend.js"
import type { LockBackend } from "./LockBackend.js"
import type { AcquireError, BackendError, InvalidLockOptions, LockLost } from "./LockError.js"
import type { Lease } from "./Lease.js"
import * as handle from "./internal/handle.js"
import * as internal from "./internal/lock.js"
import type { Body } from "./internal/spec.js"
import { isBody } from "./internal/spec.js"

/**
 * The brand of a lock handle: `isLock` checks for it.
 *
 * @since 0.1.0
 * @category symbols
 */
export const TypeId: unique symbol = internal.TypeId

/**
 * The type of `TypeId`.
 *
 * @since 0.1.0
 * @category symbols
 */
export type TypeId = typeof TypeId

/**
 * A handle on a named lock. Handles are cheap values; the lock itself lives in the backend.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   console.log(lock.key, lock.kind) // "orders:42" "Lock"
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Lock extends Pipeable.Pipeable {
  readonly [TypeId]: TypeId
  readonly key: string
  readonly kind: "Lock" | "FairLock" | "ReadLock" | "WriteLock"
}

/**
 * Options of a lock handle.
 *
 * @example
 * ```ts
 * import { Lock } from "@lockstep/core"
 *
 * const options: Lock.Options = { lease: "10 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * A fixed lease: the lock expires this long after it was granted, however long the holder runs,
   * and no watchdog renews it. `lost` fails when it expires.
   */
  readonly lease?: Duration.DurationInput | undefined
  /** Without a fixed lease: the lease the watchdog keeps renewing every `watchdog / 3`. Default 30 seconds. */
  readonly watchdog?: Duration.DurationInput | undefined
  /**
   * A waiter that hears nothing tries again after this long at the latest (a wake-up can be lost
   * with a crashed waiter); a fair lock's queued waiter's entry lives this long without a
   * heartbeat, so a crashed waiter holds its place no longer. Default 5 seconds.
   */
  readonly waiterTimeout?: Duration.DurationInput | undefined
  /**
   * A name for the handle's metrics (label `name`), e.g. `"orders"` for every `orders:<id>` lock.
   * Metrics never carry the key itself: keys are unbounded. Spans carry the key.
   */
  readonly name?: string | undefined
}

/**
 * Options of one acquisition.
 *
 * @example
 * ```ts
 * import { Lock } from "@lockstep/core"
 *
 * const options: Lock.AcquireOptions = { timeout: "5 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface AcquireOptions {
  /** How long to wait for the lock before failing with `LockTimeout` (positive). Default: wait forever. */
  readonly timeout?: Duration.DurationInput | undefined
  /**
   * What to do when a backend call fails (`BackendError`: the backend is unreachable, a command
   * timed out) while acquiring: try again after each of this schedule's delays, which start over
   * once the backend answers, within the `timeout`. When the schedule ends, the acquisition fails
   * with that `BackendError`. Default: fail at the first one. (Each call's own limit is the
   * backend's `commandTimeout`.)
   */
  readonly retry?: Schedule.Schedule<unknown, BackendError> | undefined
}

/**
 * Options of an acquisition that gives up rather than wait: `tryAcquire`, `withLockIfAvailable`.
 *
 * @example
 * ```ts
 * import { Lock } from "@lockstep/core"
 *
 * const options: Lock.TryAcquireOptions = { wait: "200 millis" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface TryAcquireOptions {
  /** Wait at most this long (positive) for the lock, then give up with `None`. Default: one attempt, no wait. */
  readonly wait?: Duration.DurationInput | undefined
  /** As for `acquire`: retry a `BackendError` on this schedule, within `wait`. */
  readonly retry?: Schedule.Schedule<unknown, BackendError> | undefined
}

/**
 * Is `u` a lock handle?
 *
 * @example
 * ```ts
 * import { Lock } from "@lockstep/core"
 *
 * console.log(Lock.isLock({})) // false
 * ```
 *
 * @since 0.1.0
 * @category guards
 */
export const isLock = (u: unknown): u is Lock => typeof u === "object" && u !== null && TypeId in u

/**
 * A re-entrant mutex on `key`. Fails with `InvalidLockOptions` for a bad key or option, before
 * any backend call.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   yield* Effect.log("exclusive").pipe(Lock.withLock(lock))
 * }).pipe(Effect.provide(MemoryBackend.layer))
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (key: string, options?: Options): Effect.Effect<Lock, InvalidLockOptions, LockBackend> =>
  Effect.map(handle.makeSpec("Lock", key, options, { mode: "exclusive", limit: 1, fair: false }), internal.fromSpec)

/**
 * Waits for the lock and yields its `Lease`; the lease is released when the scope closes.
 * With `timeout` (positive; use `tryAcquire` for no wait), fails with `LockTimeout` if the lock is
 * not granted in time. An interruption while waiting leaves nothing behind.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   const lease = yield* Lock.acquire(lock, { timeout: "5 seconds" })
 *   yield* Effect.log(`fence ${lease.fence}`)
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const acquire = (lock: Lock, options?: AcquireOptions): Effect.Effect<Lease, AcquireError, Scope.Scope> =>
  handle.acquire(internal.specOf(lock), 1, options)

/**
 * One attempt, no waiting: `Some(lease)` if the lock was free (or is re-entered), `None` if not.
 * With `wait`, waits at most that long for it (Redisson's `tryLock(waitTime, ...)`).
 *
 * @example
 * ```ts
 * import { Effect, Option } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("cron:cleanup")
 *   const lease = yield* Lock.tryAcquire(lock)
 *   if (Option.isNone(lease)) return yield* Effect.log("someone else runs it")
 *   yield* Effect.log("running cleanup")
 *   // or wait a little for it
 *   const later = yield* Lock.tryAcquire(lock, { wait: "100 millis" })
 *   yield* Effect.log(Option.isSome(later) ? "got it" : "still taken")
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const tryAcquire = (
  lock: Lock,
  options?: TryAcquireOptions
): Effect.Effect<Option.Option<Lease>, Exclude<AcquireError, { _tag: "LockTimeout" }>, Scope.Scope> =>
  handle.tryAcquire(internal.specOf(lock), 1, options)

/**
 * Runs an effect while holding the lock, then releases it. The effect is interrupted with
 * `LockLost` if the lease is lost; scoped resources it opens are closed before the release.
 * The body runs on a fiber of its own: the caller's fiber refs afterwards are those of a scoped
 * fork and join of the body (what it sets, it passes on; what its scope restores stays restored).
 * The body may be a function of the `Lease`, to read its fence or `expiresIn`.
 * Pipeable (`effect.pipe(Lock.withLock(lock))`) and data-first (`Lock.withLock(effect, lock)`).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   yield* Effect.log("in the critical section").pipe(Lock.withLock(lock, { timeout: "5 seconds" }))
 *   yield* Lock.withLock(Effect.log("again"), lock)
 *   // the body sees its lease: pass the fence to the resource you protect
 *   yield* Lock.withLock((lease) => Effect.log(`writing with fence ${lease.fence}`), lock)
 * })
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const withLock: {
  (lock: Lock, options?: AcquireOptions): <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>)
  ) => Effect.Effect<A, E | AcquireError | LockLost, Exclude<R, Scope.Scope>>
  <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>),
    lock: Lock,
    options?: AcquireOptions
  ): Effect.Effect<A, E | AcquireError | LockLost, Exclude<R, Scope.Scope>>
} = dual(
  (args) => isBody(args[0]),
  <A, E, R>(self: Body<A, E, R>, lock: Lock, options?: AcquireOptions) =>
    handle.withLease(self, internal.specOf(lock), 1, options)
)

/**
 * Runs the effect only if the lock is free (or within `wait`): `Some` of its result, or `None`
 * without running it — Effect's `Semaphore.withPermitsIfAvailable` for a distributed lock. Like
 * `withLock`, the body is interrupted with `LockLost` if the lease is lost, and may be a function
 * of the lease.
 *
 * @example
 * ```ts
 * import { Effect, Option } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("cron:cleanup")
 *   const ran = yield* Effect.succeed("cleaned").pipe(Lock.withLockIfAvailable(lock))
 *   if (Option.isNone(ran)) yield* Effect.log("another process runs it")
 * })
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const withLockIfAvailable: {
  (lock: Lock, options?: TryAcquireOptions): <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>)
  ) => Effect.Effect<Option.Option<A>, E | Exclude<AcquireError, { _tag: "LockTimeout" }> | LockLost, Exclude<R, Scope.Scope>>
  <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>),
    lock: Lock,
    options?: TryAcquireOptions
  ): Effect.Effect<Option.Option<A>, E | Exclude<AcquireError, { _tag: "LockTimeout" }> | LockLost, Exclude<R, Scope.Scope>>
} = dual(
  (args) => isBody(args[0]),
  <A, E, R>(self: Body<A, E, R>, lock: Lock, options?: TryAcquireOptions) =>
    handle.withLeaseIfAvailable(self, internal.specOf(lock), 1, options)
)

/**
 * Does the current fiber hold the lock (see re-entrancy above), with a lease whose local deadline
 * has not passed? Answered from the fiber's own records, without a backend call: use it for
 * assertions in code that must run under the lock. (For the backend's view, `holdCount`.)
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   const inside = yield* Lock.withLock(Lock.isHeldByCurrentFiber(lock), lock) // true
 *   const outside = yield* Lock.isHeldByCurrentFiber(lock) // false
 * })
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const isHeldByCurrentFiber = (lock: Lock): Effect.Effect<boolean> => handle.isHeldByCurrentFiber(internal.specOf(lock))

/**
 * Is the lock held by anyone? For a read lock: by any reader; for a write lock: by a writer.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.flatMap(Lock.make("orders:42"), Lock.isLocked)
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const isLocked = (lock: Lock): Effect.Effect<boolean, BackendError> =>
  Effect.map(handle.holders(internal.specOf(lock)), (holders) => holders.length > 0)

/**
 * How many times the current fiber's holder identity (see re-entrancy above) holds the lock, 0 if
 * it does not.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   return yield* Lock.holdCount(lock).pipe(Lock.withLock(lock), Lock.withLock(lock)) // 2
 * })
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const holdCount = (lock: Lock): Effect.Effect<number, BackendError> => handle.holdCount(internal.specOf(lock))

/**
 * The longest remaining time-to-live among the lock's holders, on the backend's clock.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.flatMap(Lock.make("orders:42"), Lock.remainingTtl)
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const remainingTtl = (lock: Lock): Effect.Effect<Option.Option<Duration.Duration>, BackendError> =>
  handle.remainingTtl(internal.specOf(lock))

/**
 * The lock's live holders.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.flatMap(Lock.make("orders:42"), Lock.holders)
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const holders = (lock: Lock): Effect.Effect<ReadonlyArray<HolderState>, BackendError> =>
  handle.holders(internal.specOf(lock))

/**
 * Drops every holder of the lock's key (an administrative escape hatch: the dropped holders learn
 * of it at their next renewal). `true` if anything was held.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.flatMap(Lock.make("stuck-job"), Lock.forceUnlock)
 * ```
 *
 * @since 0.1.0
 * @category administration
 */
export const forceUnlock = (lock: Lock): Effect.Effect<boolean, BackendError> =>
  Effect.suspend(() => internal.specOf(lock).backend.forceRelease({ key: lock.key, id: crypto.randomUUID() }))
