/**
 * `MultiLock`: all of several locks at once, or none — Redisson's `RedissonMultiLock`. The parts
 * may come from different backends (two Redis servers, Redis and memory, ...): make each handle
 * under its own backend layer and combine the handles.
 *
 * - All or nothing: a waiting acquisition holds every part when it succeeds; on a failure, a
 *   timeout or an interruption, every part it took is released at once.
 * - One canonical order (by key): the parts are taken in it, each waited for while the ones
 *   before it are held, for at most `holdWhileWaiting` (1 second). Two multi-locks over
 *   overlapping sets therefore never wait for each other in a cycle: the one holding the first
 *   part they share goes on. Past the bound (a part held long), the multi-lock releases what it
 *   took and waits for that part holding nothing, then takes the others; no part is held longer
 *   than the bound while another is awaited.
 * - One lease: its `lost` fails as soon as any part's lease is lost, and `withLock` then
 *   interrupts its body with that `LockLost`. Each part keeps its own watchdog, renewed with the
 *   other leases of its backend.
 * - Re-entrant part by part, as each lock is: a fiber that holds a part re-enters it.
 *
 * @since 0.1.0
 */
import type { Pipeable, Scope } from "effect"
import { Duration, Effect, Option } from "effect"
import { dual } from "effect/Function"
import { pipeArguments } from "effect/Pipeable"
import type { Lease, LeaseState } from "./Lease.js"
import type * as Lock from "./Lock.js"
import type { AcquireError, InvalidLockOptions, LockLost } from "./LockError.js"
import * as handle from "./internal/handle.js"
import { specOf } from "./internal/lock.js"
import * as internal from "./internal/multiLock.js"
import type { LockSpec } from "./internal/spec.js"
import { isBody } from "./internal/spec.js"

/**
 * The brand of a `MultiLock` handle: `isMultiLock` checks for it.
 *
 * @since 0.1.0
 * @category symbols
 */
export const TypeId: unique symbol = Symbol.for("@lockstep/core/MultiLock")

/**
 * The type of `TypeId`.
 *
 * @since 0.1.0
 * @category symbols
 */
export type TypeId = typeof TypeId

/**
 * A handle on several locks taken together.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const both = yield* MultiLock.make(yield* Lock.make("account:1"), yield* Lock.make("account:2"))
 *   console.log(both.locks.map((lock) => lock.key)) // ["account:1", "account:2"]
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface MultiLock extends Pipeable.Pipeable {
  readonly [TypeId]: TypeId
  /** The parts, in the canonical order they are taken in. */
  readonly locks: ReadonlyArray<Lock.Lock>
}

/**
 * The lease of a multi-lock: every part's lease.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const both = yield* MultiLock.make(yield* Lock.make("account:1"), yield* Lock.make("account:2"))
 *   const lease = yield* MultiLock.acquire(both)
 *   yield* Effect.log(lease.parts.map((part) => `${part.key}: fence ${part.fence}`))
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface MultiLease {
  /** The parts' leases, in the multi-lock's order; each carries its own fence. */
  readonly parts: ReadonlyArray<Lease>
  /** The least time left among the parts. */
  readonly expiresIn: Effect.Effect<Duration.Duration>
  /** Fails with the first part's `LockLost`; never completes while every part is held. */
  readonly lost: Effect.Effect<never, LockLost>
  /** `Lost` if any part was lost, `Released` once every part was released, else `Held`. */
  readonly state: Effect.Effect<LeaseState>
}

/**
 * Options of one acquisition: those of `Lock.acquire`, for all the parts together. `timeout`
 * bounds the wait for every part; `retry` retries a `BackendError` of a part it waits for, as
 * `Lock.acquire` does, while a part it only tries (one before the part it waited for) is not
 * retried: its `BackendError` fails the acquisition, releasing the parts taken.
 *
 * @example
 * ```ts
 * import { MultiLock } from "@lockstep/core"
 *
 * const options: MultiLock.AcquireOptions = { timeout: "5 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type AcquireOptions = Lock.AcquireOptions

/**
 * Options of an acquisition that gives up rather than wait: `tryAcquire`, `withLockIfAvailable`.
 * Without `wait`: one round, no waiting; with it, at most that long for all the parts.
 *
 * @example
 * ```ts
 * import { MultiLock } from "@lockstep/core"
 *
 * const options: MultiLock.TryAcquireOptions = { wait: "200 millis" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type TryAcquireOptions = Lock.TryAcquireOptions

class MultiLockImpl implements MultiLock {
  readonly [TypeId]: TypeId = TypeId
  constructor(readonly locks: ReadonlyArray<Lock.Lock>, readonly specs: ReadonlyArray<LockSpec>) {}
  pipe() {
    // eslint-disable-next-line prefer-rest-params
    return pipeArguments(this, arguments)
  }
  toString(): string {
    return `MultiLock(${this.locks.map(String).join(", ")})`
  }
}

const specsOf = (self: MultiLock): ReadonlyArray<LockSpec> => (self as MultiLockImpl).specs

const multiLease = (leases: ReadonlyArray<Lease>): MultiLease => ({
  parts: leases,
  expiresIn: internal.expiresInOf(leases),
  lost: internal.lostOf(leases),
  state: internal.stateOf(leases)
})

/**
 * How long a multi-lock waits for a part while holding the parts before it, before it releases
 * them and waits for that part alone.
 *
 * @example
 * ```ts
 * import { Duration } from "effect"
 * import { MultiLock } from "@lockstep/core"
 *
 * console.log(Duration.toMillis(MultiLock.holdWhileWaiting)) // 1000
 * ```
 *
 * @since 0.1.0
 * @category constants
 */
