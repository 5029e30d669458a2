/**
 * A Redis replication topology for failover tests, tied to a `Scope`: one primary, replicas
 * (default 2) and sentinels (default 3), all real `redis-server` processes on free loopback ports
 * with fresh temp dirs and no persistence, stopped (and their dirs removed) when the scope closes.
 *
 * Each replica replicates through a `TcpProxy` of its own, so that a test can cut and restore
 * its replication link at a chosen moment while the primary keeps serving clients. Only the
 * replication connection takes that path: a replica announces its own address (it tells the
 * primary its own port, and `replica-announce-ip` is 127.0.0.1), so the primary's
 * `INFO replication`, the sentinels and their clients reach every replica directly.
 *
 * Sentinels rewrite the configuration of the servers they manage, and every process has a config
 * file for that, so a restarted server keeps the role the sentinels gave it. Two consequences:
 * - a failover re-points the other replicas (and later the old primary, once it is back) with
 *   `REPLICAOF` to the new master directly, not through their proxies;
 * - sentinels also re-point a replica whose configured master is not the monitored address, and
 *   a proxy is such an address (`+fix-slave-config`, once `failover-timeout` has passed since they
 *   saw that configuration change). So `cutReplication` first routes the replica through its
 *   proxy again if needed, and while the link is cut the replica refuses `REPLICAOF <host> <port>`
 *   (an ACL rule; `REPLICAOF NO ONE` stays allowed: sentinels can still promote it, stale as it is).
 *
 * The binary is `REDIS_SERVER_BIN` if set, else `redis-server` on `PATH` (as `RedisServer`);
 * check `RedisServer.available` first so that a suite can say plainly that it was not run.
 *
 * @since 0.1.0
 */
import type { Duration, Effect, Scope } from "effect"
import * as internal from "./internal/redisSentinel.js"
import type { Address, Certificates, RedisServer, RedisServerError, TlsOptions } from "./RedisServer.js"
import type { TcpProxy } from "./TcpProxy.js"

/**
 * What a data node says it is (`ROLE`): `"master"`, or `"replica"` (`slave` on the wire).
 *
 * @example
 * ```ts
 * import type { RedisSentinel } from "@lockstep/servers"
 *
 * const writable = (role: RedisSentinel.Role) => role === "master"
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Role = "master" | "replica"

/**
 * A data node of the topology (the primary or a replica): a `RedisServer` (kill, restart, pause,
 * resume, logs) with a label and its live role.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import type { RedisSentinel } from "@lockstep/servers"
 *
 * const describe = (node: RedisSentinel.Node) =>
 *   Effect.map(node.role, (role) => `${node.name} at ${node.url} is a ${role}`)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Node extends RedisServer {
  /** `"primary"` (the first master) or `"replica-<i>"`, whatever the node's role now. */
  readonly name: string
  /** `ROLE` of the running process; fails when it does not answer. */
  readonly role: Effect.Effect<Role, RedisServerError>
}

/**
 * Options of `RedisSentinel.awaitMaster`.
 *
 * @example
 * ```ts
 * import type { RedisSentinel } from "@lockstep/servers"
 *
 * const notTheOldOne = (old: RedisSentinel.Node): RedisSentinel.AwaitMasterOptions => ({
 *   filter: (node) => node !== old,
 *   timeout: "15 seconds"
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface AwaitMasterOptions {
  /** Which master to wait for (default: any). */
  readonly filter?: (node: Node) => boolean
  /** Default 20 s. */
  readonly timeout?: Duration.DurationInput
}

