/**
 * `RedLock`: a lock backend made of N independent backends (the algorithm of the Redis
 * "distlock" page and Redisson's `RedissonRedLock`), so that a lock outlives the loss of any
 * minority of them. Every `Lock` made under `RedLock.layer(...)` uses it unchanged.
 *
 * A hold is granted when a majority of nodes granted it with time left on the lease, renewed while
 * a majority still holds it, and released on every node; its fence increases under the
 * algorithm's own assumption (a majority keeps its state). `FairLock`, `ReadWriteLock`,
 * `Semaphore` and `CountDownLatch` are refused at `make` (`InvalidLockOptions`, field `kind`);
 * when too few nodes answer to decide, an operation fails with a `BackendError` whose `cause` is
 * a `QuorumNotReached`. Each operation step by step, and the algorithm's assumptions (independent
 * nodes, restarts that keep their data, clocks at about the same rate), are in the README
 * ("RedLock").
 *
 * @since 0.1.0
 */
import { Context, Duration, Effect, Layer } from "effect"
import { LockBackend } from "./LockBackend.js"
import type { Service } from "./LockBackend.js"
import { InvalidLockOptions } from "./LockError.js"
import { makeLifecycle } from "./internal/backendKit.js"
import * as internal from "./internal/redLock.js"
import * as validate from "./internal/options.js"

/**
 * How a RedLock waits for its nodes.
 *
 * @example
 * ```ts
 * import type { RedLock } from "@lockstep/core"
 *
 * const options: RedLock.Options = { nodeTimeout: "100 millis", retryJitter: "50 millis" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** The longest a node may take to answer one call; a node slower than that counts as failed. Default 200 ms. */
  readonly nodeTimeout?: Duration.DurationInput | undefined
  /** The longest random wait before trying again after contenders split the nodes. Default 50 ms. */
  readonly retryJitter?: Duration.DurationInput | undefined
}

/**
 * The default per-node time limit: 200 ms.
 *
 * @example
 * ```ts
 * import { Duration } from "effect"
 * import { RedLock } from "@lockstep/core"
 *
 * console.log(Duration.toMillis(RedLock.defaultNodeTimeout)) // 200
 * ```
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultNodeTimeout: Duration.Duration = Duration.millis(200)

/**
 * The default longest random wait after a split: 50 ms.
 *
 * @example
 * ```ts
 * import { Duration } from "effect"
 * import { RedLock } from "@lockstep/core"
 *
 * console.log(Duration.toMillis(RedLock.defaultRetryJitter)) // 50
 * ```
 *
 * @since 0.1.0
 * @category constants
 */
export const defaultRetryJitter: Duration.Duration = Duration.millis(50)

/**
 * A backend over `nodes` (at least three independent backends; a majority of them decides).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend, RedLock } from "@lockstep/core"
 *
 * const quorumOf = (nodes: ReadonlyArray<LockBackend.Service>) =>
 *   Effect.map(RedLock.make(nodes, { nodeTimeout: "100 millis" }), (backend) => backend.clientId)
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (nodes: ReadonlyArray<Service>, options?: Options): Effect.Effect<Service, InvalidLockOptions> =>
  Effect.map(validated(nodes, options), (settings) => internal.make(nodes, settings))

const validated = (nodes: ReadonlyArray<Service>, options: Options | undefined): Effect.Effect<internal.Settings, InvalidLockOptions> =>
  Effect.gen(function*() {
    if (nodes.length < 3) {
      return yield* new InvalidLockOptions({
        field: "nodes",
        reason: `a quorum needs at least 3 independent backends, got ${nodes.length}`
      })
    }
    const nodeTimeoutMs = (yield* validate.optionalMillis("nodeTimeout", options?.nodeTimeout)) ?? Duration.toMillis(defaultNodeTimeout)
    const retryJitterMs = (yield* validate.optionalMillis("retryJitter", options?.retryJitter)) ?? Duration.toMillis(defaultRetryJitter)
    return { nodeTimeoutMs, retryJitterMs: Math.max(1, Math.round(retryJitterMs)) }
  })

/**
 * The `LockBackend` of a quorum over backend layers, each built on its own (two Redis servers
 * and more, each with its own connection).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, RedLock } from "@lockstep/core"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const Quorum = RedLock.layer([
 *   RedisBackend.layerFrom("redis://10.0.0.1:6379"),
 *   RedisBackend.layerFrom("redis://10.0.0.2:6379"),
 *   RedisBackend.layerFrom("redis://10.0.0.3:6379")
 * ])
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("invoices:2026-11")
 *   yield* Effect.log("closing the month").pipe(Lock.withLock(lock))
 * }).pipe(Effect.provide(Quorum))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = <E, R>(
  nodes: ReadonlyArray<Layer.Layer<LockBackend, E, R>>,
  options?: Options
): Layer.Layer<LockBackend, E | InvalidLockOptions, R> =>
  Layer.scoped(
    LockBackend,
    Effect.gen(function*() {
      const services = yield* Effect.forEach(nodes, (node) => Effect.map(Layer.build(node), Context.get(LockBackend)), {
        concurrency: "unbounded"
      })
      const settings = yield* validated(services, options)
      // closed before the nodes: a call after the layer ended says the quorum is closed
      const lifecycle = makeLifecycle({ backend: "RedLock backend" })
      yield* lifecycle.closeWithScope
      return internal.make(services, settings, lifecycle)
    })
  )
