import type { Scope } from "effect"
import { Duration, Effect, Option } from "effect"
import type { Lease } from "../Lease.js"
import { LockBackend } from "../LockBackend.js"
import type { HolderState } from "../LockBackend.js"
import type { BackendError, LockLost, LockTimeout } from "../LockError.js"
import { InvalidLockOptions } from "../LockError.js"
import type { AcquireOptions, Options, TryAcquireOptions } from "../Lock.js"
import type { AttemptError } from "./acquisition.js"
import { scopedLease } from "./acquisition.js"
import { runUnderLease, runUnderLeaseIfGranted } from "./criticalSection.js"
import * as fiberHolds from "./fiberHolds.js"
import { handleLabels } from "./metrics.js"
import * as validate from "./options.js"
import type { Body, LockKind, LockSpec } from "./spec.js"
import { defaultWaiterTtlMs, defaultWatchdogMs } from "./spec.js"

// the options are the public types (every kind's options extend them), not copies: an option
// added there is in these functions' types at once

/** Validates a handle's options and captures the backend, before any backend call. */
export const makeSpec = (
  kind: LockKind,
  key: string,
  options: Options | undefined,
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
      defaultWatchdogMs
    const waiterTtlMs = (yield* validate.optionalMillis("waiterTimeout", options?.waiterTimeout)) ??
      defaultWaiterTtlMs
    const name = yield* validate.name(options?.name)
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
      waiterTtlMs,
      name,
      labels: handleLabels(kind, name)
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
  options: AcquireOptions | undefined
): Effect.Effect<Lease, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.flatMap(timeoutMillis(options?.timeout), (ms) =>
    Effect.flatMap(scopedLease(spec, permits, ms, options?.retry), (lease) =>
      Option.isSome(lease)
        ? Effect.succeed(lease.value)
        // only a zero timeout ends without a grant or a LockTimeout, and it is refused above
        : Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")))

/** How long a try may wait: a single attempt (0) unless `wait` (positive, finite) says otherwise. */
export const waitMillis = (wait: Duration.DurationInput | undefined): Effect.Effect<number, InvalidLockOptions> =>
  wait === undefined ? Effect.succeed(0) : validate.millis("wait", wait)

/** One attempt, or waiting at most `wait`: `None` if the lock was not granted. */
export const tryAcquire = (
  spec: LockSpec,
  permits: number,
  options: TryAcquireOptions | undefined
): Effect.Effect<Option.Option<Lease>, AttemptError, Scope.Scope> =>
  Effect.flatMap(waitMillis(options?.wait), (ms) =>
    Effect.catchTag(scopedLease(spec, permits, ms, options?.retry), "LockTimeout", () => Effect.succeedNone))

/**
 * Runs `body` while holding a lease: the body's own scoped resources close before the release,
 * and the body is interrupted with `LockLost` if the lease is lost.
 */
export const withLease = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  options: AcquireOptions | undefined
): Effect.Effect<A, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  options?.timeout === undefined
    ? runUnderLease(body, spec, permits, undefined, options?.retry)
    : Effect.flatMap(timeoutMillis(options.timeout), (ms) => runUnderLease(body, spec, permits, ms, options.retry))

/** Runs `body` under a lease if one is granted at once (or within `wait`): `Some` of its result, else `None`. */
export const withLeaseIfAvailable = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  options: TryAcquireOptions | undefined
): Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.flatMap(waitMillis(options?.wait), (ms) => runUnderLeaseIfGranted(body, spec, permits, ms, options?.retry))

/** Whether the current fiber holds the handle, from its own records. */
export const isHeldByCurrentFiber = (spec: LockSpec): Effect.Effect<boolean> => fiberHolds.isHeldByCurrentFiber(spec)

/** The longest remaining time-to-live among the handle's holders. */
export const remainingTtl = (spec: LockSpec): Effect.Effect<Option.Option<Duration.Duration>, BackendError> =>
  Effect.map(holders(spec), (holders) =>
    holders.length === 0 ? Option.none() : Option.some(Duration.millis(Math.max(...holders.map((h) => h.ttlMs)))))

/** How many times the current fiber holds the handle (0 when it does not). */
export const holdCount = (spec: LockSpec): Effect.Effect<number, BackendError> =>
  Effect.flatMap(fiberHolds.currentHolder(spec), (holder) =>
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
