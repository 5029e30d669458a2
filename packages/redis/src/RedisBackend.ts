/**
 * The Redis backend of lockstep, on ioredis. Every operation is one Lua script judged on the
 * server's clock (a Redis Function where the server and the user allow it, EVALSHA otherwise);
 * a lock's keys share its cluster slot, so it works on Redis Cluster, and the re-entrant `Lock`
 * keeps Redisson's RLock layout, so a Redisson process and a lockstep process exclude each other.
 * Every `BackendError` names the endpoint; the client's `keyPrefix` is the backend's namespace;
 * a backend closes with its layer (or scope), after which its handles fail with
 * `LockError.BackendClosed`. The README's "Redis" section tells the rest.
 *
 * @since 0.1.0
 */
import type { Duration, Scope } from "effect"
import { Config, Effect, Layer } from "effect"
import type { Metric } from "effect"
import type { ConfigError } from "effect/ConfigError"
import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from "ioredis"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import * as clients from "./internal/clients.js"
import { type ClientTracker, track } from "./internal/tracker.js"
import * as eviction from "./internal/eviction.js"
import * as internal from "./internal/redisBackend.js"
import * as replication from "./internal/replication.js"

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
   * Every Redis call whose connection stays silent that long fails with `BackendError`, so a
   * silent server never stalls a holder past its lease. Silent means no reply at all: a call
   * waiting in line behind others that are being answered (thousands of calls made at once) waits
   * its turn. Once a call has waited that long on a connection that is down,
   * later calls on it fail at once until it is back: an outage stalls a caller for one timeout,
   * not one per call it makes. Default 2 seconds.
   */
  readonly commandTimeout?: Duration.DurationInput | undefined
  /** Most renewals sent in one script. Default 1000. */
  readonly renewBatchSize?: number | undefined
  /**
   * The failover quarantine: after the server was promoted from a replica, or restarted (its data
   * may be gone), it makes no new grant until every lease an earlier incarnation may have granted
   * has run out, i.e. for `longestLease` (default 30 seconds, the default watchdog) from the
   * promotion as the server first sees it, or from the restart. `longestLease` must cover the
   * longest lease or watchdog of every client of the server: an acquisition asking for a longer
   * one fails with `InvalidLockOptions`. Re-entries and renewals of holds the server has are not
   * held back. Single servers and Sentinel-managed masters; a Redis Cluster refuses it
   * (`InvalidLockOptions`).
   *
   * On by default (with `longestLease` 30 seconds) through sentinels, whose failovers are the
   * case it is for; off by default elsewhere. `false` turns it off. See the README's "Replicas
   * and failover".
   */
  readonly quarantine?: { readonly longestLease?: Duration.DurationInput | undefined } | false | undefined
  /**
   * Replica acknowledgement: the writes a holder relies on must reach `replicas` replicas before
   * the call that made them succeeds. See `Replication`.
   *
   * By default, on a replicated master (one reached through sentinels, or a single server that
   * had replicas when the backend was built; not a Redis Cluster), every replica the master has:
   * as many as its `INFO` last showed connected (read at build, after each reconnection or
   * failover, and at most a second old while locks are taken or renewed), within 250 ms. A
   * replica cut off from the master counts until the master drops it (`repl-timeout`), and grants
   * fail meanwhile (`ReplicationNotAcknowledged`). `false` turns it off; a `Replication` sets it.
   */
  readonly replication?: Replication | false | undefined
  /**
   * Run on a server that may evict lock keys (default false). A Redis with `maxmemory` and any
   * `maxmemory-policy` but `noeviction` (the default of several hosted services) may evict a
   * lock's key, since every key a lock writes has a TTL: the lock is then granted to a second
   * holder while the first still holds it, and the first learns of it only at its next renewal
   * (`LockLost`). So building the backend fails with a `BackendError` (its `cause` an
   * `EvictionRisk` naming the server and its policy) on such a server, every master of a Redis
   * Cluster included, and a policy changed at run time (read again after every reconnection
   * and, at most once a second, as acquisitions and renewals come by) makes new grants fail the
   * same way. With `true` the backend runs anyway: it logs the risk once, and every key the
   * servers evict while it runs is logged (a warning) and counted in the
   * `lockstep_redis_evicted_keys_total` metric (`RedisBackend.evictedKeys`).
   */
  readonly acceptEviction?: boolean | undefined
}

/**
 * The `replication` tuning: replica acknowledgement. Every grant, renewal, fence raise (`RedLock`)
 * and latch change is followed by `WAIT replicas timeout` (`WAITAOF` with `aof`) and counts only
 * once `replicas` replicas acknowledged it; otherwise it fails with a `BackendError` caused by
 * `ReplicationNotAcknowledged` (for a renewal: that lease's renew result). Releases, cancels and
 * reads wait for no replica. Acknowledgement is not consensus: pair it with the `quarantine`. The
 * README's "Replicas and failover" tells what it costs and what it does not guarantee.
 *
 * @example
 * ```ts
 * import { Redis } from "ioredis"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * // every grant and renewal reaches both replicas of the master, or fails within ~200 ms
 * const backend = RedisBackend.layer({
 *   client: new Redis("redis://10.0.0.7:6379"),
 *   replication: { replicas: 2, timeout: "200 millis" }
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Replication {
  /** How many replicas must acknowledge each write: a positive integer. */
  readonly replicas: number
  /**
   * How long the server waits for them (`WAIT`'s timeout), less than half the command timeout.
   * Default 250 ms, or a quarter of the command timeout where that is shorter.
   */
  readonly timeout?: Duration.DurationInput | undefined
  /**
   * Wait until the replicas have written each write to their append-only file (`WAITAOF`, Redis
   * 7.2 and later; replicas without `appendonly yes` never count), not only received it.
   * Default false.
   */
  readonly aof?: boolean | undefined
}

