/**
 * Deliberately broken backends for negative tests: wrap a correct `LockBackend` service (or the
 * layer that builds it) so that it lies or fails, and check that the model check, the history
 * checker or the lock API notices.
 *
 * Every fault comes in two shapes: a `Service => Service` function, and a `Layer => Layer`
 * function (suffix `Layer`) that wraps the `LockBackend` a layer provides.
 *
 * @since 0.1.0
 */
import type { Duration } from "effect"
import { Context, Effect, ExecutionStrategy, Exit, Layer, Random, Ref, Scope } from "effect"
import type { AcquireResult, Service } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import { BackendError } from "@lockstep/core/LockError"

/**
 * Turns a `Service => Service` wrapper into one over layers providing `LockBackend`.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const broken = FaultyBackend.wrap(FaultyBackend.grantTwice)(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category combinators
 */
export const wrap = (f: (service: Service) => Service) =>
<E, R>(layer: Layer.Layer<LockBackend, E, R>): Layer.Layer<LockBackend, E, R> =>
  Layer.effect(LockBackend, Effect.map(LockBackend, f)).pipe(Layer.provide(layer))

/**
 * A backend that grants an exclusive lock twice: an exclusive acquisition the wrapped backend
 * denies is reported `Granted` with a fresh-looking fence (the key's last fence + 1) and count 1,
 * although nothing was granted.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { FaultyBackend } from "@lockstep/testkit"
 *
 * const liar = Effect.map(LockBackend, FaultyBackend.grantTwice)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const grantTwice = (backend: Service): Service => ({
  ...backend,
  acquire: (request) =>
    Effect.flatMap(backend.acquire(request), (result) =>
      result._tag === "Denied" && request.mode === "exclusive"
        ? Effect.map(
          backend.inspect(request.key),
          (state): AcquireResult => ({ _tag: "Granted", fence: state.fence + 1, count: 1 })
        )
        : Effect.succeed(result))
})

/**
 * `grantTwice` over a layer.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const broken = FaultyBackend.grantTwiceLayer(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const grantTwiceLayer: <E, R>(layer: Layer.Layer<LockBackend, E, R>) => Layer.Layer<LockBackend, E, R> =
  wrap(grantTwice)

/**
 * A backend whose releases do nothing: a release reports success (the count the holder would
 * have left, or 0 where the real backend would say `NotHeld`) while the hold stays until it
 * expires.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { FaultyBackend } from "@lockstep/testkit"
 *
 * const sticky = Effect.map(LockBackend, FaultyBackend.ignoreRelease)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const ignoreRelease = (backend: Service): Service => ({
  ...backend,
  release: (request) =>
    Effect.map(backend.inspect(request.key), (state) => {
      const hold = state.holders.find((h) => h.holder === request.holder)
      const count = hold === undefined ? 0 : request.mode === "exclusive" ? hold.exclusive : hold.shared
      return Math.max(0, count - 1)
    })
})

/**
 * `ignoreRelease` over a layer.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const sticky = FaultyBackend.ignoreReleaseLayer(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const ignoreReleaseLayer: <E, R>(layer: Layer.Layer<LockBackend, E, R>) => Layer.Layer<LockBackend, E, R> =
  wrap(ignoreRelease)

/**
 * A backend operation that `failing` can break.
 *
 * @example
 * ```ts
 * import type { FaultyBackend } from "@lockstep/testkit"
 *
 * const op: FaultyBackend.Operation = "renew"
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Operation =
  | "acquire"
  | "release"
  | "renew"
  | "inspect"
  | "forceRelease"
  | "raiseFence"
  | "cancel"
  | "subscribe"
  | "latchSetCount"
  | "latchCountDown"
  | "latchCount"
  | "latchSubscribe"

/** Wraps every operation of `backend` in `around`, which is told which operation it wraps. */
const eachOperation = (
  backend: Service,
  around: <A, E, R>(operation: Operation, effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | BackendError, R>
): Service => ({
  clientId: backend.clientId,
  unsupported: backend.unsupported,
  acquire: (request) => around("acquire", backend.acquire(request)),
  release: (request) => around("release", backend.release(request)),
  renew: (requests) => around("renew", backend.renew(requests)),
  inspect: (key) => around("inspect", backend.inspect(key)),
  forceRelease: (request) => around("forceRelease", backend.forceRelease(request)),
  raiseFence: (request) => around("raiseFence", backend.raiseFence(request)),
  cancel: (request) => around("cancel", backend.cancel(request)),
  subscribe: (key, holder, mode) => around("subscribe", backend.subscribe(key, holder, mode)),
  latchSetCount: (request) => around("latchSetCount", backend.latchSetCount(request)),
  latchCountDown: (request) => around("latchCountDown", backend.latchCountDown(request)),
  latchCount: (key) => around("latchCount", backend.latchCount(key)),
  latchSubscribe: (key, waiter) => around("latchSubscribe", backend.latchSubscribe(key, waiter))
})

/**
 * Which calls `failing` breaks, and how.
 *
 * @example
 * ```ts
 * import type { FaultyBackend } from "@lockstep/testkit"
 *
 * // every third acquisition is carried out, but its reply is lost
 * const options: FaultyBackend.FailingOptions = {
 *   operation: "acquire",
 *   when: (call) => call % 3 === 0,
 *   timing: "after"
 * }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface FailingOptions {
  /** The operation(s) to break. */
  readonly operation: Operation | ReadonlyArray<Operation>
  /**
   * A probability in [0, 1] (drawn from Effect's `Random`, so a seeded `Random` makes runs
   * repeatable), or a predicate on the 1-based number of the call of that operation on this
   * wrapped service.
   */
  readonly when: number | ((call: number) => boolean)
  /**
   * `"before"` (default): the call never reaches the backend. `"after"`: the backend carries it
   * out and then the reply is lost — the caller sees `BackendError` although the operation
   * happened (the hard case: a grant the caller does not know it holds).
   */
  readonly timing?: "before" | "after" | undefined
}

