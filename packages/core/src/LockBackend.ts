/**
 * The interpreter interface every lockstep backend implements. The user-facing API (`Lock`,
 * `FairLock`, `ReadWriteLock`, `Semaphore`) is written once against this service; a backend only
 * has to apply the rules below atomically.
 *
 * Rules (applied atomically by the backend after dropping expired holders and queue entries):
 * - exclusive acquire by `h`: granted iff no other live holder (and, if `fair`, `h` is first in
 *   the key's queue). If `h` holds the key in shared mode only, it fails with
 *   `LockUpgradeNotSupported` instead of waiting forever.
 * - shared acquire of `p` permits by `h`: granted iff no live exclusive holder other than `h` and
 *   the live shared permits + `p` <= `limit` (read locks: `limit` = Infinity). The limit is stored
 *   with the key while it has shared holders; a request naming another limit fails with
 *   `InvalidLockOptions` (field `limit`), and so does `p` > `limit` (field `permits`), which could
 *   never be granted. A current holder taking another hold (re-entry, or a writer taking the read
 *   lock) never waits in the fair queue: it would wait behind waiters that wait for it.
 * - re-acquire by a current holder: its count for that mode + 1, its expiry extended to at least
 *   now + lease, same fence.
 * - every new grant (a holder going from no holds to one) takes the next value of the key's fence
 *   counter, which never goes back, even after the key is empty.
 * - release by `h`: count - 1; at 0 the hold is removed and waiters are woken. Release by a
 *   non-holder changes nothing and fails with `NotHeld`.
 * - renew by `h`: expiry extended to at least now + lease iff `h` still holds; otherwise `false`.
 * - expiry is judged on the backend's own clock.
 *
 * Every operation must end in bounded time (a backend over a network puts a timeout on each call
 * and fails with `BackendError`): callers run a grant and the registration of its release as one
 * uninterruptible step, so an interruption never leaks a grant, and a holder whose renewals hang
 * must still learn of its lost lease.
 *
 * @since 0.1.0
 */
import type { Effect, Scope } from "effect"
import { Context } from "effect"
import type { BackendError, InvalidLockOptions, LockUpgradeNotSupported, NotHeld } from "./LockError.js"

/**
 * How a holder holds a key.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const mode: LockBackend.HoldMode = "shared"
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type HoldMode = "exclusive" | "shared"

/**
 * One acquisition attempt. Attempts never wait inside the backend: a denied attempt reports how
 * long the caller may sleep before the blocking hold expires.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.AcquireRequest = {
 *   key: "orders:42",
 *   holder: "6f1c...:1",
 *   mode: "exclusive",
 *   permits: 1,
 *   limit: 1,
 *   leaseMs: 30_000,
 *   fair: false,
 *   waiterTtlMs: 5_000
 * }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface AcquireRequest {
  readonly key: string
  /** `<clientId>:<n>` */
  readonly holder: string
  readonly mode: HoldMode
  /** Permits taken by a shared hold; 1 for exclusive holds. */
  readonly permits: number
  /** Shared capacity of the key: Infinity for read locks, N for an N-permit semaphore. Ignored for exclusive holds. */
  readonly limit: number
  readonly leaseMs: number
  /** FIFO: a denied attempt queues `holder` (or refreshes its queue entry) until now + `waiterTtlMs`. */
  readonly fair: boolean
  readonly waiterTtlMs: number
}

/**
 * The outcome of an acquisition attempt.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const describe = (r: LockBackend.AcquireResult) =>
 *   r._tag === "Granted" ? `fence ${r.fence}` : `retry in ${r.retryAfterMs} ms`
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type AcquireResult =
  | {
    readonly _tag: "Granted"
    /** The holder's fencing token: new for a new grant, unchanged for a re-entrant one. */
    readonly fence: number
    /** The holder's count for the requested mode after this grant. */
    readonly count: number
  }
  | {
    readonly _tag: "Denied"
    /** Milliseconds until the earliest blocking hold or queue entry expires: the longest useful wait. */
    readonly retryAfterMs: number
  }

