/**
 * `RedLock`: a lock backend made of N independent backends (the algorithm of the Redis
 * "distlock" page and Redisson's `RedissonRedLock`), so that a lock outlives the loss of any
 * minority of them. Every `Lock` made under `RedLock.layer(...)` uses it unchanged.
 *
 * - Acquire: the request goes to every node at once, each call limited to `nodeTimeout` (far
 *   below the lease). The hold is granted iff a majority granted it and the lease still has time
 *   left after the attempt (`lease - elapsed - drift > 0`, on the monotonic clock; drift is 1% of
 *   the lease + 5 ms, as the lease's own deadline gives away). Otherwise it is given back on the
 *   nodes that granted it and those that did not answer, and the attempt is denied; when a majority could be
 *   free at once (contenders split the nodes), the attempt first waits a random while of up to
 *   `retryJitter`, so that they do not split again.
 * - Renewal (the watchdog, batched per backend as always) needs a majority of nodes that still
 *   hold: when a majority no longer holds, the lease is lost (`LockLost(NotHeld)`); when too few
 *   answer, the renewal fails and the lease is lost at its deadline (`LockLost(DeadlinePassed)`).
 * - Release goes to every node. Waiters wake on the first release signal of any node.
 * - Fences: strictly increasing per key under the algorithm's own assumption (a majority keeps
 *   its state). A new grant's fence is the greatest fence the granting nodes issued, and before
 *   the lease is handed out every granting node raises its key's fence floor to it (one more
 *   parallel round trip; the grant needs a majority of nodes that granted *and* raised). Any later
 *   majority shares a node with that one, that node granted later, so above the floor: the later
 *   fence is greater.
 * - Kinds a quorum cannot make sound are refused at `make` with `InvalidLockOptions` (field
 *   `kind`): `FairLock` (no common queue), `ReadWriteLock` and `Semaphore` (no common count of
 *   shared holds), `CountDownLatch` (a count is not a lock). `Lock` and `MultiLock` work.
 * - When too few nodes answer to decide, an operation fails with `BackendError` whose `cause` is
 *   a `QuorumNotReached` naming what each node answered.
 *
 * Assumptions (those of the algorithm): nodes are independent (no replication between them), a
 * node that restarts keeps its data (AOF with `fsync always`) or stays down for longer than a
 * lease, and clocks advance at about the same rate. A node that comes back empty while a lease is
 * held lets a second holder in as soon as it and the holder's other nodes make up a majority for
 * someone else: with three nodes, one empty node and one that the holder's lease expired on.
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
