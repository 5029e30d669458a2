/**
 * The conformance suite every lockstep backend runs: the behaviour of the user-facing API
 * (`Lock`, `FairLock`, `ReadWriteLock`, `Semaphore`) on top of the backend, plus the model-based
 * property test of the backend itself. Call `Conformance.suite` from a vitest test file.
 *
 * @since 0.1.0
 */
import { describe, it } from "@effect/vitest"
import type { Effect, Layer } from "effect"
import type { LockBackend } from "@lockstep/core/LockBackend"
import type { DataLoss } from "./FaultyBackend.js"
import * as closed from "./internal/closedConformance.js"
import * as internal from "./internal/conformance.js"

/**
 * How to run the suite against one backend.
 *
 * @example
 * ```ts
 * import * as Conformance from "@lockstep/testkit/Conformance"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const harness: Conformance.Harness = { name: "memory", layer: MemoryBackend.layer, clock: "test" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Harness {
  /** Shown in the test titles. */
  readonly name: string
  /** Builds a backend; each test builds its own. Tests use fresh random keys, so a shared server is fine. */
  readonly layer: Layer.Layer<LockBackend>
  /**
   * `"test"`: expiry follows Effect's Clock, and the suite drives it with `TestClock`.
   * `"live"`: the backend judges expiry on its own clock; the suite uses short real leases.
   */
  readonly clock: "test" | "live"
  /** Model-based runs (default 200). */
  readonly modelRuns?: number | undefined
  /**
   * A backend that can lose its data on demand (`FaultyBackend.DataLoss`), for the data-loss
   * tests: for a server, a layer whose `wipe` empties it (FLUSHALL, or a restart without
   * persistence). Default: `FaultyBackend.losingData(layer)`, which builds a fresh backend in
   * place of the old one — right for in-process backends, whose state lives in the instance.
   */
  readonly dataLoss?: Layer.Layer<LockBackend | DataLoss> | undefined
  /**
   * `"exclusive"`: the backend supports only exclusive, non-fair locks (a quorum, `RedLock`): the
   * scenarios of `FairLock`, `ReadWriteLock`, `Semaphore`, `CountDownLatch` and `MultiLock` and
   * the model-based runs (which use every kind) are not registered. Default `"all"`.
   */
  readonly kinds?: "all" | "exclusive" | undefined
  /**
   * The hand-off checks: how soon (real milliseconds) after a release its waiter must be let in,
   * for every kind of waiter. The waiters' own retries are 20 seconds apart (on `"test"` the clock
   * stands still), so only the release's wake-up meets it. Default 500 ms: a release, a wake-up
   * and a grant take a few milliseconds to tens of them on a server, and a loaded machine may
   * stall for a while.
   */
  readonly handOffMs?: number | undefined
  /**
   * How the backend's fences grow. `"counter"` (default): a key's fences count up by one per new
   * grant, and `inspect` reports the last one while the backend remembers it. `"gapped"`: each new
   * fence is greater than the last by any amount (ZooKeeper's zxids, which other writes of the
   * ensemble also advance), and `inspect` may report 0 once nobody holds the key.
   */
  readonly fences?: "counter" | "gapped" | undefined
  /**
   * The order waiters of a key are let in. `"fit"` (default): freed capacity goes to every waiter
   * it fits, past one it does not fit (a semaphore waiter for fewer permits, a reader behind a
   * waiting writer). `"fifo"`: waiters are let in in the order they queued, each as soon as it
   * fits: a waiter that does not fit keeps those behind it out (ZooKeeper's recipes).
   */
  readonly order?: "fit" | "fifo" | undefined
}

/**
 * Registers the whole conformance suite for a backend in the current test file.
 *
 * @example
 * ```ts
 * import * as Conformance from "@lockstep/testkit/Conformance"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * Conformance.suite({ name: "memory", layer: MemoryBackend.layer, clock: "test" })
 * ```
 *
 * @since 0.1.0
 * @category suites
 */
export const suite = (harness: Harness): void => {
  describe(`conformance: ${harness.name}`, () => internal.register(harness, harness.clock === "test" ? it.effect : it.live))
}

/**
 * What one call on a closed backend ended with (see `callEveryOperation`): the error it failed
 * with, or a description of how it ended otherwise.
 *
 * @example
 * ```ts
 * import type * as Conformance from "@lockstep/testkit/Conformance"
 *
 * const call: Conformance.ClosedCall = { operation: "acquire", error: "succeeded with {}" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ClosedCall {
  readonly operation: string
  readonly error: unknown
}

/**
 * Calls every operation of a backend once (each bounded by 5 seconds) and answers what each ended
 * with: after the backend's scope closed, each must be the closed-backend `BackendError`
 * (`LockError.isBackendClosed`). The suite's `closed backend` test checks it; a backend's own
 * tests use it for what only that backend has (a borrowed client still open, say).
 * `latches: false` leaves out the latch operations.
 *
 * @example
 * ```ts
 * import { Effect, Exit, Layer, Context, Scope } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { MemoryBackend } from "@lockstep/memory"
 * import * as Conformance from "@lockstep/testkit/Conformance"
 *
 * const afterClose = Effect.gen(function* () {
 *   const scope = yield* Scope.make()
 *   const context = yield* Layer.buildWithScope(MemoryBackend.layer, scope)
 *   yield* Scope.close(scope, Exit.void)
 *   return yield* Conformance.callEveryOperation(Context.get(context, LockBackend), "key")
 * })
 * ```
 *
 * @since 0.1.0
 * @category suites
 */
export const callEveryOperation: (
  service: LockBackend["Type"],
  key: string,
  latches?: boolean
) => Effect.Effect<ReadonlyArray<ClosedCall>> = closed.callEveryOperation