/**
 * A backend whose chosen operations fail with `BackendError` (cause: `Error("injected fault")`).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { FaultyBackend } from "@lockstep/testkit"
 *
 * const flaky = Effect.map(LockBackend, FaultyBackend.failing({ operation: "renew", when: 0.2 }))
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const failing = (options: FailingOptions) => (backend: Service): Service => {
  const operations: ReadonlyArray<Operation> = typeof options.operation === "string"
    ? [options.operation]
    : options.operation
  const calls = new Map<Operation, Ref.Ref<number>>(operations.map((op) => [op, Ref.unsafeMake(0)]))
  const when = options.when
  const decide = (call: number): Effect.Effect<boolean> =>
    typeof when === "number" ? Effect.map(Random.next, (x) => x < when) : Effect.sync(() => when(call))
  const inject = <A, E, R>(operation: Operation, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | BackendError, R> => {
    const counter = calls.get(operation)
    if (counter === undefined) return effect
    return Effect.gen(function*() {
      const call = yield* Ref.updateAndGet(counter, (n) => n + 1)
      if (!(yield* decide(call))) return yield* effect
      if (options.timing === "after") yield* Effect.exit(effect)
      return yield* Effect.fail(new BackendError({ operation, cause: new Error("injected fault") }))
    })
  }
  return eachOperation(backend, inject)
}

/**
 * `failing` over a layer; each build of the layer counts calls afresh.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const flaky = FaultyBackend.failingLayer({ operation: ["acquire", "release"], when: 0.1 })(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const failingLayer = (
  options: FailingOptions
): <E, R>(layer: Layer.Layer<LockBackend, E, R>) => Layer.Layer<LockBackend, E, R> =>
  wrap(failing(options))

/**
 * Which calls `duplicating` delivers twice, and how.
 *
 * @example
 * ```ts
 * import type { FaultyBackend } from "@lockstep/testkit"
 *
 * // every release runs twice; the caller sees the second run's reply (as after an ioredis resend)
 * const options: FaultyBackend.DuplicatingOptions = { operation: "release", when: 1 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface DuplicatingOptions {
  /** The operation(s) to deliver twice (reads and subscriptions are not state changes and are never duplicated). */
  readonly operation: Operation | ReadonlyArray<Operation>
  /** A probability in [0, 1] (from Effect's `Random`), or a predicate on the 1-based call number of that operation. */
  readonly when: number | ((call: number) => boolean)
  /**
   * `undefined` (default): the copy runs right after the original and the caller gets the copy's
   * reply, as when a client library re-sends a command whose reply was lost. A duration: the
   * caller gets the original's reply and the copy arrives that much later, in the background (a
   * late copy).
   */
  readonly copyAfter?: Duration.DurationInput | undefined
}