/**
 * A release of one hold.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.ReleaseRequest = { key: "orders:42", holder: "6f1c...:1", mode: "exclusive" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ReleaseRequest {
  readonly key: string
  readonly holder: string
  readonly mode: HoldMode
}

/**
 * A renewal of all holds of one holder on one key.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.RenewRequest = { key: "orders:42", holder: "6f1c...:1", leaseMs: 30_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RenewRequest {
  readonly key: string
  readonly holder: string
  readonly leaseMs: number
}

/**
 * One live holder of a key, as `inspect` reports it.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const isWriter = (h: LockBackend.HolderState) => h.exclusive > 0
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface HolderState {
  readonly holder: string
  /** Hold count in exclusive mode (0 when not held exclusively). */
  readonly exclusive: number
  /** Hold count in shared mode (0 when not held shared). */
  readonly shared: number
  /** Permits taken by the shared hold (0 when not held shared). */
  readonly permits: number
  readonly fence: number
  readonly ttlMs: number
}

/**
 * A fair-queue entry, as `inspect` reports it.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const head = (q: ReadonlyArray<LockBackend.WaiterState>) => q[0]?.holder
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface WaiterState {
  readonly holder: string
  readonly ttlMs: number
}

/**
 * The live state of one key.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const isLocked = (s: LockBackend.KeyState) => s.holders.length > 0
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface KeyState {
  readonly key: string
  /** The last fence issued for the key (0 if none ever was). */
  readonly fence: number
  /** The stored shared limit while the key has shared holders. */
  readonly limit: number | undefined
  readonly holders: ReadonlyArray<HolderState>
  /** Live fair-queue entries in arrival order. */
  readonly queue: ReadonlyArray<WaiterState>
}

/**
 * A waiter's subscription to a key's wake-up signal. Subscribe *before* retrying so that a release
 * between the retry and the wait is never missed.
 *
 * A release wakes one waiter (for a fair key: the head of the queue). When that waiter asks for a
 * shared hold, every shared waiter is woken, since freed capacity may fit several of them and a
 * denied one does not pass the wake-up on. A waiter that leaves without a grant (its
 * subscription's scope closes with a failure or an interruption) hands the wake-up on.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core"
 *
 * const waitOnce = (key: string, holder: string) =>
 *   Effect.gen(function* () {
 *     const backend = yield* LockBackend.LockBackend
 *     const subscription = yield* backend.subscribe(key, holder, "exclusive")
 *     yield* subscription.await
 *   }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Subscription {
  /** Completes when a wake-up is delivered to this subscription (at once if one is pending). */
  readonly await: Effect.Effect<void>
}

/**
 * The operations a backend provides.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core"
 *
 * const holders = (key: string) =>
 *   Effect.flatMap(LockBackend.LockBackend, (backend) => backend.inspect(key))
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Service {
  /** A UUID per backend instance; holders are `<clientId>:<n>`. */
  readonly clientId: string
  readonly acquire: (
    request: AcquireRequest
  ) => Effect.Effect<AcquireResult, BackendError | InvalidLockOptions | LockUpgradeNotSupported>
  /** Releases one hold; succeeds with the holder's remaining count for that mode. */
  readonly release: (request: ReleaseRequest) => Effect.Effect<number, BackendError | NotHeld>
  /** Renews many leases at once; one boolean per request, `false` where the holder no longer holds. */
  readonly renew: (requests: ReadonlyArray<RenewRequest>) => Effect.Effect<ReadonlyArray<boolean>, BackendError>
  readonly inspect: (key: string) => Effect.Effect<KeyState, BackendError>
  /** Drops every holder of the key and wakes waiters; `true` if anything was held. */
  readonly forceRelease: (key: string) => Effect.Effect<boolean, BackendError>
  /** Removes `holder` from the key's fair queue (a waiter giving up) and wakes the new head. */
  readonly cancel: (key: string, holder: string) => Effect.Effect<void, BackendError>
  /** `mode`: what the waiter asks for; a wake-up meant for shared waiters goes to all of them. */
  readonly subscribe: (key: string, holder: string, mode: HoldMode) => Effect.Effect<Subscription, BackendError, Scope.Scope>
}

/**
 * The backend service. Provide it with a backend layer such as `MemoryBackend.layer`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core"
 *
 * const clientId = Effect.map(LockBackend.LockBackend, (backend) => backend.clientId)
 * ```
 *
 * @since 0.1.0
 * @category tags
 */
export class LockBackend extends Context.Tag("@lockstep/core/LockBackend")<LockBackend, Service>() {}
