/**
 * `ReadWriteLock`: a read view and a write view of one key. Many readers or one writer; both
 * views are re-entrant. A writer may take the read lock (downgrade: release the write lock
 * afterwards and keep reading); a reader asking for the write lock fails fast with
 * `LockUpgradeNotSupported` instead of deadlocking. Use the `Lock` functions on `read` and `write`.
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
 * The two views of a read-write lock.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, ReadWriteLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const rw: ReadWriteLock.ReadWriteLock = yield* ReadWriteLock.make("config")
 *   yield* Effect.log("reading").pipe(Lock.withLock(rw.read))
 *   yield* Effect.log("writing").pipe(Lock.withLock(rw.write))
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ReadWriteLock {
  readonly key: string
  /** Shared: held by any number of readers while no writer holds the key. */
  readonly read: Lock
  /** Exclusive: held by one writer while no one else holds the key. */
  readonly write: Lock
}

/**
 * Options of a read-write lock (shared by both views).
 *
 * @example
 * ```ts
 * import { ReadWriteLock } from "@lockstep/core"
 *
 * const options: ReadWriteLock.Options = { watchdog: "10 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Options = LockOptions

/**
 * A read-write lock on `key`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, ReadWriteLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const rw = yield* ReadWriteLock.make("config")
 *   yield* Effect.log("many readers at once").pipe(Lock.withLock(rw.read))
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (key: string, options?: Options): Effect.Effect<ReadWriteLock, InvalidLockOptions, LockBackend> =>
  Effect.gen(function*() {
    const read = yield* handle.makeSpec("ReadLock", key, options, { mode: "shared", limit: Infinity, fair: false })
    const write = yield* handle.makeSpec("WriteLock", key, options, { mode: "exclusive", limit: 1, fair: false })
    return { key: read.key, read: fromSpec(read), write: fromSpec(write) }
  })
