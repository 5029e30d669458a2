/**
 * The interpreter interface every lockstep backend implements. The user-facing API (`Lock`,
 * `FairLock`, `ReadWriteLock`, `Semaphore`) is written once against this service; a backend only
 * has to apply the backend rules atomically, after dropping expired holders and queue entries:
 * an exclusive grant needs no other live holder (and, if `fair`, the head of the queue); a shared
 * grant needs no exclusive holder but itself and free permits under the stored `limit`; re-entry
 * sets the request's `count` and keeps the fence; every new grant takes a fence greater than every
 * earlier one of the key; a release or renewal by a non-holder changes nothing; expiry is judged on
 * the backend's own clock. Every operation changes the state once even when delivered twice or
 * late, and ends in bounded time. The rules in full, with their reasons, are in the README
 * ("Semantics"); `@lockstep/core/Rules` is their reference implementation.
 *
 * @since 0.1.0
 */
import type { Either, Scope } from "effect"
import { Context, Effect, Layer } from "effect"
import { dual } from "effect/Function"
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
 *   waiterTtlMs: 5_000,
 *   count: 1
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
  /**
   * The holder's count in `mode` once granted: 1 for a first hold in that mode, n + 1 to re-enter
   * a hold of n. A copy of an applied request finds the count reached and changes nothing.
   */
  readonly count: number
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
 * const request: LockBackend.ReleaseRequest = {
 *   key: "orders:42",
 *   holder: "6f1c...:1",
 *   mode: "exclusive",
 *   count: 1,
 *   leaseMs: 30_000
 * }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ReleaseRequest {
  readonly key: string
  readonly holder: string
  readonly mode: HoldMode
  /** The holder's count in `mode` before this release, as the caller knows it. */
  readonly count: number
  /** How long the backend remembers the holder once it has ended. */
  readonly leaseMs: number
}

/**
 * A fair-queue waiter giving up.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.CancelRequest = { key: "orders:42", holder: "6f1c...:1", leaseMs: 30_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface CancelRequest {
  readonly key: string
  readonly holder: string
  /** How long the backend remembers that the holder left. */
  readonly leaseMs: number
}

/**
 * A forced release of every holder of a key. `id` names the operation (a fresh UUID per call), so
 * a second delivery of it does not drop holders granted since.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.ForceReleaseRequest = { key: "orders:42", id: crypto.randomUUID() }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ForceReleaseRequest {
  readonly key: string
  readonly id: string
}

/**
 * A floor for a key's fences: every fence the backend issues on the key afterwards is greater
 * than `fence`. The floor is kept at least `leaseMs`, and until the backend's clock in
 * microseconds has passed it (after which every new fence is above it anyway). Raising a floor
 * twice, or below the last fence issued, changes nothing. A quorum of backends (`RedLock`) raises
 * the floor of each node that granted to the fence it hands out, so that the next majority's
 * fences are above it.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.RaiseFenceRequest = { key: "orders:42", fence: 1_764_000_000_000_123, leaseMs: 30_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RaiseFenceRequest {
  readonly key: string
  readonly fence: number
  readonly leaseMs: number
}

/**
 * What a backend cannot do soundly, each with the reason: `make` refuses a handle of such a kind
 * with `InvalidLockOptions` (field `kind`) before any backend call. Absent: every kind works.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const unsupported: LockBackend.Unsupported = { fair: "no fair queue over a quorum" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Unsupported {
  /** `FairLock`. */
  readonly fair?: string | undefined
  /** Shared holds: `ReadWriteLock`, `Semaphore`. */
  readonly shared?: string | undefined
  /** `CountDownLatch`. */
  readonly latch?: string | undefined
}

/**
 * The outcome of one renewal in a batch: `true` renewed, `false` no longer held, or the error
 * that hit this lease alone (a key of another type, say); other leases in the batch are unaffected.
 *
 * @example
 * ```ts
 * import { Either } from "effect"
 * import type { LockBackend } from "@lockstep/core"
 *
 * const renewed = (r: LockBackend.RenewResult) => Either.getOrElse(r, () => false)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type RenewResult = Either.Either<boolean, BackendError>

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
  /** The last fence issued for the key, while the backend remembers it (0 otherwise). */
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
 * A release wakes a waiter that can win (for a fair key: the head of the queue): one exclusive
 * waiter, or as many shared waiters as the freed capacity may fit (a backend that cannot tell may
 * wake them all). A waiter that leaves without a grant (its subscription's scope closes with a
 * failure or an interruption) hands the wake-up on. A wake-up can still be lost (with a crashed
 * waiter, say): the lock API tries again at least once per waiter timeout, whatever it was told.
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
  /**
   * `await` as a callback, for backends whose wake-ups arrive as callbacks (see
   * `subscriptionOf`): registers `wake` for the next wake-up (called at once if one is pending)
   * and returns what unregisters it. `wake` is given what the waiting fiber runs when it resumes.
   * With it, the lock API waits for a wake-up or a timer without a fiber for each.
   */
  readonly unsafeOnWake?: ((wake: (resumed: Effect.Effect<void>) => void) => () => void) | undefined
  /**
   * The hand-off delivered with the last wake-up, if any (taken once): the backend granted the
   * waiter the lock itself (see `HandOff`). Absent for backends that only wake.
   */
  readonly takeHandOff?: Effect.Effect<HandOff | undefined> | undefined
}

