/**
 * Parts for writing a `LockBackend`: what every backend keeps besides its own state. A
 * `Lifecycle` says whether the backend is open, gives every call after the close the same
 * `BackendError` (its cause a `LockError.BackendClosed`), names the backend's endpoint in its
 * errors, and makes the `WaiterSignal`s its subscriptions hand to waiting fibers, all of which
 * it wakes when it closes, so no waiter stays blocked on a backend that is gone.
 *
 * The behaviour a closed backend must have is checked by the conformance suite of
 * `@lockstep/testkit` (its `closed backend` tests).
 *
 * @since 0.1.0
 */
import type * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import * as internal from "./internal/backendKit.js"
import type { Subscription } from "./LockBackend.js"
import type { BackendError } from "./LockError.js"

/**
 * How a backend names itself in its errors: `backend` as `LockError.BackendClosed` shows it
 * (`memory backend`, `Redis backend`), `endpoint` where it talks to (see `endpointName`; never a
 * secret), and `detailOf`, what a failure's cause says in a `BackendError`'s `detail` (the
 * cause's message when absent).
 *
 * @example
 * ```ts
 * import type { BackendKit } from "@lockstep/core"
 *
 * const options: BackendKit.LifecycleOptions = { backend: "etcd backend", endpoint: "etcd 127.0.0.1:2379" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface LifecycleOptions {
  readonly backend: string
  readonly endpoint?: string | undefined
  readonly detailOf?: ((cause: unknown) => string) | undefined
}

/**
 * A backend's life, open until `close`: the guard and the errors of its calls, and the signals of
 * its waiters.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { BackendKit } from "@lockstep/core"
 *
 * const lifecycle = BackendKit.makeLifecycle({ backend: "etcd backend" })
 * const ping = lifecycle.whileOpen("inspect", Effect.succeed("pong"))
 * lifecycle.close()
 * // ping now fails with the closed backend's BackendError
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Lifecycle {
  readonly backend: string
  readonly endpoint: string | undefined
  /** Whether `close` was called. */
  readonly isClosed: () => boolean
  /** The error every call of the closed backend fails with. */
  readonly closedError: (operation: string) => BackendError
  /** `effect`, or the closed error if the backend is closed when it starts. */
  readonly whileOpen: <A, E, R>(operation: string, effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | BackendError, R>
  /**
   * The error of a call that failed with `cause`: a `BackendError` naming the endpoint, or the
   * closed error if the backend closed meanwhile (its connection may have gone under the call).
   */
  readonly failure: (operation: string) => (cause: unknown) => BackendError
  /**
   * A new signal for one subscription, woken at the close. `onTake` runs when a waiter takes a
   * wake-up (its fiber resumes, or it awaits one already pending).
   */
  readonly waiterSignal: (onTake?: () => void) => WaiterSignal
  /** Closes the backend (again: nothing): later calls fail as closed, every open signal wakes. */
  readonly close: () => void
  /**
   * Adds `close` to the scope's finalizers. Add it after the resources the backend's calls use, so
   * it runs before they are released: calls then fail as closed rather than as an outage.
   */
  readonly closeWithScope: Effect.Effect<void, never, Scope.Scope>
}

/**
 * The wake-up signal of one subscription. `wake` wakes the fibers awaiting it; with none
 * awaiting, the wake-up stays pending and the next `await` returns at once. A wake-up counts as
 * pending until the woken fiber resumes and takes it, so a backend choosing whom to wake can pass
 * over a waiter that is already on its way. Closed (its subscription ended, or the backend), it
 * wakes every waiter and every later `await` returns at once.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { BackendKit } from "@lockstep/core"
 *
 * const lifecycle = BackendKit.makeLifecycle({ backend: "etcd backend" })
 * const signal = lifecycle.waiterSignal()
 * signal.wake()
 * const woken = signal.subscription.await // returns at once: a wake-up is pending
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface WaiterSignal {
  readonly wake: () => void
  /** Whether a wake-up was delivered and not yet taken. */
  readonly pending: () => boolean
  /** Takes the pending wake-up, if any: whether there was one. */
  readonly take: () => boolean
  readonly isClosed: () => boolean
  /** Ends the signal: wakes its waiters; later awaits return at once. */
  readonly close: () => void
  /** The signal as what `LockBackend.Service.subscribe` answers. */
  readonly subscription: Subscription
}

/**
 * A backend's lifecycle, open. Close it when the backend's scope ends (`closeWithScope`).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { BackendKit } from "@lockstep/core"
 *
 * const backendParts = Effect.gen(function* () {
 *   const lifecycle = BackendKit.makeLifecycle({ backend: "etcd backend", endpoint: "etcd 127.0.0.1:2379" })
 *   // ... open the connections the calls use, then:
 *   yield* lifecycle.closeWithScope
 *   return lifecycle
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeLifecycle: (options: LifecycleOptions) => Lifecycle = internal.makeLifecycle

/**
 * How a backend's errors name where it talks to: `system address/path` (`PostgreSQL
 * db:5432/app`), `system address`, or `system` alone. Never put a user or a password in it.
 *
 * @example
 * ```ts
 * import { BackendKit } from "@lockstep/core"
 *
 * console.log(BackendKit.endpointName("PostgreSQL", "db:5432", "app")) // PostgreSQL db:5432/app
 * console.log(BackendKit.endpointName("Redis", "127.0.0.1:6379")) // Redis 127.0.0.1:6379
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const endpointName: (system: string, address?: string | undefined, path?: string | undefined) => string =
  internal.endpointName