/**
 * A running topology. Replicas are numbered from 0 as in `replicas`. Waits are bounded (default
 * 20 s) and fail with a `RedisServerError` naming what was last seen, with the sentinels' (or the
 * replicas') last log lines.
 *
 * "The master" is the node every answering sentinel reports (`SENTINEL GET-MASTER-ADDR-BY-NAME`)
 * and that answers `ROLE` as master. After a failover, the old master may keep answering as a
 * master for a while (until the sentinels convert it, about 4 publish periods); `awaitSync` waits
 * for that too.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisSentinel } from "@lockstep/servers"
 *
 * const unplanned = (topology: RedisSentinel.RedisSentinel) =>
 *   Effect.gen(function*() {
 *     const old = yield* topology.master
 *     yield* old.kill
 *     return yield* topology.awaitMaster({ filter: (node) => node !== old })
 *   })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RedisSentinel {
  /** The monitored master's name, for a client's `name` option. */
  readonly name: string
  /**
   * With `tls`: the certificate (PEM) of the CA every process's certificate is signed by, for a
   * client's `tls: { ca }` and `sentinelTLS: { ca }`. Otherwise undefined.
   *
   * @since 0.1.0
   */
  readonly ca: string | undefined
  /** The sentinel processes (their `restart` sets the debug periods again). */
  readonly sentinels: ReadonlyArray<RedisServer>
  /** The sentinels' addresses, for a client's `sentinels` option. */
  readonly sentinelAddresses: ReadonlyArray<Address>
  /** The node started as master. */
  readonly primary: Node
  /** The nodes started as replicas. */
  readonly replicas: ReadonlyArray<Node>
  /** `primary`, then `replicas`. */
  readonly nodes: ReadonlyArray<Node>
  /** The master according to the first sentinel that answers. */
  readonly master: Effect.Effect<Node, RedisServerError>
  /** Waits until the sentinels agree on a master that passes `filter` and answers `ROLE` as master. */
  readonly awaitMaster: (options?: AwaitMasterOptions) => Effect.Effect<Node, RedisServerError>
  /**
   * Waits until no sentinel has a failover in progress, sends `SENTINEL FAILOVER <name>` (retried
   * while the sentinel answers an error such as NOGOODSLAVE), then waits until the sentinels agree
   * on another master that answers `ROLE` as master, and returns it. The old master keeps
   * answering as a master until the sentinels convert it (`awaitSync` waits for that).
   */
  readonly failover: (timeout?: Duration.DurationInput) => Effect.Effect<Node, RedisServerError>
  /**
   * Waits until every running data node other than the master, except cut replicas, replicates
   * from the master (directly or through its proxy) with its link up, at or past the master's
   * replication offset at the time of the call. A paused node makes it time out.
   */
  readonly awaitSync: (timeout?: Duration.DurationInput) => Effect.Effect<void, RedisServerError>
  /**
   * Waits until every running sentinel agrees on the master, has it flagged plainly `master` (no
   * failover in progress), knows every other sentinel, and knows every running data node as a
   * connected replica.
   */
  readonly awaitSentinels: (timeout?: Duration.DurationInput) => Effect.Effect<void, RedisServerError>
  /**
   * Severs replica `index`'s replication link: the replica keeps its data and answers clients,
   * receives nothing more, and reports `master_link_status:down`; the master keeps serving. Before
   * the cut the replica is routed through its proxy from the current master (if a sentinel or a
   * failover re-pointed it) and has caught up with the master's offset, so what was written before
   * the call is on it and nothing after. While cut it refuses `REPLICAOF <host> <port>` but not
   * `REPLICAOF NO ONE`. Fails on the master or a stopped replica; nothing if already cut.
   */
  readonly cutReplication: (index: number, timeout?: Duration.DurationInput) => Effect.Effect<void, RedisServerError>
  /**
   * Lets replica `index` replicate again and waits until it has caught up: through its proxy, from
   * the current master (re-aimed if a failover happened meanwhile). Nothing more if it was promoted
   * meanwhile, or is not running (it starts uncut); nothing if not cut.
   */
  readonly restoreReplication: (
    index: number,
    timeout?: Duration.DurationInput
  ) => Effect.Effect<void, RedisServerError>
  /** Whether replica `index`'s link is cut. */
  readonly isCut: (index: number) => Effect.Effect<boolean, RedisServerError>
  /** The proxy replica `index` replicates through now (a new one after it is re-aimed). */
  readonly proxyOf: (index: number) => Effect.Effect<TcpProxy, RedisServerError>
  /**
   * `CONFIG SET replica-priority` on replica `index` (0: never promoted), then waits until every
   * running sentinel has read it.
   */
  readonly setReplicaPriority: (
    index: number,
    priority: number,
    timeout?: Duration.DurationInput
  ) => Effect.Effect<void, RedisServerError>
  /**
   * Makes replica `index` the only one sentinels may promote: priority 0 on every other running
   * data node, 100 on it, and waits until every running sentinel has read them. With its link cut
   * first, the promoted master is deliberately stale.
   */
  readonly preferReplica: (index: number, timeout?: Duration.DurationInput) => Effect.Effect<void, RedisServerError>
}