/**
 * A grant a backend made to a waiter on its own, when the hold before it ended (a hand-off): a
 * claim, a hold of count 1 with `fence` that the backend keeps `claimMs` unless the holder
 * confirms it (a renewal, or an acquire by the holder, which finds it the holder and answers the
 * same fence and count). A backend hands one over only if the claim was granted after the
 * waiter's last denied acquire was processed, so a lease deadline measured from when that
 * acquire was sent, plus `claimMs`, is never later than the backend's expiry of the claim.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const handOff: LockBackend.HandOff = { fence: 42, claimMs: 2_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface HandOff {
  readonly fence: number
  readonly claimMs: number
}

/**
 * A subscription whose wake-ups arrive as callbacks: `onWake` registers one for the next
 * wake-up (calling it at once if one is pending) and returns what unregisters it.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core"
 *
 * const resumers = new Set<(resumed: Effect.Effect<void>) => void>()
 * const subscription = LockBackend.subscriptionOf((wake) => {
 *   resumers.add(wake)
 *   return () => resumers.delete(wake)
 * })
 * // a release wakes it: for (const wake of resumers) wake(Effect.void)
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const subscriptionOf = (
  onWake: (wake: (resumed: Effect.Effect<void>) => void) => () => void
): Subscription => ({
  await: Effect.async<void>((resume) => {
    const unregister = onWake(resume)
    return Effect.sync(unregister)
  }),
  unsafeOnWake: onWake
})

/**
 * A call on a latch. `id` names the call (a fresh one per call): a copy of a call the backend
 * already applied, delivered again, changes nothing.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.LatchRequest = { key: "batch:7", id: crypto.randomUUID() }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface LatchRequest {
  readonly key: string
  readonly id: string
}

/**
 * Setting a latch's count.
 *
 * @example
 * ```ts
 * import type { LockBackend } from "@lockstep/core"
 *
 * const request: LockBackend.SetCountRequest = { key: "batch:7", id: crypto.randomUUID(), count: 3 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface SetCountRequest extends LatchRequest {
  /** A positive integer. */
  readonly count: number
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
  /** Kinds this backend refuses at `make`, with the reason; absent for a backend that supports all. */
  readonly unsupported?: Unsupported | undefined
  /** `NotHeld`: a re-entry into a hold that is gone, or a late copy from a holder that ended. */
  readonly acquire: (
    request: AcquireRequest
  ) => Effect.Effect<AcquireResult, BackendError | InvalidLockOptions | LockUpgradeNotSupported | NotHeld>
  /** Releases one hold; succeeds with the holder's remaining count for that mode. */
  readonly release: (request: ReleaseRequest) => Effect.Effect<number, BackendError | NotHeld>
  /**
   * Renews many leases at once (the lock API sends every lease that is due in one call); one
   * result per request. Fails only when the whole batch failed (the connection, say); an error
   * that concerns one lease is that lease's result.
   */
  readonly renew: (requests: ReadonlyArray<RenewRequest>) => Effect.Effect<ReadonlyArray<RenewResult>, BackendError>
  readonly inspect: (key: string) => Effect.Effect<KeyState, BackendError>
  /** Every later fence of the key is above `request.fence`; see `RaiseFenceRequest`. */
  readonly raiseFence: (request: RaiseFenceRequest) => Effect.Effect<void, BackendError>
  /** Drops every holder of the key and wakes waiters; `true` if anything was held. */
  readonly forceRelease: (request: ForceReleaseRequest) => Effect.Effect<boolean, BackendError>
  /** Removes `holder` from the key's fair queue (a waiter giving up) and wakes the new head. */
  readonly cancel: (request: CancelRequest) => Effect.Effect<void, BackendError>
  /** `mode`: what the waiter asks for; a wake-up for shared waiters goes to those that may fit. */
  readonly subscribe: (key: string, holder: string, mode: HoldMode) => Effect.Effect<Subscription, BackendError, Scope.Scope>
  /**
   * Sets the latch's count if it is 0 (never set, or counted down to 0); `true` if it did, or if
   * this is a copy of a call that did. Wakes the latch's waiters. `InvalidLockOptions` when a lock
   * holds the key.
   */
  readonly latchSetCount: (request: SetCountRequest) => Effect.Effect<boolean, BackendError | InvalidLockOptions>
  /**
   * Takes one off the latch's count (never below 0) and succeeds with the count after; the call
   * that reaches 0 wakes every waiter of the latch. A copy of an applied call changes nothing.
   */
  readonly latchCountDown: (request: LatchRequest) => Effect.Effect<number, BackendError | InvalidLockOptions>
  /** The latch's count: 0 when never set or counted down. */
  readonly latchCount: (key: string) => Effect.Effect<number, BackendError | InvalidLockOptions>
  /**
   * A waiter's subscription to the latch's signal: woken (every waiter) when the count reaches 0
   * or is set anew. Subscribe before reading the count.
   */
  readonly latchSubscribe: (key: string, waiter: string) => Effect.Effect<Subscription, BackendError, Scope.Scope>
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

