import type { Scope } from "effect"
import { Duration, Effect, Option } from "effect"
import type { Lease } from "../Lease.js"
import { LockBackend } from "../LockBackend.js"
import type { HolderState } from "../LockBackend.js"
import type { BackendError, LockLost, LockTimeout } from "../LockError.js"
import { InvalidLockOptions } from "../LockError.js"
import type { AcquireOptions, Options, TryAcquireOptions } from "../Lock.js"
import type { AttemptError, Waiting } from "./acquisition.js"
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

/** How long an acquisition may wait in ms: `Infinity` (forever) without a timeout, or for an infinite one. */
export const timeoutMillis = (timeout: Duration.DurationInput | undefined): Effect.Effect<number, InvalidLockOptions> =>
  timeout === undefined ? succeedInfinity : validate.millis("timeout", timeout, { allowInfinite: true })

const succeedInfinity = Effect.succeed(Infinity)

// the options' usual case, shared rather than made per call
const waitForever: Waiting = { singleAttempt: false, timeoutMs: Infinity, retry: undefined }
const succeedWaitForever = Effect.succeed(waitForever)
const succeedTryOnce = Effect.succeed<Waiting>({ singleAttempt: true, timeoutMs: 0, retry: undefined })

/** A waiting acquisition: up to `timeout` (positive; forever without one). */
export const waitingOf = (options: AcquireOptions | undefined): Effect.Effect<Waiting, InvalidLockOptions> =>
  options?.timeout === undefined && options?.retry === undefined
    ? succeedWaitForever
    : Effect.map(timeoutMillis(options.timeout), (timeoutMs) => ({ singleAttempt: false, timeoutMs, retry: options.retry }))

/** A try: a single attempt, or (with `wait`, positive and finite) waiting at most that long. */
export const tryingOf = (options: TryAcquireOptions | undefined): Effect.Effect<Waiting, InvalidLockOptions> => {
  if (options?.wait === undefined) {
    return options?.retry === undefined
      ? succeedTryOnce
      : Effect.succeed({ singleAttempt: true, timeoutMs: 0, retry: options.retry })
  }
  return Effect.map(validate.millis("wait", options.wait), (timeoutMs) => ({ singleAttempt: false, timeoutMs, retry: options.retry }))
}

/** Waits for a lease (forever, or up to the timeout) in the current scope. */
export const acquire = (
  spec: LockSpec,
  permits: number,
  options: AcquireOptions | undefined
): Effect.Effect<Lease, AttemptError | LockTimeout, Scope.Scope> =>
  Effect.flatMap(waitingOf(options), (waiting) =>
    Effect.flatMap(scopedLease({ spec, permits, ...waiting }), (lease) =>
      Option.isSome(lease)
        ? Effect.succeed(lease.value)
        // only a single attempt ends without a grant or a LockTimeout, and this never makes one
        : Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")))

/** One attempt, or waiting at most `wait`: `None` if the lock was not granted. */
export const tryAcquire = (
  spec: LockSpec,
  permits: number,
  options: TryAcquireOptions | undefined
): Effect.Effect<Option.Option<Lease>, AttemptError, Scope.Scope> =>
  Effect.flatMap(tryingOf(options), (waiting) =>
    Effect.catchTag(scopedLease({ spec, permits, ...waiting }), "LockTimeout", () => Effect.succeedNone))

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
  // no timeout, the usual case: nothing to validate, no step of its own
  options?.timeout === undefined
    ? runUnderLease(body, { spec, permits, singleAttempt: false, timeoutMs: Infinity, retry: options?.retry })
    : Effect.flatMap(waitingOf(options), (waiting) => runUnderLease(body, { spec, permits, ...waiting }))

/** Runs `body` under a lease if one is granted at once (or within `wait`): `Some` of its result, else `None`. */
export const withLeaseIfAvailable = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  options: TryAcquireOptions | undefined
): Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.flatMap(tryingOf(options), (waiting) => runUnderLeaseIfGranted(body, { spec, permits, ...waiting }))

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
