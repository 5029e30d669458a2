/**
 * `Semaphore`: `limit` leased permits on one key. Each acquisition takes one or more permits as
 * its own holder with its own lease (renewed by the watchdog, or fixed), so permits of a crashed
 * process come back when their lease expires. The limit is stored with the key while permits are
 * taken; a semaphore on the same key with another limit fails with `InvalidLockOptions`.
 * Acquisitions are not re-entrant: every acquisition takes new permits.
 *
 * @since 0.1.0
 */
import type { Option, Pipeable, Scope } from "effect"
import { Effect } from "effect"
import { dual } from "effect/Function"
import { pipeArguments } from "effect/Pipeable"
import * as handle from "./internal/handle.js"
import type { Body, LockSpec } from "./internal/spec.js"
import { isBody } from "./internal/spec.js"
import * as validate from "./internal/options.js"
import type { Lease } from "./Lease.js"
import type { HolderState, LockBackend } from "./LockBackend.js"
import type { AcquireError, BackendError, InvalidLockOptions, LockLost } from "./LockError.js"
import type { AcquireOptions as LockAcquireOptions, Options as LockOptions, TryAcquireOptions as TryLockOptions } from "./Lock.js"

/**
 * The brand of a `Semaphore` handle.
 *
 * @since 0.1.0
 * @category symbols
 */
export const TypeId: unique symbol = Symbol.for("@lockstep/core/Semaphore")

/**
 * The type of `TypeId`.
 *
 * @since 0.1.0
 * @category symbols
 */
export type TypeId = typeof TypeId

/**
 * A handle on a named semaphore.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const sem = yield* Semaphore.make("api-quota", { limit: 4 })
 *   console.log(sem.key, sem.limit)
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Semaphore extends Pipeable.Pipeable {
  readonly [TypeId]: TypeId
  readonly key: string
  readonly limit: number
}

/**
 * Options of a semaphore.
 *
 * @example
 * ```ts
 * import { Semaphore } from "@lockstep/core"
 *
 * const options: Semaphore.Options = { limit: 10, lease: "1 minute" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options extends LockOptions {
  /** How many permits the semaphore has (a whole number >= 1). */
  readonly limit: number
}

/**
 * Options of one acquisition.
 *
 * @example
 * ```ts
 * import { Semaphore } from "@lockstep/core"
 *
 * const options: Semaphore.AcquireOptions = { permits: 2, timeout: "1 second" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface AcquireOptions extends LockAcquireOptions {
  /** Permits to take at once (1 to `limit`). Default 1. */
  readonly permits?: number | undefined
}

/**
 * Options of an acquisition that gives up rather than wait: `tryAcquire`, `withPermitsIfAvailable`.
 *
 * @example
 * ```ts
 * import { Semaphore } from "@lockstep/core"
 *
 * const options: Semaphore.TryAcquireOptions = { permits: 2, wait: "100 millis" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface TryAcquireOptions extends TryLockOptions {
  /** Permits to take at once (1 to `limit`). Default 1. */
  readonly permits?: number | undefined
}

class SemaphoreImpl implements Semaphore {
  readonly [TypeId]: TypeId = TypeId
  constructor(readonly spec: LockSpec) {}
  get key(): string {
    return this.spec.key
  }
  get limit(): number {
    return this.spec.limit
  }
  pipe() {
    // eslint-disable-next-line prefer-rest-params
    return pipeArguments(this, arguments)
  }
  toString(): string {
    return `Semaphore(${this.spec.key}, ${this.spec.limit})`
  }
}

const specOf = (semaphore: Semaphore): LockSpec => (semaphore as SemaphoreImpl).spec

const permitsOf = (semaphore: Semaphore, permits: number | undefined) =>
  validate.count("permits", permits ?? 1, semaphore.limit)

