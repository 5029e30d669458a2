/**
 * `FairLock`: a re-entrant mutex that grants in arrival order. Waiters queue in the backend and
 * heartbeat their queue entry while they wait; a waiter that stops heartbeating (a crashed
 * process) is dropped once its entry expires (`waiterTimeout`, default 5 seconds), so it never
 * blocks the queue for long. Use the `Lock` functions (`Lock.acquire`, `Lock.withLock`, ...) on it.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import * as handle from "./internal/handle.js"
import type { Lock, Options as LockOptions } from "./Lock.js"
import { fromSpec } from "./internal/lock.js"
import type { LockBackend } from "./LockBackend.js"
import type { InvalidLockOptions } from "./LockError.js"

/**
 * Options of a fair lock: `Lock.Options`, where `waiterTimeout` is also how long a queued waiter's
 * entry lives without a heartbeat.
 *
 * @example
 * ```ts
 * import { FairLock } from "@lockstep/core"
 *
 * const options: FairLock.Options = { waiterTimeout: "3 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Options = LockOptions

/**
 * A fair (FIFO) re-entrant mutex on `key`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { FairLock, Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* FairLock.make("printer")
 *   yield* Effect.log("my turn").pipe(Lock.withLock(lock))
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (key: string, options?: Options): Effect.Effect<Lock, InvalidLockOptions, LockBackend> =>
  Effect.map(handle.makeSpec("FairLock", key, options, { mode: "exclusive", limit: 1, fair: true }), fromSpec)
