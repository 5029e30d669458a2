/**
 * Starting the processes of a `RedisSentinel` topology: the options read, the config files, the
 * primary, each replica behind a TCP proxy of its own, and the sentinels.
 *
 * @since 0.1.0
 * @internal
 */
import { Duration, Effect, ExecutionStrategy, Exit, Scope } from "effect"
import type { Certificates, RedisServer } from "../RedisServer.js"
import type { Node, Options } from "../RedisSentinel.js"
import { launch, RedisServerError, serverBin } from "./redisServer.js"
import type { Call } from "./redisSentinelQueries.js"
import { decode, integerAtLeast, roleOf } from "./redisSentinelQueries.js"
import { HOST } from "./serverProcess.js"
import * as TcpProxy from "./tcpProxy.js"

const DEFAULT_REPLICAS = 2
const DEFAULT_SENTINELS = 3
const DEFAULT_NAME = "lockstep"
const DEFAULT_DOWN_AFTER = Duration.seconds(1)
const DEFAULT_FAILOVER_TIMEOUT = Duration.seconds(5)
const DEFAULT_INFO_PERIOD = Duration.seconds(1)
const DEFAULT_PUBLISH_PERIOD = Duration.millis(500)
/** Redis' own ping period, which also spaces a sentinel's attempts to (re)connect a link. */
const MAX_PING_PERIOD = Duration.seconds(1)
const DEFAULT_START_TIMEOUT = Duration.seconds(10)
const DEFAULT_READY_TIMEOUT = Duration.seconds(20)

// ---------------------------------------------------------------------------------------------
// options
// ---------------------------------------------------------------------------------------------

/** `Options` checked, with their defaults. */
export interface Settings {
  readonly replicaCount: number
  readonly sentinelCount: number
  readonly quorum: number
  readonly name: string
  readonly downAfter: Duration.Duration
  readonly failoverTimeout: Duration.Duration
  readonly infoPeriod: Duration.Duration
  readonly publishPeriod: Duration.Duration
  readonly readyTimeout: Duration.Duration
  readonly bin: string
  readonly startTimeout: Duration.Duration
  /** Extra arguments of the data nodes. */
  readonly extra: ReadonlyArray<string>
}

export const settingsOf = (options: Options): Effect.Effect<Settings, RedisServerError> =>
  Effect.gen(function*() {
    const replicaCount = yield* integerAtLeast(options.replicas ?? DEFAULT_REPLICAS, "replicas", 1)
    const sentinelCount = yield* integerAtLeast(options.sentinels ?? DEFAULT_SENTINELS, "sentinels", 1)
    const quorum = yield* integerAtLeast(options.quorum ?? Math.floor(sentinelCount / 2) + 1, "quorum", 1)
    if (quorum > sentinelCount) {
      return yield* new RedisServerError({ message: `quorum ${quorum} is more than the ${sentinelCount} sentinels` })
    }
    const name = options.name ?? DEFAULT_NAME
    if (!/^[A-Za-z0-9._-]+$/.test(name)) {
      return yield* new RedisServerError({
        message: `monitor name must match [A-Za-z0-9._-]+, got ${JSON.stringify(name)}`
      })
    }
    const settings: Settings = {
      replicaCount,
      sentinelCount,
      quorum,
      name,
      downAfter: decode(options.downAfter, DEFAULT_DOWN_AFTER),
      failoverTimeout: decode(options.failoverTimeout, DEFAULT_FAILOVER_TIMEOUT),
      infoPeriod: decode(options.infoPeriod, DEFAULT_INFO_PERIOD),
      publishPeriod: decode(options.publishPeriod, DEFAULT_PUBLISH_PERIOD),
      readyTimeout: decode(options.readyTimeout, DEFAULT_READY_TIMEOUT),
      bin: serverBin(options.bin),
      startTimeout: decode(options.startTimeout, DEFAULT_START_TIMEOUT),
      extra: options.args ?? []
    }
    return settings
  })

// ---------------------------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------------------------

const dataConfig = (lines: ReadonlyArray<string>): string =>
  [
    `save ""`,
    "appendonly no",
    // full syncs start at once instead of waiting 5 s for more replicas
    "repl-diskless-sync-delay 0",
    // how the primary (and through it the sentinels) names a replica: its own address, whatever
    // path its replication connection takes
    `replica-announce-ip ${HOST}`,
    ...lines,
    ""
  ].join("\n")

const sentinelConfig = (settings: Settings, primary: number): string =>
  [
    "sentinel resolve-hostnames no",
    `sentinel announce-ip ${HOST}`,
    `sentinel monitor ${settings.name} ${HOST} ${primary} ${settings.quorum}`,
    `sentinel down-after-milliseconds ${settings.name} ${Duration.toMillis(settings.downAfter)}`,
    `sentinel failover-timeout ${settings.name} ${Duration.toMillis(settings.failoverTimeout)}`,
    `sentinel parallel-syncs ${settings.name} ${settings.replicaCount}`,
    ""
  ].join("\n")

// ---------------------------------------------------------------------------------------------
// replication links
// ---------------------------------------------------------------------------------------------

export interface Proxy {
  readonly proxy: TcpProxy.TcpProxy
  /** The port of the server the proxy forwards to. */
  readonly target: number
  readonly scope: Scope.CloseableScope
}

export interface Link {
  readonly node: Node
  readonly serialized: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /** Read synchronously by the proxy for every chunk a replica sends. */
  readonly cell: { cut: boolean; proxy: Proxy }
}

/**
 * A proxy to `target` in a scope of its own, with a fault armed again after every firing: while
 * `cell.cut`, the first bytes of every connection (a replica's handshake starts with PING) reset
 * it, so a replica retrying once a second never gets through.
 */
