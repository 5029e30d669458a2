/**
 * The Redis backend of lockstep, on ioredis. Every operation is one Lua script (EVALSHA, loaded
 * on NOSCRIPT) judged on the server's clock; all keys of a lock share its cluster slot, so it
 * works on Redis Cluster. The re-entrant `Lock` keeps Redisson's RLock layout, so a Redisson
 * process and a lockstep process exclude each other on the same name.
 *
 * Waiters of one backend share one subscriber connection; a release wakes one of them (for a fair
 * lock: the head of the queue). Watchdog renewals that fall due together leave in one script.
 *
 * Every `BackendError` names the endpoint (`Redis host:port`, the socket path, or the cluster's
 * startup nodes) and, while a connection is down, the last error ioredis reported for it
 * (`connect ECONNREFUSED ...`, `WRONGPASS ...`); its `cause` is what the call itself failed with.
 * An outage is logged once (a warning with the endpoint and the error, then "reconnected"), not
 * once per failing call. The backend listens to its connections' 'error' events, so ioredis never
 * prints "Unhandled error event" for them.
 *
 * A backend closes with the layer (or scope) that made it, also where the client is borrowed and
 * stays open: a handle used after that fails with a `BackendError` whose `cause` is
 * `LockError.BackendClosed` (`LockError.isBackendClosed`), and a waiter blocked at the close fails
 * at once. Nothing of the backend keeps the process alive once it is closed.
 *
 * @since 0.1.0
 */
import type { Duration, Scope } from "effect"
import { Config, Effect, Layer } from "effect"
import type { ConfigError } from "effect/ConfigError"
import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from "ioredis"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import * as tracking from "./internal/connection.js"
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
   * a holder past its lease. Once a call has waited that long on a connection that is down,
   * later calls on it fail at once until it is back: an outage stalls a caller for one timeout,
   * not one per call it makes. Default 2 seconds.
   */
  readonly commandTimeout?: Duration.DurationInput | undefined
  /** Most renewals sent in one script. Default 1000. */
  readonly renewBatchSize?: number | undefined
  /**
   * The failover quarantine (off by default): after the server was promoted from a replica, or
   * restarted (its data may be gone), it makes no new grant until every lease an earlier
   * incarnation may have granted has run out, i.e. for `longestLease` (default 30 seconds, the
   * default watchdog) from the promotion as the server first sees it, or from the restart.
   * `longestLease` must cover the longest lease or watchdog of every client of the server: an
   * acquisition asking for a longer one fails with `InvalidLockOptions`. Re-entries and renewals
   * of holds the server has are not held back. Single servers and Sentinel-managed masters; a
   * Redis Cluster refuses it (`InvalidLockOptions`). See the README's "Replicas and failover".
   */
  readonly quarantine?: { readonly longestLease?: Duration.DurationInput | undefined } | undefined
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
 * connection, opened when a first waiter subscribes, carries the waiters' subscriptions and is
 * closed with the scope. Nothing is sent to the server here: an unreachable server shows in the
 * first calls (as `BackendError`).
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
  Effect.flatMap(tracking.track(options.client, options), (tracker) => build(options.client, options, tracker))

/** The backend on `client`, which `tracker` follows; outages are logged while the scope is open. */
const build = (
  client: Client,
  tuning: Tuning | undefined,
  tracker: tracking.Tracker
): Effect.Effect<Service, never, Scope.Scope> =>
  Effect.zipRight(
    Effect.forkScoped(tracker.report),
    Effect.map(internal.make(client, tuning, tracker), tracker.locateAll)
  )

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

/**
 * Provides `LockBackend` on connections the layer opens and closes itself.
 *
 * Building the layer checks the server: one PING, within the command timeout or until ioredis
 * gives up, whichever comes first. An unreachable server, a refused password or a bad URL fails
 * the layer with `BackendError` (operation `"connect"`) naming the endpoint and the cause, e.g.
 * `lock backend failed during connect on Redis 10.0.0.7:6379: connect ECONNREFUSED 10.0.0.7:6379`,
 * and closes what it opened.
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
  Layer.scoped(
    LockBackend,
    Effect.gen(function*() {
      const client = yield* tracking.open(connection)
      const tracker = yield* tracking.track(client, tuning)
      yield* tracker.ping
      return yield* build(client, tuning, tracker)
    })
  )

/**
 * Provides `LockBackend` on a connection to the URL in `REDIS_URL` (or the config given), opened
 * and closed by the layer. Like `layerFrom`, it fails with `BackendError` (operation `"connect"`)
 * when the server cannot be reached or refuses the password, or the URL is not a Redis URL.
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
