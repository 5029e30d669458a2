/**
 * `CountDownLatch`: a distributed countdown, Redisson's `RCountDownLatch`. One party sets a count
 * (only while the latch is at 0), any process counts it down, and everyone who awaits it goes on
 * once it reaches 0.
 *
 * - `trySetCount(n)` sets the count only when it is 0 (never set, or counted down to 0): `true` if
 *   it did. `countDown` takes one off (never below 0); `count` reads it; `await` waits for 0 —
 *   woken by the count down that reaches it, with an optional timeout (`LockTimeout`), and
 *   interruptible.
 * - Each change carries an id: a copy of a call the backend already applied (a re-sent command)
 *   changes nothing, so a count down delivered twice counts once, and a change that failed with
 *   `BackendError` (its reply may have been lost) is tried twice more under the same id.
 * - A latch has no lease: its count stays until counted down (a crashed counter does not count).
 * - A latch's key is its own: latch calls on a key held by a lock fail with `InvalidLockOptions`.
 *
 * @since 0.1.0
 */
import type { Pipeable } from "effect"
import type { Duration } from "effect"
import { Effect } from "effect"
import { pipeArguments } from "effect/Pipeable"
import { LockBackend } from "./LockBackend.js"
import type { Service } from "./LockBackend.js"
import type { BackendError, LockTimeout } from "./LockError.js"
import { InvalidLockOptions } from "./LockError.js"
import * as handle from "./internal/handle.js"
import type { LatchSpec } from "./internal/latch.js"
import * as internal from "./internal/latch.js"
import * as validate from "./internal/options.js"

/**
 * The brand of a `CountDownLatch` handle: `isCountDownLatch` checks for it.
 *
 * @since 0.1.0
 * @category symbols
 */
export const TypeId: unique symbol = Symbol.for("@lockstep/core/CountDownLatch")

/**
 * The type of `TypeId`.
 *
 * @since 0.1.0
 * @category symbols
 */
export type TypeId = typeof TypeId

/**
 * A handle on a named latch. Handles are cheap values; the count lives in the backend.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { CountDownLatch } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const latch = yield* CountDownLatch.make("batch:7")
 *   console.log(latch.key) // "batch:7"
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface CountDownLatch extends Pipeable.Pipeable {
  readonly [TypeId]: TypeId
  readonly key: string
}

/**
 * Options of a latch handle.
 *
 * @example
 * ```ts
 * import { CountDownLatch } from "@lockstep/core"
 *
 * const options: CountDownLatch.Options = { recheck: "2 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * A waiter that hears nothing reads the count again after this long at the latest (a wake-up
   * can be lost with a connection). Default 5 seconds.
   */
  readonly recheck?: Duration.DurationInput | undefined
}

/**
 * Options of one wait.
 *
 * @example
 * ```ts
 * import { CountDownLatch } from "@lockstep/core"
 *
 * const options: CountDownLatch.AwaitOptions = { timeout: "30 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface AwaitOptions {
  /** How long to wait for 0 before failing with `LockTimeout`. Default: wait forever. */
  readonly timeout?: Duration.DurationInput | undefined
}

class LatchImpl implements CountDownLatch {
  readonly [TypeId]: TypeId = TypeId
  constructor(readonly spec: LatchSpec) {}
  get key(): string {
    return this.spec.key
  }
  pipe() {
    // eslint-disable-next-line prefer-rest-params
    return pipeArguments(this, arguments)
  }
  toString(): string {
    return `CountDownLatch(${this.spec.key})`
  }
}

const specOf = (latch: CountDownLatch): LatchSpec => (latch as LatchImpl).spec

/**
 * One change of a latch under a fresh id. A `BackendError` may hide a call that was carried out
 * (its reply lost): it is tried again, twice, under the same id, which the backend recognises as
 * a copy of the call if the first one did arrive.
 */
const change = <A, E extends { readonly _tag: string }>(
  latch: CountDownLatch,
  call: (backend: Service, id: string) => Effect.Effect<A, E>
): Effect.Effect<A, E> =>
  Effect.suspend(() => {
    const backend = specOf(latch).backend
    const id = `${backend.clientId}:${crypto.randomUUID()}`
    return Effect.retry(call(backend, id), { times: 2, while: (error) => error._tag === "BackendError" })
  })