export const openProxy = (
  parent: Scope.Scope,
  target: number,
  isCut: () => boolean
): Effect.Effect<Proxy, RedisServerError> =>
  Effect.gen(function*() {
    const scope = yield* Scope.fork(parent, ExecutionStrategy.sequential)
    const proxy = yield* TcpProxy.make({ host: HOST, port: target }).pipe(
      Scope.extend(scope),
      Effect.mapError((error) =>
        new RedisServerError({ message: `cannot start a proxy to port ${target}: ${error.message}`, cause: error })
      ),
      Effect.tapError(() => Scope.close(scope, Exit.void))
    )
    yield* Effect.forkIn(Effect.forever(Effect.flatten(proxy.arm({ kind: "beforeSend", match: isCut }))), scope)
    return { proxy, target, scope }
  })

/** While cut, a replica refuses REPLICAOF <host> <port>; REPLICAOF NO ONE stays allowed, so it can be promoted. */
export const lockArgs = ["ACL", "SETUSER", "default", "-replicaof", "-slaveof", "+replicaof|no", "+slaveof|no"]
export const unlockArgs = ["ACL", "SETUSER", "default", "+replicaof", "+slaveof"]

// ---------------------------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------------------------

const toNode = (call: Call, name: string, server: RedisServer): Node => ({
  ...server,
  name,
  role: Effect.flatMap(roleOf(call, server.port), (role) =>
    role === "sentinel"
      ? Effect.fail(new RedisServerError({ message: `${name} (port ${server.port}) answers ROLE as a sentinel` }))
      : Effect.succeed(role))
})

/** The data nodes, and how the topology reaches its processes. */
export interface DataNodes {
  readonly call: Call
  /** The topology's scope, which the proxies of re-aimed links are opened in. */
  readonly scope: Scope.Scope
  readonly primary: Node
  readonly links: ReadonlyArray<Link>
  /** `primary`, then the replicas. */
  readonly nodes: ReadonlyArray<Node>
}

/** Starts the primary, then each replica replicating from it through a proxy of its own. */
export const launchDataNodes = (
  settings: Settings,
  call: Call,
  certificates: Certificates | undefined
): Effect.Effect<DataNodes, RedisServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const tls = certificates === undefined ? {} : { tls: certificates }
    const dataServer = (lines: ReadonlyArray<string>): Effect.Effect<RedisServer, RedisServerError, Scope.Scope> =>
      launch({
        bin: settings.bin,
        startTimeout: settings.startTimeout,
        cluster: false,
        configFile: dataConfig(lines),
        args: () => settings.extra,
        ...tls
      })

    const primary = toNode(call, "primary", yield* dataServer([]))
    const links: ReadonlyArray<Link> = yield* Effect.forEach(
      Array.from({ length: settings.replicaCount }, (_, index) => index),
      (index) =>
        Effect.gen(function*() {
          const cell: { cut: boolean; proxy: Proxy } = {
            cut: false,
            proxy: yield* openProxy(scope, primary.port, () => cell.cut)
          }
          const server = yield* dataServer([`replicaof ${HOST} ${cell.proxy.proxy.port}`])
          // the config file may hold a lock (or the lack of one) that no longer matches the cut
          const restart = Effect.zipRight(
            server.restart,
            Effect.suspend(() => call(server.port, cell.cut ? lockArgs : unlockArgs))
          )
          const node = toNode(call, `replica-${index}`, { ...server, restart })
          const lock = yield* Effect.makeSemaphore(1)
          const link: Link = { node, serialized: lock.withPermits(1), cell }
          return link
        })
    )
    const nodes: ReadonlyArray<Node> = [primary, ...links.map((link) => link.node)]
    return { call, scope, primary, links, nodes }
  })

/**
 * `SENTINEL DEBUG` arguments for the periods of `settings`. A sentinel that switches to a promoted
 * replica makes a new link to it, but no sooner than a ping period after its last attempt on the
 * old master's link, and counts the silence since the switch: with the ping period as long as
 * down-after, it can call the new master down and fail over again, onto whatever replica is left
 * (an emptied old primary, if it is back).
 */
const debugArgs = (settings: Settings): ReadonlyArray<string> => {
  const pingPeriod = Duration.min(Duration.unsafeDivide(settings.downAfter, 4), MAX_PING_PERIOD)
  return [
    "SENTINEL",
    "DEBUG",
    "info-period",
    String(Duration.toMillis(settings.infoPeriod)),
    "publish-period",
    String(Duration.toMillis(settings.publishPeriod)),
    "ping-period",
    String(Math.max(1, Math.round(Duration.toMillis(pingPeriod))))
  ]
}

/** Starts the sentinels, monitoring the primary on `primary`. */
export const launchSentinels = (
  settings: Settings,
  call: Call,
  primary: number,
  certificates: Certificates | undefined
): Effect.Effect<ReadonlyArray<RedisServer>, RedisServerError, Scope.Scope> => {
  const tuning = debugArgs(settings)
  // SENTINEL DEBUG (Redis >= 7.0) is not kept in the rewritten config, so it is set on every start
  const tune = (server: RedisServer) => Effect.ignore(call(server.port, tuning))
  return Effect.forEach(
    Array.from({ length: settings.sentinelCount }, (_, index) => index),
    () =>
      Effect.gen(function*() {
        const server = yield* launch({
          bin: settings.bin,
          startTimeout: settings.startTimeout,
          cluster: false,
          configFile: sentinelConfig(settings, primary),
          args: () => ["--sentinel"],
          ...(certificates === undefined ? {} : { tls: certificates })
        })
        yield* tune(server)
        const sentinel: RedisServer = { ...server, restart: Effect.zipRight(server.restart, tune(server)) }
        return sentinel
      })
  )
}