/**
 * Options of `make`.
 *
 * @example
 * ```ts
 * import type { RedisSentinel } from "@lockstep/servers"
 *
 * const options: RedisSentinel.Options = { replicas: 2, sentinels: 3, downAfter: "1 second" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** How many replicas (at least 1, default 2). */
  readonly replicas?: number
  /** How many sentinels (at least 1, default 3). */
  readonly sentinels?: number
  /** The monitored master's name (default `"lockstep"`). */
  readonly name?: string
  /** Sentinels that must agree the master is down (default: a majority, 2 of 3). */
  readonly quorum?: number
  /**
   * `down-after-milliseconds` (default 1 s). Sentinels ping (and re-make a lost link) every quarter
   * of it, at most every second (`SENTINEL DEBUG ping-period`): at Redis' own 1 s, a sentinel that
   * switches to a promoted replica may reach it only after 1 s and call it down.
   */
  readonly downAfter?: Duration.DurationInput
  /**
   * `failover-timeout` (default 5 s): bounds a failover's steps; a sentinel that started or voted
   * in one does not start another for twice that.
   */
  readonly failoverTimeout?: Duration.DurationInput
  /**
   * How often sentinels read `INFO` from the servers (`SENTINEL DEBUG info-period`, default 1 s;
   * Redis' own is 10 s): how fast they notice a new priority or replica.
   */
  readonly infoPeriod?: Duration.DurationInput
  /**
   * How often sentinels publish hellos (`SENTINEL DEBUG publish-period`, default 0.5 s; Redis' own is
   * 2 s): how fast they find each other, and a returning old master is converted after 4 of them.
   */
  readonly publishPeriod?: Duration.DurationInput
  /** Extra `redis-server` arguments for the data nodes, after the launcher's own. No passwords. */
  readonly args?: ReadonlyArray<string>
  /** The binary; default `REDIS_SERVER_BIN`, else `redis-server` on `PATH`. */
  readonly bin?: string
  /** How long to wait for the first PONG of each process start (default 10 s). */
  readonly startTimeout?: Duration.DurationInput
  /** Bound on the replicas' first sync and the sentinels settling at startup (default 20 s). */
  readonly readyTimeout?: Duration.DurationInput
  /**
   * Every process speaks TLS only (data nodes, sentinels, replication and the sentinels' links to
   * the data nodes), with one CA (`ca`): `true` makes a throwaway one with a certificate for
   * 127.0.0.1 and localhost, `TlsOptions` one for other names, `Certificates` uses those (see
   * `RedisServer.make`'s `tls`). Default: no TLS.
   *
   * @since 0.1.0
   */
  readonly tls?: boolean | TlsOptions | Certificates
}

/**
 * Starts the primary, then each replica behind its own proxy, waits until the replicas are in
 * sync, starts the sentinels, and waits until they agree on the primary and know every replica
 * and each other. Closing the scope stops every process (sentinels first) and proxy, and removes
 * the dirs.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisSentinel } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const topology = yield* RedisSentinel.make()
 *     // ioredis: new Redis({ sentinels: [...topology.sentinelAddresses], name: topology.name })
 *     yield* topology.cutReplication(1)
 *     const promoted = yield* topology.failover()
 *     yield* Effect.log(`master now ${promoted.name}`)
 *   })
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (options?: Options) => Effect.Effect<RedisSentinel, RedisServerError, Scope.Scope> =
  internal.make