/**
 * The identifier of a backend provided under a name of its own (`tag`), beside or instead of the
 * `LockBackend` one: one type per name.
 *
 * @example
 * ```ts
 * import type { Effect } from "effect"
 * import type { LockBackend } from "@lockstep/core"
 *
 * type NeedsOrders = Effect.Effect<void, never, LockBackend.Named<"app/OrderLocks">>
 * ```
 *
 * @since 0.1.0
 * @category tags
 */
export interface Named<Name extends string> {
  readonly name: Name
}

/**
 * A tag for a backend of its own, for programs that lock on several backends at once (a
 * `MultiLock` across two Redis deployments, a lock on Redis beside a latch in SQL). Provide it
 * with `layerAs` and make handles on it with `using`.
 *
 * @example
 * ```ts
 * import { LockBackend } from "@lockstep/core"
 *
 * const OrderLocks = LockBackend.tag("app/OrderLocks")
 * ```
 *
 * @since 0.1.0
 * @category tags
 */
export const tag = <const Name extends string>(name: Name): Context.Tag<Named<Name>, Service> =>
  Context.GenericTag<Named<Name>, Service>(name)

/**
 * Provides a backend layer under `tag` instead of `LockBackend`.
 *
 * @example
 * ```ts
 * import { LockBackend } from "@lockstep/core"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const OrderLocks = LockBackend.tag("app/OrderLocks")
 * const OrderLocksLive = MemoryBackend.layer.pipe(LockBackend.layerAs(OrderLocks))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerAs: {
  <I>(tag: Context.Tag<I, Service>): <E, R>(backend: Layer.Layer<LockBackend, E, R>) => Layer.Layer<I, E, R>
  <I, E, R>(backend: Layer.Layer<LockBackend, E, R>, tag: Context.Tag<I, Service>): Layer.Layer<I, E, R>
} = dual(
  2,
  <I, E, R>(backend: Layer.Layer<LockBackend, E, R>, tag: Context.Tag<I, Service>): Layer.Layer<I, E, R> =>
    Layer.provide(Layer.effect(tag, LockBackend), backend)
)

/**
 * Runs `effect` (typically a handle's `make`) on the backend provided under `tag`: the handles it
 * makes lock there.
 *
 * @example
 * ```ts
 * import { Lock, LockBackend } from "@lockstep/core"
 *
 * const OrderLocks = LockBackend.tag("app/OrderLocks")
 * const order = Lock.make("order:42").pipe(LockBackend.using(OrderLocks))
 * ```
 *
 * @since 0.1.0
 * @category combinators
 */
export const using: {
  <I>(tag: Context.Tag<I, Service>): <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, Exclude<R, LockBackend> | I>
  <A, E, R, I>(effect: Effect.Effect<A, E, R>, tag: Context.Tag<I, Service>): Effect.Effect<A, E, Exclude<R, LockBackend> | I>
} = dual(
  2,
  <A, E, R, I>(effect: Effect.Effect<A, E, R>, tag: Context.Tag<I, Service>): Effect.Effect<A, E, Exclude<R, LockBackend> | I> =>
    Effect.provideServiceEffect(effect, LockBackend, tag)
)

/**
 * How long a backend remembers the id of a `forceRelease` it applied, so that a second delivery
 * of it is recognised: one minute.
 *
 * @example
 * ```ts
 * import { LockBackend } from "@lockstep/core"
 *
 * console.log(LockBackend.forceReleaseMemoryMs) // 60000
 * ```
 *
 * @since 0.1.0
 * @category constants
 */
export const forceReleaseMemoryMs = 60_000

/**
 * How long a backend remembers the id of a latch call it applied, so that a copy of it changes
 * nothing: one minute. A copy delivered later than that is applied again.
 *
 * @example
 * ```ts
 * import { LockBackend } from "@lockstep/core"
 *
 * console.log(LockBackend.latchCallMemoryMs) // 60000
 * ```
 *
 * @since 0.1.0
 * @category constants
 */
export const latchCallMemoryMs = 60_000
