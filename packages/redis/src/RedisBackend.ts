/**
 * The Redis backend of lockstep, on ioredis. Every operation is one Lua script (EVALSHA, loaded
 * on NOSCRIPT) judged on the server's clock; all keys of a lock share its cluster slot, so it
 * works on Redis Cluster. The re-entrant `Lock` keeps Redisson's RLock layout, so a Redisson
 * process and a lockstep process exclude each other on the same name.
 *
 * Waiters of one backend share one subscriber connection; a release wakes one of them (for a fair
 * lock: the head of the queue). Watchdog renewals that fall due together leave in one script.
 *
 * @since 0.1.0
 */
import type { Duration, Scope } from "effect"
import { Config, Effect, Layer } from "effect"
import type { ConfigError } from "effect/ConfigError"
import { Cluster, Redis } from "ioredis"
import type { ClusterNode, ClusterOptions, RedisOptions } from "ioredis"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError } from "@lockstep/core/LockError"
import * as internal from "./internal/redisBackend.js"

/**
 * A connection: a single server (`Redis`) or a cluster (`Cluster`).
 *
 * @example
 * ```ts
 * import { Redis } from "ioredis"
 * import type { RedisBackend } from "@lockstep/redis"
 *
 * const client: RedisBackend.Client = new Redis("redis://127.0.0.1:6379")
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Client = Redis | Cluster

/**
 * Tuning shared by every constructor.
 *
 * @example
 * ```ts
 * import type { RedisBackend } from "@lockstep/redis"
 *
 * const tuning: RedisBackend.Tuning = { commandTimeout: "1 second" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Tuning {
  /**
   * Every Redis call that takes longer fails with `BackendError`, so a silent server never stalls
   * a holder past its lease. Default 2 seconds.
   */
  readonly commandTimeout?: Duration.DurationInput | undefined
  /** Most renewals sent in one script. Default 1000. */
  readonly renewBatchSize?: number | undefined
}

/**
 * Options of `layer`: an existing client, which the backend borrows and never closes.
 *
 * @example
 * ```ts
 * import { Redis } from "ioredis"
 * import type { RedisBackend } from "@lockstep/redis"
 *
 * const options: RedisBackend.Options = { client: new Redis() }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options extends Tuning {
  readonly client: Client
}

/**
 * What `layerFrom` connects to: a URL, ioredis options, or the nodes of a cluster.
 *
 * @example
 * ```ts
 * import type { RedisBackend } from "@lockstep/redis"
 *
 * const single: RedisBackend.Connection = "redis://127.0.0.1:6379"
 * const cluster: RedisBackend.Connection = { cluster: [{ host: "127.0.0.1", port: 7000 }] }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Connection =
  | string
  | RedisOptions
  | { readonly cluster: ReadonlyArray<ClusterNode>; readonly options?: ClusterOptions | undefined }

/**
 * The backend on an existing client (borrowed: closing the scope does not close it). A duplicate
 * connection carries the waiters' subscriptions and is closed with the scope.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Redis } from "ioredis"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const program = Effect.gen(function* () {
 *   const backend = yield* RedisBackend.make({ client: new Redis() })
 *   return backend.clientId
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (options: Options): Effect.Effect<Service, never, Scope.Scope> =>
  internal.make(options.client, options)

/**
 * Provides `LockBackend` on an existing ioredis client.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Redis } from "ioredis"
 * import { Lock } from "@lockstep/core"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   yield* Effect.log("exclusive").pipe(Lock.withLock(lock))
 * }).pipe(Effect.provide(RedisBackend.layer({ client: new Redis() })))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options): Layer.Layer<LockBackend> => Layer.scoped(LockBackend, make(options))

const connect = (connection: Connection): Effect.Effect<Client, BackendError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.try({
      try: (): Client => {
        const client: Client = typeof connection === "string"
          ? new Redis(connection, { maxRetriesPerRequest: 2 })
          : "cluster" in connection
          ? new Cluster([...connection.cluster], connection.options)
          : new Redis({ maxRetriesPerRequest: 2, ...connection })
        // failures reach callers as BackendError (timeouts, rejected calls); not as unhandled events
        client.on("error", () => undefined)
        return client
      },
      catch: (cause) => new BackendError({ operation: "connect", cause })
    }),
    (client) => Effect.sync(() => client.disconnect())
  )

/**
 * Provides `LockBackend` on connections the layer opens and closes itself.
 *
 * @example
 * ```ts
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const single = RedisBackend.layerFrom("redis://127.0.0.1:6379")
 * const cluster = RedisBackend.layerFrom({ cluster: [{ host: "127.0.0.1", port: 7000 }] })
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFrom = (connection: Connection, tuning?: Tuning): Layer.Layer<LockBackend, BackendError> =>
  Layer.scoped(LockBackend, Effect.flatMap(connect(connection), (client) => internal.make(client, tuning)))

/**
 * Provides `LockBackend` on a connection to the URL in `REDIS_URL` (or the config given), opened
 * and closed by the layer.
 *
 * @example
 * ```ts
 * import { Config } from "effect"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const fromEnv = RedisBackend.layerConfig()
 * const custom = RedisBackend.layerConfig(Config.string("LOCKS_REDIS_URL"))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  url: Config.Config<string> = Config.string("REDIS_URL"),
  tuning?: Tuning
): Layer.Layer<LockBackend, BackendError | ConfigError> =>
  Layer.unwrapEffect(Effect.map(url, (value) => layerFrom(value, tuning)))