/**
 * A backend that delivers chosen operations twice: at-least-once delivery. A correct backend
 * changes its state once, and its caller cannot tell.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { FaultyBackend } from "@lockstep/testkit"
 *
 * const twice = Effect.map(LockBackend, FaultyBackend.duplicating({ operation: ["acquire", "release"], when: 1 }))
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const duplicating = (options: DuplicatingOptions) => (backend: Service): Service => {
  const operations: ReadonlyArray<Operation> = typeof options.operation === "string"
    ? [options.operation]
    : options.operation
  const calls = new Map<Operation, number>()
  const when = options.when
  const decide = (operation: Operation): Effect.Effect<boolean> =>
    Effect.suspend(() => {
      if (!operations.includes(operation)) return Effect.succeed(false)
      const call = (calls.get(operation) ?? 0) + 1
      calls.set(operation, call)
      return typeof when === "number" ? Effect.map(Random.next, (x) => x < when) : Effect.sync(() => when(call))
    })
  const twice = <A, E, R>(operation: Operation, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    // reads and subscriptions change no state: nothing to deliver twice
    operation === "inspect" || operation === "subscribe" || operation === "latchCount" || operation === "latchSubscribe"
      ? effect
      : Effect.flatMap(decide(operation), (copy) => {
        if (!copy) return effect
        if (options.copyAfter === undefined) return Effect.zipRight(Effect.exit(effect), effect)
        const late = Effect.delay(Effect.exit(effect), options.copyAfter)
        return Effect.tap(effect, () => Effect.forkDaemon(late))
      })
  return eachOperation(backend, twice)
}

/**
 * `duplicating` over a layer.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const twice = FaultyBackend.duplicatingLayer({ operation: "release", when: 1 })(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const duplicatingLayer = (
  options: DuplicatingOptions
): <E, R>(layer: Layer.Layer<LockBackend, E, R>) => Layer.Layer<LockBackend, E, R> =>
  wrap(duplicating(options))

/**
 * A backend whose chosen operations take `delay` before they reach the wrapped backend, so an
 * interruption or a timeout can land while a call is in flight. The delay is part of the call:
 * callers that run a call uninterruptibly wait it out too, as they would for a slow network.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { FaultyBackend } from "@lockstep/testkit"
 *
 * const slow = Effect.map(LockBackend, FaultyBackend.slow({ operation: "acquire", delay: "200 millis" }))
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const slow = (options: {
  readonly operation: Operation | ReadonlyArray<Operation>
  readonly delay: Duration.DurationInput
}) =>
(backend: Service): Service => {
  const operations: ReadonlyArray<Operation> = typeof options.operation === "string"
    ? [options.operation]
    : options.operation
  const delayed = <A, E, R>(operation: Operation, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    operations.includes(operation) ? Effect.delay(effect, options.delay) : effect
  return eachOperation(backend, delayed)
}

/**
 * `slow` over a layer.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const slowLayer = FaultyBackend.slowLayer({ operation: "acquire", delay: "100 millis" })(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const slowLayer = (options: {
  readonly operation: Operation | ReadonlyArray<Operation>
  readonly delay: Duration.DurationInput
}): <E, R>(layer: Layer.Layer<LockBackend, E, R>) => Layer.Layer<LockBackend, E, R> => wrap(slow(options))

/**
 * Control over a backend that can lose its data: `wipe` throws the current backend instance away
 * and builds a fresh one in its place, as a Redis server restarted without persistence (or
 * FLUSHALL) would. Holders keep their identities; the new instance knows nothing of them.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { FaultyBackend } from "@lockstep/testkit"
 *
 * const loseEverything = Effect.flatMap(FaultyBackend.DataLoss, (control) => control.wipe)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export class DataLoss extends Context.Tag("@lockstep/testkit/FaultyBackend/DataLoss")<
  DataLoss,
  { readonly wipe: Effect.Effect<void> }
>() {}

/**
 * A `LockBackend` built by `layer` that can lose all its data on demand (`DataLoss.wipe`). The
 * service keeps the first instance's `clientId`; operations go to the current instance.
 *
 * @example
 * ```ts
 * import { FaultyBackend } from "@lockstep/testkit"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const forgetful = FaultyBackend.losingData(MemoryBackend.layer)
 * ```
 *
 * @since 0.1.0
 * @category faults
 */
export const losingData = <E>(layer: Layer.Layer<LockBackend, E>): Layer.Layer<LockBackend | DataLoss, E> =>
  Layer.scopedContext(Effect.gen(function*() {
    const outer = yield* Effect.scope
    const build = Effect.gen(function*() {
      const scope = yield* Scope.fork(outer, ExecutionStrategy.sequential)
      const context = yield* Layer.buildWithScope(layer, scope)
      return { scope, service: Context.get(context, LockBackend) }
    })
    let current = yield* build
    const wipe = Effect.gen(function*() {
      const next = yield* Effect.orDie(build)
      const previous = current
      current = next
      yield* Scope.close(previous.scope, Exit.void)
    })
    // every call goes to the instance current when it runs
    const service: Service = {
      clientId: current.service.clientId,
      acquire: (request) => Effect.suspend(() => current.service.acquire(request)),
      release: (request) => Effect.suspend(() => current.service.release(request)),
      renew: (requests) => Effect.suspend(() => current.service.renew(requests)),
      inspect: (key) => Effect.suspend(() => current.service.inspect(key)),
      forceRelease: (request) => Effect.suspend(() => current.service.forceRelease(request)),
      raiseFence: (request) => Effect.suspend(() => current.service.raiseFence(request)),
      cancel: (request) => Effect.suspend(() => current.service.cancel(request)),
      subscribe: (key, holder, mode) => Effect.suspend(() => current.service.subscribe(key, holder, mode)),
      latchSetCount: (request) => Effect.suspend(() => current.service.latchSetCount(request)),
      latchCountDown: (request) => Effect.suspend(() => current.service.latchCountDown(request)),
      latchCount: (key) => Effect.suspend(() => current.service.latchCount(key)),
      latchSubscribe: (key, waiter) => Effect.suspend(() => current.service.latchSubscribe(key, waiter))
    }
    return Context.make(LockBackend, service).pipe(Context.add(DataLoss, { wipe }))
  }))