/**
 * A semaphore of `limit` permits on `key`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Semaphore.make("api-quota", { limit: 4 })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (key: string, options: Options): Effect.Effect<Semaphore, InvalidLockOptions, LockBackend> =>
  Effect.gen(function*() {
    const limit = yield* validate.count("limit", options.limit, Number.MAX_SAFE_INTEGER)
    const spec = yield* handle.makeSpec("Semaphore", key, options, { mode: "shared", limit, fair: false })
    return new SemaphoreImpl(spec)
  })

/**
 * Waits for permits and yields their `Lease`; they are given back when the scope closes.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const sem = yield* Semaphore.make("api-quota", { limit: 4 })
 *   const lease = yield* Semaphore.acquire(sem, { permits: 2 })
 *   yield* Effect.log(`holding ${lease.permits} permits`)
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const acquire = (
  semaphore: Semaphore,
  options?: AcquireOptions
): Effect.Effect<Lease, AcquireError, Scope.Scope> =>
  Effect.flatMap(permitsOf(semaphore, options?.permits), (permits) =>
    handle.acquire(specOf(semaphore), permits, options))

/**
 * One attempt, no waiting: `Some(lease)` if the permits were free, `None` if not. With `wait`,
 * waits at most that long for them.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const sem = yield* Semaphore.make("api-quota", { limit: 4 })
 *   return yield* Semaphore.tryAcquire(sem, { permits: 4 })
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const tryAcquire = (
  semaphore: Semaphore,
  options?: TryAcquireOptions
): Effect.Effect<Option.Option<Lease>, Exclude<AcquireError, { _tag: "LockTimeout" }>, Scope.Scope> =>
  Effect.flatMap(permitsOf(semaphore, options?.permits), (permits) => handle.tryAcquire(specOf(semaphore), permits, options))

/**
 * Runs an effect while holding permits, then gives them back; interrupted with `LockLost` if the
 * lease is lost. The body may be a function of the `Lease`. Pipeable and data-first.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const sem = yield* Semaphore.make("api-quota", { limit: 4 })
 *   yield* Effect.log("calling the API").pipe(Semaphore.withPermits(sem, { permits: 1 }))
 *   yield* Semaphore.withPermits((lease) => Effect.log(`${lease.permits} permit(s)`), sem)
 * })
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const withPermits: {
  (semaphore: Semaphore, options?: AcquireOptions): <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>)
  ) => Effect.Effect<A, E | AcquireError | LockLost, Exclude<R, Scope.Scope>>
  <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>),
    semaphore: Semaphore,
    options?: AcquireOptions
  ): Effect.Effect<A, E | AcquireError | LockLost, Exclude<R, Scope.Scope>>
} = dual(
  (args) => isBody(args[0]),
  <A, E, R>(self: Body<A, E, R>, semaphore: Semaphore, options?: AcquireOptions) =>
    Effect.flatMap(permitsOf(semaphore, options?.permits), (permits) =>
      handle.withLease(self, specOf(semaphore), permits, options))
)

/**
 * Runs the effect only if the permits are free (or become free within `wait`): `Some` of its
 * result, or `None` without running it — as Effect's own `Semaphore.withPermitsIfAvailable`.
 *
 * @example
 * ```ts
 * import { Effect, Option } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const sem = yield* Semaphore.make("api-quota", { limit: 4 })
 *   const sent = yield* Effect.succeed("sent").pipe(Semaphore.withPermitsIfAvailable(sem, { permits: 2 }))
 *   if (Option.isNone(sent)) yield* Effect.log("quota busy, skipped")
 * })
 * ```
 *
 * @since 0.1.0
 * @category acquiring
 */
export const withPermitsIfAvailable: {
  (semaphore: Semaphore, options?: TryAcquireOptions): <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>)
  ) => Effect.Effect<Option.Option<A>, E | Exclude<AcquireError, { _tag: "LockTimeout" }> | LockLost, Exclude<R, Scope.Scope>>
  <A, E, R>(
    self: Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>),
    semaphore: Semaphore,
    options?: TryAcquireOptions
  ): Effect.Effect<Option.Option<A>, E | Exclude<AcquireError, { _tag: "LockTimeout" }> | LockLost, Exclude<R, Scope.Scope>>
} = dual(
  (args) => isBody(args[0]),
  <A, E, R>(self: Body<A, E, R>, semaphore: Semaphore, options?: TryAcquireOptions) =>
    Effect.flatMap(permitsOf(semaphore, options?.permits), (permits) =>
      handle.withLeaseIfAvailable(self, specOf(semaphore), permits, options))
)

/**
 * Does the current fiber hold permits of this semaphore, with a lease whose local deadline has
 * not passed? Answered locally, without a backend call.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const sem = yield* Semaphore.make("api-quota", { limit: 4 })
 *   return yield* Semaphore.withPermits(Semaphore.isHeldByCurrentFiber(sem), sem) // true
 * })
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const isHeldByCurrentFiber = (semaphore: Semaphore): Effect.Effect<boolean> =>
  handle.isHeldByCurrentFiber(specOf(semaphore))

/**
 * Permits not currently taken.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.flatMap(Semaphore.make("api-quota", { limit: 4 }), Semaphore.available)
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const available = (semaphore: Semaphore): Effect.Effect<number, BackendError> =>
  Effect.map(holders(semaphore), (hs) => semaphore.limit - hs.reduce((sum, h) => sum + h.permits, 0))

/**
 * The semaphore's live holders and their permits.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Semaphore } from "@lockstep/core"
 *
 * const program = Effect.flatMap(Semaphore.make("api-quota", { limit: 4 }), Semaphore.holders)
 * ```
 *
 * @since 0.1.0
 * @category inspection
 */
export const holders = (semaphore: Semaphore): Effect.Effect<ReadonlyArray<HolderState>, BackendError> =>
  handle.holders(specOf(semaphore))
