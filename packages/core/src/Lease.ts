/**
 * A granted hold on a lock. Leases are scoped: closing the scope they were acquired in releases
 * them exactly once.
 *
 * @since 0.1.0
 */
import type { Duration, Effect } from "effect"
import type { HoldMode } from "./LockBackend.js"
import type { LockLost } from "./LockError.js"

/**
 * A granted hold on a lock.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   const lease = yield* Lock.acquire(lock)
 *   yield* Effect.log(`holding ${lease.key} as ${lease.holder} with fence ${lease.fence}`)
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Lease {
  readonly key: string
  /** `<clientId>:<n>`: the identity the backend knows this hold by. */
  readonly holder: string
  readonly mode: HoldMode
  /** Permits taken (1 for locks). */
  readonly permits: number
  /**
   * The fencing token: strictly increasing per key across holders, the same for re-entrant
   * acquisitions. Pass it to the resource you protect so it can reject stale writers.
   */
  readonly fence: number
  /** Time left until the local deadline: acquisition (or last confirmed renewal) + lease. */
  readonly expiresIn: Effect.Effect<Duration.Duration>
  /**
   * Fails with `LockLost` once the lease is gone (renewal reported it no longer held, or the local
   * deadline passed without a confirmed renewal); never completes while the lease is valid, nor
   * after it was released normally (check `state` for that). Re-entrant leases share the `lost` of
   * their holder's hold.
   */
  readonly lost: Effect.Effect<never, LockLost>
  /**
   * Where the lease stands: `Held`, `Released` once its scope closed (`expiresIn` is then 0), or
   * `Lost` (see `lost`).
   */
  readonly state: Effect.Effect<LeaseState>
}

/**
 * Where a lease stands. `Released`: its scope closed and it was released (a re-entrant lease is
 * released when its own scope closes, even while an outer lease of the same holder is held).
 * `Lost`: the hold ended without a release (see `Lease.lost`).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 * import type { Lease } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   const lease = yield* Effect.scoped(Lock.acquire(lock))
 *   const state: Lease.LeaseState = yield* lease.state
 *   console.log(state) // "Released"
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type LeaseState = "Held" | "Released" | "Lost"
