import type { Scope } from "effect"
import { Duration, Effect, Option } from "effect"
import type { Lease } from "../Lease.js"
import { LockBackend } from "../LockBackend.js"
import type { HolderState } from "../LockBackend.js"
import type { BackendError, LockLost, LockTimeout } from "../LockError.js"
import { InvalidLockOptions } from "../LockError.js"
import type { AttemptError, LockKind, LockSpec } from "./lock.js"
import * as internal from "./lock.js"
import * as validate from "./options.js"

/** Options shared by every kind's `make`. */
export interface SpecOptions {
  readonly lease?: Duration.DurationInput | undefined
  readonly watchdog?: Duration.DurationInput | undefined
  readonly waiterTimeout?: Duration.DurationInput | undefined
}

/** Validates a handle's options and captures the backend, before any backend call. */
export const makeSpec = (
  kind: LockKind,
  key: string,
  options: SpecOptions | undefined,
  shape: { readonly mode: LockSpec["mode"]; readonly limit: number; readonly fair: boolean }
): Effect.Effect<LockSpec, InvalidLockOptions, LockBackend> =>
  Effect.gen(function*() {
    const validKey = yield* validate.key(key)
    if (options?.lease !== undefined && options.watchdog !== undefined) {
      return yield* new InvalidLockOptions({
        field: "watchdog",
        reason: "a fixed lease is never renewed: give either `lease` or `watchdog`, not both"
      })
    }
    const leaseMs = yield* validate.optionalMillis("lease", options?.lease, { minMillis: validate.minLeaseMillis })
    const watchdogMs = (yield* validate.optionalMillis("watchdog", options?.watchdog, { minMillis: validate.minLeaseMillis })) ??
      internal.defaultWatchdogMs
    const waiterTtlMs = (yield* validate.optionalMillis("waiterTimeout", options?.waiterTimeout)) ??
      internal.defaultWaiterTtlMs
    const backend = yield* LockBackend
    const refused = shape.fair ? backend.unsupported?.fair : shape.mode === "shared" ? backend.unsupported?.shared : undefined
    if (refused !== undefined) return yield* new InvalidLockOptions({ field: "kind", reason: `${kind}: ${refused}` })
    return {
      kind,
      backend,
      key: validKey,
      mode: shape.mode,
      limit: shape.limit,
      fair: shape.fair,
      reentrant: kind !== "Semaphore",
      leaseMs,
      watchdogMs,
      waiterTtlMs
    }
  })

/** `undefined` (or an infinite duration) waits forever. */
export const timeoutMillis = (timeout: Duration.DurationInput | undefined): Effect.Effect<number | undefined, InvalidLockOptions> =>
  timeout === undefined
    ? Effect.succeed(undefined)
    : Effect.map(
      validate.optionalMillis("timeout", timeout, { allowInfinite: true }),
      (ms) => (ms === Infinity ? undefined : ms)
    )

/** Waits for a lease (forever, or up to the timeout) in the current scope. */
export const acquire = (
  spec: LockSpec,
  permits: number,
  timeout: Duration.DurationInput | undefined
): Effect.Effect<Lease, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.flatMap(timeoutMillis(timeout), (ms) =>
    Effect.flatMap(internal.acquire(spec, permits, ms), (lease) =>
      Option.isSome(lease)
        ? Effect.succeed(lease.value)
        // only a zero timeout ends without a grant or a LockTimeout, and it is refused above
        : Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")))

/** One attempt, no waiting. */
export const tryAcquire = (
  spec: LockSpec,
  permits: number
): Effect.Effect<Option.Option<Lease>, AttemptError, Scope.Scope> =>
  // a single attempt never waits, so it never times out
  Effect.catchTag(internal.acquire(spec, permits, 0), "LockTimeout", (e) => Effect.die(e))

/**
 * Runs `body` while holding a lease: the body's own scoped resources close before the release,
 * and the body is interrupted with `LockLost` if the lease is lost.
 */
export const withLease = <A, E, R>(
  body: Effect.Effect<A, E, R>,
  spec: LockSpec,
  permits: number,
  timeout: Duration.DurationInput | undefined
): Effect.Effect<A, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.flatMap(timeoutMillis(timeout), (ms) => internal.withLease(body, spec, permits, ms))

/** The longest remaining time-to-live among the handle's holders. */
export const remainingTtl = (spec: LockSpec): Effect.Effect<Option.Option<Duration.Duration>, BackendError> =>
  Effect.map(holders(spec), (holders) =>
    holders.length === 0 ? Option.none() : Option.some(Duration.millis(Math.max(...holders.map((h) => h.ttlMs)))))

/** How many times the current fiber holds the handle (0 when it does not). */
export const holdCount = (spec: LockSpec): Effect.Effect<number, BackendError> =>
  Effect.flatMap(internal.currentHolder(spec), (holder) =>
    Option.isNone(holder)
      ? Effect.succeed(0)
      : Effect.map(spec.backend.inspect(spec.key), (state) => {
        const mine = state.holders.find((h) => h.holder === holder.value)
        if (mine === undefined) return 0
        return spec.mode === "shared" ? mine.shared : mine.exclusive
      }))

/** The live holders of the handle's view of the key: readers for a read lock or semaphore, writers for a write lock, all for a lock. */
export const holders = (spec: LockSpec): Effect.Effect<ReadonlyArray<HolderState>, BackendError> =>
  Effect.map(
    spec.backend.inspect(spec.key),
    (state) =>
      state.holders.filter((h) =>
        spec.kind === "WriteLock" ? h.exclusive > 0 : spec.kind === "ReadLock" || spec.kind === "Semaphore" ? h.shared > 0 : true
      )
  )