/**
 * Too few replicas acknowledged a write within the `replication` timeout. It is the `cause` of the
 * `BackendError` the operation fails with (for a renewal, of that lease's renew result): for an
 * acquisition, `operation` is `"grant"`, and the lock has released the grant.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const program = Effect.gen(function*() {
 *   const lock = yield* Lock.make("orders:42")
 *   yield* Effect.log("exclusive").pipe(Lock.withLock(lock))
 * }).pipe(
 *   Effect.catchTag("BackendError", (error) =>
 *     error.cause instanceof RedisBackend.ReplicationNotAcknowledged
 *       ? Effect.logWarning(`${error.cause.acknowledged} of ${error.cause.required} replicas acknowledged`)
 *       : Effect.fail(error))
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const ReplicationNotAcknowledged: typeof replication.ReplicationNotAcknowledged =
  replication.ReplicationNotAcknowledged

/**
 * An instance of `ReplicationNotAcknowledged`.
 *
 * @since 0.1.0
 * @category errors
 */
export type ReplicationNotAcknowledged = replication.ReplicationNotAcknowledged

/**
 * Whether `error` is a `BackendError` caused by too few replica acknowledgements
 * (`ReplicationNotAcknowledged`).
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const outage = new LockError.BackendError({ operation: "acquire", cause: new Error("ECONNRESET") })
 * console.log(RedisBackend.isReplicationNotAcknowledged(outage)) // false
 * ```
 *
 * @since 0.1.0
 * @category guards
 */
export const isReplicationNotAcknowledged = (
  error: unknown
): error is BackendError & { readonly cause: ReplicationNotAcknowledged } =>
  typeof error === "object" && error !== null && "_tag" in error && error._tag === "BackendError" &&
  "cause" in error && error.cause instanceof replication.ReplicationNotAcknowledged

/**
 * The server may evict lock keys: it has a `maxmemory` and a `maxmemory-policy` other than
 * `noeviction`, and the backend was not built with `acceptEviction`. It is the `cause` of the
 * `BackendError` that building the backend fails with (operation `"connect"`), or, when the
 * policy was changed while the backend ran, that acquisitions fail with. Its message names the
 * server, the policy and the ways out.
 *
 * @example
 * ```ts
 * import { Effect, Layer } from "effect"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const checked = Layer.build(RedisBackend.layerFrom("redis://127.0.0.1:6379")).pipe(
 *   Effect.catchTag("BackendError", (error) =>
 *     error.cause instanceof RedisBackend.EvictionRisk
 *       ? Effect.logError(`${error.cause.server} evicts keys (${error.cause.policy})`)
 *       : Effect.fail(error)),
 *   Effect.scoped
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const EvictionRisk: typeof eviction.EvictionRisk = eviction.EvictionRisk

/**
 * An instance of `EvictionRisk`.
 *
 * @since 0.1.0
 * @category errors
 */
export type EvictionRisk = eviction.EvictionRisk