export const holdWhileWaiting: Duration.Duration = Duration.millis(internal.holdWhileWaitingMs)

/**
 * Is `u` a multi-lock?
 *
 * @example
 * ```ts
 * import { MultiLock } from "@lockstep/core"
 *
 * console.log(MultiLock.isMultiLock({})) // false
 * ```
 *
 * @since 0.1.0
 * @category guards
 */
export const isMultiLock = (u: unknown): u is MultiLock => typeof u === "object" && u !== null && TypeId in u

/**
 * All of `locks` together. Each handle keeps the backend and options it was made with. Fails with
 * `InvalidLockOptions` for no locks, or for the read and the write view of one key.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const program = Effect.gen(function* () {
 *   const from = yield* Lock.make("account:1")
 *   const to = yield* Lock.make("account:2")
 *   const both = yield* MultiLock.make(from, to)
 *   yield* Effect.log("transfer").pipe(MultiLock.withLock(both))
 * }).pipe(Effect.provide(MemoryBackend.layer))
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (...locks: ReadonlyArray<Lock.Lock>): Effect.Effect<MultiLock, InvalidLockOptions> =>
  Effect.suspend(() => {
    const specs = locks.map(specOf)
    const invalid = internal.invalidParts(specs)
    if (invalid !== undefined) return Effect.fail(invalid)
    const ordered = internal.canonicalOrder(specs)
    return Effect.succeed(new MultiLockImpl(ordered.map((spec) => locks[specs.indexOf(spec)]!), ordered))
  })

/**
 * Waits for every part and yields the `MultiLease`; the parts are released when the scope closes.
 * With `timeout` (positive; use `tryAcquire` for no wait), fails with `LockTimeout` (naming the
 * part it was waiting for) if they are not all granted in time. A failure or an interruption
 * leaves nothing held.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const both = yield* MultiLock.make(yield* Lock.make("account:1"), yield* Lock.make("account:2"))
 *   const lease = yield* MultiLock.acquire(both, { timeout: "5 seconds" })
 *   yield* Effect.log(`held for ${lease.parts.length} keys`)
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const acquire = (self: MultiLock, options?: AcquireOptions): Effect.Effect<MultiLease, AcquireError, Scope.Scope> =>
  Effect.flatMap(handle.waitingOf(options), (waiting) =>
    Effect.flatMap(Effect.scope, (scope) =>
      Effect.flatMap(internal.acquireAll(specsOf(self), waiting, scope), (parts) =>
        Option.isSome(parts)
          ? Effect.succeed(multiLease(parts.value.leases))
          // only a single round ends without the parts or a LockTimeout, and this never makes one
          : Effect.dieMessage("lockstep: a waiting acquisition ended without a lease"))))

/**
 * One round, no waiting: `Some(lease)` if every part was free (or is re-entered), `None` (holding
 * nothing) if any was not. With `wait`, waits at most that long for all of them, as `acquire`
 * would, then gives up with `None`.
 *
 * @example
 * ```ts
 * import { Effect, Option } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const both = yield* MultiLock.make(yield* Lock.make("job:a"), yield* Lock.make("job:b"))
 *   const lease = yield* MultiLock.tryAcquire(both)
 *   if (Option.isNone(lease)) return yield* Effect.log("busy")
 *   yield* Effect.log("running both jobs")
 *   // or wait a little for them
 *   const later = yield* MultiLock.tryAcquire(both, { wait: "100 millis" })
 *   yield* Effect.log(Option.isSome(later) ? "got them" : "still taken")
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const tryAcquire = (
  self: MultiLock,
  options?: TryAcquireOptions
): Effect.Effect<Option.Option<MultiLease>, Exclude<AcquireError, { _tag: "LockTimeout" }>, Scope.Scope> =>
  Effect.flatMap(handle.tryingOf(options), (waiting) =>
    Effect.flatMap(Effect.scope, (scope) =>
      Effect.map(
        // past `wait`, the parts taken are released and the answer is None
        Effect.catchTag(internal.acquireAll(specsOf(self), waiting, scope), "LockTimeout", () => Effect.succeedNone),
        (parts) => Option.map(parts, (held) => multiLease(held.leases))
      )))

/**
 * Runs an effect while holding every part, then releases them. The effect is interrupted with
 * `LockLost` as soon as any part is lost; scoped resources it opens are closed before the
 * release. The body may be a function of the `MultiLease` (each part's fence). Pipeable and
 * data-first.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const both = yield* MultiLock.make(yield* Lock.make("account:1"), yield* Lock.make("account:2"))
 *   yield* Effect.log("transfer").pipe(MultiLock.withLock(both, { timeout: "5 seconds" }))
 *   yield* MultiLock.withLock(Effect.log("again"), both)
 *   yield* MultiLock.withLock((lease) => Effect.log(lease.parts.map((part) => part.fence)), both)
 * })
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const withLock: {
  (self: MultiLock, options?: AcquireOptions): <A, E, R>(
    effect: Effect.Effect<A, E, R> | ((lease: MultiLease) => Effect.Effect<A, E, R>)
  ) => Effect.Effect<A, E | AcquireError | LockLost, Exclude<R, Scope.Scope>>
  <A, E, R>(
    effect: Effect.Effect<A, E, R> | ((lease: MultiLease) => Effect.Effect<A, E, R>),
    self: MultiLock,
    options?: AcquireOptions
  ): Effect.Effect<A, E | AcquireError | LockLost, Exclude<R, Scope.Scope>>
} = dual(
  (args) => isBody(args[0]),
  <A, E, R>(
    effect: Effect.Effect<A, E, R> | ((lease: MultiLease) => Effect.Effect<A, E, R>),
    self: MultiLock,
    options?: AcquireOptions
  ) =>
    Effect.flatMap(handle.waitingOf(options), (waiting) =>
      internal.withAll(
        typeof effect === "function" ? (leases: ReadonlyArray<Lease>) => effect(multiLease(leases)) : effect,
        specsOf(self),
        waiting
      ))
)

/**
 * Runs the effect only if every part is free (or within `wait`): `Some` of its result, or `None`
 * without running it, holding nothing. Like `withLock`, the body is interrupted with `LockLost`
 * if any part is lost, and may be a function of the `MultiLease`. Pipeable and data-first.
 *
 * @example
 * ```ts
 * import { Effect, Option } from "effect"
 * import { Lock, MultiLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const both = yield* MultiLock.make(yield* Lock.make("job:a"), yield* Lock.make("job:b"))
 *   const ran = yield* Effect.succeed("done").pipe(MultiLock.withLockIfAvailable(both))
 *   if (Option.isNone(ran)) yield* Effect.log("another process runs them")
 *   yield* MultiLock.withLockIfAvailable(Effect.log("waited a little"), both, { wait: "100 millis" })
 * })
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const withLockIfAvailable: {
  (self: MultiLock, options?: TryAcquireOptions): <A, E, R>(
    effect: Effect.Effect<A, E, R> | ((lease: MultiLease) => Effect.Effect<A, E, R>)
  ) => Effect.Effect<Option.Option<A>, E | Exclude<AcquireError, { _tag: "LockTimeout" }> | LockLost, Exclude<R, Scope.Scope>>
  <A, E, R>(
    effect: Effect.Effect<A, E, R> | ((lease: MultiLease) => Effect.Effect<A, E, R>),
    self: MultiLock,
    options?: TryAcquireOptions
  ): Effect.Effect<Option.Option<A>, E | Exclude<AcquireError, { _tag: "LockTimeout" }> | LockLost, Exclude<R, Scope.Scope>>
} = dual(
  (args) => isBody(args[0]),
  <A, E, R>(
    effect: Effect.Effect<A, E, R> | ((lease: MultiLease) => Effect.Effect<A, E, R>),
    self: MultiLock,
    options?: TryAcquireOptions
  ) =>
    Effect.flatMap(handle.tryingOf(options), (waiting) =>
      internal.withAllIfGranted(
        typeof effect === "function" ? (leases: ReadonlyArray<Lease>) => effect(multiLease(leases)) : effect,
        specsOf(self),
        waiting
      ))
)