/**
 * Is `u` a latch handle?
 *
 * @example
 * ```ts
 * import { CountDownLatch } from "@lockstep/core"
 *
 * console.log(CountDownLatch.isCountDownLatch({})) // false
 * ```
 *
 * @since 0.1.0
 * @category guards
 */
export const isCountDownLatch = (u: unknown): u is CountDownLatch =>
  typeof u === "object" && u !== null && TypeId in u

/**
 * A latch on `key`. Fails with `InvalidLockOptions` for a bad key or option, before any backend
 * call.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { CountDownLatch } from "@lockstep/core"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const program = Effect.gen(function* () {
 *   const latch = yield* CountDownLatch.make("batch:7")
 *   yield* CountDownLatch.trySetCount(latch, 3)
 * }).pipe(Effect.provide(MemoryBackend.layer))
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (key: string, options?: Options): Effect.Effect<CountDownLatch, InvalidLockOptions, LockBackend> =>
  Effect.gen(function*() {
    const validKey = yield* validate.key(key)
    const recheckMs = (yield* validate.optionalMillis("recheck", options?.recheck)) ?? 5_000
    const backend = yield* LockBackend
    const refused = backend.unsupported?.latch
    if (refused !== undefined) return yield* new InvalidLockOptions({ field: "kind", reason: `CountDownLatch: ${refused}` })
    return new LatchImpl({ backend, key: validKey, recheckMs })
  })

/**
 * Sets the count to `count` (a positive integer) if the latch is at 0; `true` if it did, `false`
 * if a count is already set.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { CountDownLatch } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const latch = yield* CountDownLatch.make("batch:7")
 *   const set = yield* CountDownLatch.trySetCount(latch, 3)
 *   yield* Effect.log(set ? "three workers to wait for" : "a batch is already running")
 * })
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const trySetCount = (latch: CountDownLatch, count: number): Effect.Effect<boolean, InvalidLockOptions | BackendError> =>
  Effect.flatMap(internal.validCount(count), (valid) =>
    change(latch, (backend, id) => backend.latchSetCount({ key: latch.key, id, count: valid })))

/**
 * Takes one off the count (nothing below 0) and yields the count after; the call that reaches 0
 * wakes every waiter.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { CountDownLatch } from "@lockstep/core"
 *
 * const worker = Effect.gen(function* () {
 *   const latch = yield* CountDownLatch.make("batch:7")
 *   yield* Effect.log("my part of the batch")
 *   yield* CountDownLatch.countDown(latch)
 * })
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const countDown = (latch: CountDownLatch): Effect.Effect<number, InvalidLockOptions | BackendError> =>
  change(latch, (backend, id) => backend.latchCountDown({ key: latch.key, id }))

/**
 * The current count (0 when never set or counted down).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { CountDownLatch } from "@lockstep/core"
 *
 * const program = Effect.flatMap(CountDownLatch.make("batch:7"), CountDownLatch.count)
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const count = (latch: CountDownLatch): Effect.Effect<number, InvalidLockOptions | BackendError> =>
  Effect.suspend(() => specOf(latch).backend.latchCount(latch.key))

const awaitZero = (
  latch: CountDownLatch,
  options?: AwaitOptions
): Effect.Effect<void, InvalidLockOptions | BackendError | LockTimeout> =>
  Effect.flatMap(handle.timeoutMillis(options?.timeout), (ms) => internal.awaitZero(specOf(latch), ms))

export {
  /**
   * Waits until the count is 0 (at once if it is). With `timeout`, fails with `LockTimeout` if it
   * has not reached 0 in time. Interruptible; leaves nothing behind.
   *
   * @example
   * ```ts
   * import { Effect } from "effect"
   * import { CountDownLatch } from "@lockstep/core"
   *
   * const coordinator = Effect.gen(function* () {
   *   const latch = yield* CountDownLatch.make("batch:7")
   *   yield* CountDownLatch.trySetCount(latch, 3)
   *   yield* CountDownLatch.await(latch, { timeout: "1 minute" })
   *   yield* Effect.log("all three done")
   * })
   * ```
   *
   * @since 0.1.0
   * @category operations
   */
  awaitZero as await
}