/**
 * Keys the Redis servers evicted while a backend built with `acceptEviction` ran on them, by
 * `server` (`host:port`): the counter `lockstep_redis_evicted_keys_total`. Each evicted key may
 * have been a lock's, granted again while its holder still held it.
 *
 * @example
 * ```ts
 * import { Effect, Metric } from "effect"
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const evictions = Effect.map(Metric.value(RedisBackend.evictedKeys), (state) => state.count)
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const evictedKeys: Metric.Metric.Counter<number> = eviction.evictedKeys

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
 * URLs: `redis://[[username]:password@]host[:port][/db]`, `rediss://...` (TLS), a socket path, or
 * a master that Redis Sentinel manages:
 * `redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/<master name>[/<db>]`,
 * the form of redis-py's Sentinel URL packages and Prefect. The hosts are the sentinels (port
 * 26379 unless given, IPv6 in brackets), the name is the master's as the sentinels monitor it.
 * The credentials before `@` and the database are the data nodes'; sentinels that require
 * credentials of their own take them as `?sentinelUsername=...&sentinelPassword=...` (no other
 * parameter is accepted). Every part is percent-decoded: `%40` for `@` in a password, while `+`
 * stays a plus sign. `rediss+sentinel://` speaks TLS to the sentinels and the data nodes alike,
 * trusting Node's default CAs.
 *
 * A URL with ioredis options, `{ url, options }`, takes what the URL has no place for: the CA of a
 * `rediss://` server (`options: { tls: { ca } }`; through sentinels also `sentinelTLS: { ca }`),
 * or a `keyPrefix`, the namespace of every key and channel the backend uses. The options win over
 * what the URL says.
 *
 * @example
 * ```ts
 * import type { RedisBackend } from "@lockstep/redis"
 *
 * const single: RedisBackend.Connection = "redis://127.0.0.1:6379"
 * const cluster: RedisBackend.Connection = { cluster: [{ host: "127.0.0.1", port: 7000 }] }
 * const sentinel: RedisBackend.Connection = "redis+sentinel://:secret@10.0.0.5,10.0.0.6,10.0.0.7/orders"
 * const sentinelOptions: RedisBackend.Connection = {
 *   sentinels: [{ host: "10.0.0.5", port: 26379 }, { host: "10.0.0.6", port: 26379 }],
 *   name: "orders"
 * }
 * declare const ca: string
 * const tls: RedisBackend.Connection = { url: "rediss://locks.internal:6380", options: { tls: { ca }, keyPrefix: "lockstep:" } }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Connection =
  | string
  | { readonly url: string; readonly options?: RedisOptions | undefined }
  | RedisOptions
  | { readonly cluster: ReadonlyArray<ClusterNode>; readonly options?: ClusterOptions | undefined }

/**
 * The backend on an existing client (borrowed: closing the scope does not close it). A duplicate
 * connection, opened when a first waiter subscribes, carries the waiters' subscriptions and is
 * closed with the scope. Two round trips are made here: one asks for the commands the backend
 * needs (EVALSHA, EVAL, SUBSCRIBE; WAIT with replica acknowledgement; SELECT with a database),
 * each without arguments, and fails it with `BackendError` naming any the server refuses (renamed
 * or disabled, as managed services do); one `INFO` reads the server's eviction policy (every
 * master's, on a cluster): a server that may evict lock keys fails it with `BackendError` unless
 * `acceptEviction` is set (see `Tuning.acceptEviction`). A server that cannot be reached does not
 * fail it: it shows in the first calls (as `BackendError`), and grants wait for the eviction
 * policy to be read once the server answers.
 *
 * `replication` can fail it too: a bad option, or `aof` on a server without `WAITAOF` (checked
 * with one `COMMAND INFO`), fails it with `BackendError` (see `Replication`). With
 * `replication`, a second duplicate connection, opened on the first grant, carries the scripts
 * whose writes the replicas acknowledge.
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
export const make = (options: Options): Effect.Effect<Service, BackendError, Scope.Scope> =>
  Effect.flatMap(track(options.client, options), (tracker) => build(options.client, options, tracker, false))

/** The backend on `client`, which `tracker` follows; outages are logged while the scope is open. */
const build = (
  client: Client,
  tuning: Tuning | undefined,
  tracker: ClientTracker,
  reachable: boolean
): Effect.Effect<Service, BackendError, Scope.Scope> =>
  Effect.zipRight(
    Effect.forkScoped(tracker.report),
    Effect.map(internal.make(client, tuning, tracker, reachable), tracker.locateAll)
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
export const layer = (options: Options): Layer.Layer<LockBackend, BackendError> => Layer.scoped(LockBackend, make(options))

/**
 * Provides `LockBackend` on connections the layer opens and closes itself.
 *
 * Building it checks the server: one round trip that asks for the commands the backend needs, and
 * one `INFO` (see `Tuning.acceptEviction` and `Tuning.replication`). An unreachable server, a
 * refused password or command, or a bad URL fails it with `BackendError` (operation `"connect"`)
 * naming the endpoint and the cause, e.g. `lock backend failed during connect on Redis
 * 10.0.0.7:6379: connect ECONNREFUSED 10.0.0.7:6379`. Through Sentinel (see `Connection`) the
 * connections follow the master across failovers, moving as soon as the sentinels announce one;
 * the README's "Replicas and failover" tells what a failover does to locks.
 *
 * @example
 * ```ts
 * import { RedisBackend } from "@lockstep/redis"
 *
 * const single = RedisBackend.layerFrom("redis://127.0.0.1:6379")
 * const cluster = RedisBackend.layerFrom({ cluster: [{ host: "127.0.0.1", port: 7000 }] })
 * const sentinel = RedisBackend.layerFrom("redis+sentinel://10.0.0.5,10.0.0.6,10.0.0.7/orders")
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFrom = (connection: Connection, tuning?: Tuning): Layer.Layer<LockBackend, BackendError> =>
  Layer.scoped(
    LockBackend,
    Effect.gen(function*() {
      const client = yield* clients.open(connection)
      const tracker = yield* track(client, tuning)
      yield* tracker.ping
      return yield* build(client, tuning, tracker, true)
    })
  )

/**
 * Provides `LockBackend` on a connection to the URL in `REDIS_URL` (or the config given), opened
 * and closed by the layer: any URL `layerFrom` takes, `redis+sentinel://` included (see
 * `Connection`). Like `layerFrom`, it fails with `BackendError` (operation `"connect"`) when the
 * server cannot be reached or refuses the password, or the URL is not a Redis URL.
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
