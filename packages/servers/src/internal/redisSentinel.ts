/**
 * A primary, replicas (each replicating through its own TCP proxy) and sentinels, all real
 * `redis-server` processes, for replication and failover tests.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Duration, Effect, Either, ExecutionStrategy, Exit, Option, Scope } from "effect"
import type { Address, RedisServer } from "../RedisServer.js"
import type { AwaitMasterOptions, Node, Options, RedisSentinel, Role } from "../RedisSentinel.js"
import type { Reply, TlsClient } from "./redisServer.js"
import {
  call as callWithin,
  certificatesFor,
  launch,
  RedisServerError,
  ReplyError,
  serverBin
} from "./redisServer.js"
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
const DEFAULT_WAIT_TIMEOUT = Duration.seconds(20)
const CALL_TIMEOUT = Duration.millis(1_000)
const REWRITE_TIMEOUT = Duration.seconds(3)
const POLL_INTERVAL = Duration.millis(50)
const LOG_LINES = 12
const CUT_ATTEMPTS = 3
/** The priority Redis gives a replica by default. */
const DEFAULT_PRIORITY = 100


/** How the topology's processes are reached: in plain text, or over TLS trusting their CA. */
type Call = (port: number, args: ReadonlyArray<string>, timeout?: Duration.Duration) => Effect.Effect<Reply, RedisServerError>

/** One command on a fresh connection to `port` (TLS with `secure`), within `timeout`. */
const callOver = (secure: TlsClient | undefined): Call => (port, args, timeout = CALL_TIMEOUT) =>
  callWithin(port, args, timeout, secure)

const text = (reply: Reply): string => (typeof reply === "string" ? reply : "")

/** `INFO <section>` as a field map. */
const infoOver = (call: Call) => (port: number, section: string): Effect.Effect<ReadonlyMap<string, string>, RedisServerError> =>
  Effect.map(call(port, ["INFO", section]), (reply) => {
    const fields = new Map<string, string>()
    for (const line of text(reply).split(/\r?\n/)) {
      const colon = line.indexOf(":")
      if (colon > 0) fields.set(line.slice(0, colon), line.slice(colon + 1).trim())
    }
    return fields
  })

/** A flat `[field, value, field, value, ...]` array (as `SENTINEL MASTER`) as a map. */
const fieldsOf = (reply: Reply): ReadonlyMap<string, string> => {
  const fields = new Map<string, string>()
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) fields.set(String(reply[i]), String(reply[i + 1]))
  }
  return fields
}

const roleOver = (call: Call) => (port: number): Effect.Effect<Role | "sentinel", RedisServerError> =>
  Effect.flatMap(call(port, ["ROLE"]), (reply) => {
    const first = Array.isArray(reply) ? reply[0] : undefined
    switch (first) {
      case "master":
        return Effect.succeed("master" as const)
      case "slave":
        return Effect.succeed("replica" as const)
      case "sentinel":
        return Effect.succeed("sentinel" as const)
      default:
        return Effect.fail(
          new RedisServerError({ message: `ROLE on ${HOST}:${port} answered ${JSON.stringify(reply)}` })
        )
    }
  })

// ---------------------------------------------------------------------------------------------
// polling
// ---------------------------------------------------------------------------------------------

/** Right: done; Left: why not yet (the last reason ends up in the timeout error). */
type Check<A> = Effect.Effect<Either.Either<A, string>, RedisServerError>

/** A process whose last log lines a timeout reports; `only`: just the lines that match. */
interface Logged {
  readonly label: string
  readonly server: RedisServer
  readonly only?: RegExp
}

const tail = (log: string, lines: number, only: RegExp | undefined): string =>
  log.trimEnd().split("\n").filter((line) => only === undefined || only.test(line)).slice(-lines).join("\n")

/** A sentinel's warning-level lines (` # `): down and up calls, votes, failover steps, switches. */
const SENTINEL_EVENTS = / # /

/**
 * Repeats `check` until it succeeds; after `timeout`, fails with `what`, the last reason, and the
 * last log lines of `logged` (the processes whose view matters).
 */
const poll = <A>(
  what: string,
  timeout: Duration.Duration,
  check: Check<A>,
  logged: ReadonlyArray<Logged> = []
): Effect.Effect<A, RedisServerError> =>
  Effect.suspend(() => {
    let last = "no answer yet"
    const loop = (): Effect.Effect<A> =>
      Effect.flatMap(
        check.pipe(Effect.catchAll((error) => Effect.succeed<Either.Either<A, string>>(Either.left(error.message)))),
        Either.match({
          onLeft: (reason) =>
            Effect.zipRight(Effect.sync(() => (last = reason)), Effect.delay(Effect.suspend(loop), POLL_INTERVAL)),
          onRight: Effect.succeed
        })
      )
    return loop().pipe(
      Effect.timeoutOption(timeout),
      Effect.flatMap(Option.match({
        onSome: Effect.succeed,
        onNone: () =>
          Effect.flatMap(
            Effect.forEach(logged, ({ label, only, server }) =>
              Effect.map(server.logs, (log) => {
                const lines = tail(log, LOG_LINES, only)
                return lines === "" ? "" : `\n--- ${label} (port ${server.port}), last lines:\n${lines}`
              })),
            (logs) =>
              Effect.fail(
                new RedisServerError({ message: `${what} within ${Duration.format(timeout)}: ${last}${logs.join("")}` })
              )
          )
      }))
    )
  })

const decode = (input: Duration.DurationInput | undefined, fallback: Duration.Duration): Duration.Duration =>
  input === undefined ? fallback : Duration.decode(input)

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

interface SentinelConfig {
  readonly name: string
  readonly primary: number
  readonly quorum: number
  readonly downAfter: Duration.Duration
  readonly failoverTimeout: Duration.Duration
  readonly parallelSyncs: number
}

const sentinelConfig = (config: SentinelConfig): string =>
  [
    "sentinel resolve-hostnames no",
    `sentinel announce-ip ${HOST}`,
    `sentinel monitor ${config.name} ${HOST} ${config.primary} ${config.quorum}`,
    `sentinel down-after-milliseconds ${config.name} ${Duration.toMillis(config.downAfter)}`,
    `sentinel failover-timeout ${config.name} ${Duration.toMillis(config.failoverTimeout)}`,
    `sentinel parallel-syncs ${config.name} ${config.parallelSyncs}`,
    ""
  ].join("\n")

// ---------------------------------------------------------------------------------------------
// replication links
// ---------------------------------------------------------------------------------------------

interface Proxy {
  readonly proxy: TcpProxy.TcpProxy
  /** The port of the server the proxy forwards to. */
  readonly target: number
  readonly scope: Scope.CloseableScope
}

interface Link {
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
const openProxy = (
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

// ---------------------------------------------------------------------------------------------
// the topology
// ---------------------------------------------------------------------------------------------

/** While cut, a replica refuses REPLICAOF <host> <port>; REPLICAOF NO ONE stays allowed, so it can be promoted. */
const lockArgs = ["ACL", "SETUSER", "default", "-replicaof", "-slaveof", "+replicaof|no", "+slaveof|no"]
const unlockArgs = ["ACL", "SETUSER", "default", "+replicaof", "+slaveof"]

const nodeOver = (roleOf: (port: number) => Effect.Effect<Role | "sentinel", RedisServerError>) =>
(name: string, server: RedisServer): Node => ({
  ...server,
  name,
  role: Effect.flatMap(roleOf(server.port), (role) =>
    role === "sentinel"
      ? Effect.fail(new RedisServerError({ message: `${name} (port ${server.port}) answers ROLE as a sentinel` }))
      : Effect.succeed(role))
})

const integerAtLeast = (value: number, what: string, min: number): Effect.Effect<number, RedisServerError> =>
  Number.isInteger(value) && value >= min
    ? Effect.succeed(value)
    : Effect.fail(new RedisServerError({ message: `${what} must be an integer >= ${min}, got ${value}` }))

/** `RedisSentinel.make`. */
export const make = (options: Options = {}): Effect.Effect<RedisSentinel, RedisServerError, Scope.Scope> =>
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
    const downAfter = decode(options.downAfter, DEFAULT_DOWN_AFTER)
    const failoverTimeout = decode(options.failoverTimeout, DEFAULT_FAILOVER_TIMEOUT)
    const infoPeriod = decode(options.infoPeriod, DEFAULT_INFO_PERIOD)
    const publishPeriod = decode(options.publishPeriod, DEFAULT_PUBLISH_PERIOD)
    const readyTimeout = decode(options.readyTimeout, DEFAULT_READY_TIMEOUT)
    const bin = serverBin(options.bin)
    const startTimeout = decode(options.startTimeout, DEFAULT_START_TIMEOUT)
    const extra = options.args ?? []
    const topology = yield* Effect.scope
    const certificates = yield* certificatesFor(options.tls)
    const tls = certificates === undefined ? {} : { tls: certificates }
    const call = callOver(certificates)
    const info = infoOver(call)
    const toNode = nodeOver(roleOver(call))

    const dataServer = (lines: ReadonlyArray<string>): Effect.Effect<RedisServer, RedisServerError, Scope.Scope> =>
      launch({ bin, startTimeout, cluster: false, configFile: dataConfig(lines), args: () => extra, ...tls })

    const primary = toNode("primary", yield* dataServer([]))
    const links: ReadonlyArray<Link> = yield* Effect.forEach(
      Array.from({ length: replicaCount }, (_, index) => index),
      (index) =>
        Effect.gen(function*() {
          const cell: { cut: boolean; proxy: Proxy } = {
            cut: false,
            proxy: yield* openProxy(topology, primary.port, () => cell.cut)
          }
          const server = yield* dataServer([`replicaof ${HOST} ${cell.proxy.proxy.port}`])
          // the config file may hold a lock (or the lack of one) that no longer matches the cut
          const restart = Effect.zipRight(
            server.restart,
            Effect.suspend(() => call(server.port, cell.cut ? lockArgs : unlockArgs))
          )
          const node = toNode(`replica-${index}`, { ...server, restart })
          const lock = yield* Effect.makeSemaphore(1)
          const link: Link = { node, serialized: lock.withPermits(1), cell }
          return link
        })
    )
    const replicas = links.map((link) => link.node)
    const nodes: ReadonlyArray<Node> = [primary, ...replicas]
    const byPort = new Map(nodes.map((node) => [node.port, node] as const))
    const logged = (servers: ReadonlyArray<{ readonly name: string; readonly server: RedisServer }>) =>
      servers.map(({ name, server }) => ({ label: name, server }))

    const isCut = (node: Node): boolean => links.some((link) => link.node === node && link.cell.cut)

    /** The server a replica's `master_port` leads to: the port itself, or its proxy's target. */
    const upstreamOf = (port: number): number | undefined => {
      const link = links.find((link) => link.cell.proxy.proxy.port === port)
      return link === undefined ? port : link.cell.proxy.target
    }

    /** Whether `node` replicates from `master` (directly or through a proxy) and has reached `offset`. */
    const caughtUp = (node: Node, master: Node, offset: number): Check<void> =>
      Effect.map(info(node.port, "replication"), (fields) => {
        const role = fields.get("role")
        if (role !== "slave") return Either.left(`${node.name} is a ${role ?? "?"}`)
        const upstream = upstreamOf(Number(fields.get("master_port")))
        if (upstream !== master.port) {
          return Either.left(
            `${node.name} replicates from port ${String(upstream)}, not ${master.name} (${master.port})`
          )
        }
        const status = fields.get("master_link_status")
        if (status !== "up") return Either.left(`${node.name}: master_link_status:${status ?? "?"}`)
        const reached = Number(fields.get("slave_repl_offset"))
        return reached >= offset
          ? Either.right(undefined)
          : Either.left(`${node.name} is at offset ${reached}, ${master.name} at ${offset}`)
      })

    /**
     * Whether `master` has heard `node` acknowledge `offset` (its `slaveN:` line): what `WAIT` counts.
     * A replica that has just (re)connected has the data but acknowledges it only at its next
     * `REPLCONF ACK` (once a second): until then a `WAIT` on the master does not count it.
     */
    const acknowledgedBy = (node: Node, master: Node, offset: number): Check<void> =>
      Effect.map(info(master.port, "replication"), (fields) => {
        for (const [name, value] of fields) {
          if (!/^slave\d+$/.test(name)) continue
          const entry = new Map(value.split(",").map((pair) => pair.split("=") as [string, string]))
          if (Number(entry.get("port")) !== node.port) continue
          const acked = Number(entry.get("offset"))
          return entry.get("state") === "online" && acked >= offset
            ? Either.right(undefined)
            : Either.left(`${master.name} has ${node.name} at offset ${acked} (${entry.get("state") ?? "?"}), not ${offset}`)
        }
        return Either.left(`${master.name} does not list ${node.name} as a replica`)
      })

    const masterOffset = (master: Node): Effect.Effect<number, RedisServerError> =>
      Effect.map(info(master.port, "replication"), (fields) => Number(fields.get("master_repl_offset") ?? "0"))

    /** Waits until the running replicas (or `only`) caught up with `master`; `alsoLogged` on a timeout. */
    const syncTo = (
      master: Node,
      only: ReadonlyArray<Node> | undefined,
      timeout: Duration.Duration,
      alsoLogged: ReadonlyArray<Logged> = []
    ) =>
      Effect.gen(function*() {
        const candidates = only ?? nodes.filter((node) => node !== master && !isCut(node))
        const expected: Array<Node> = []
        for (const node of candidates) if (yield* node.isRunning) expected.push(node)
        const offset = yield* masterOffset(master)
        yield* poll(
          `replicas did not catch up with ${master.name} (port ${master.port}, offset ${offset})`,
          timeout,
          Effect.map(
            Effect.forEach(expected, (node) => caughtUp(node, master, offset), { concurrency: "unbounded" }),
            (results) => {
              const pending = results.filter(Either.isLeft).map((result) => result.left)
              return pending.length === 0 ? Either.right(undefined) : Either.left(pending.join("; "))
            }
          ),
          [...logged(expected.map((node) => ({ name: node.name, server: node }))), ...alsoLogged]
        )
      })

    // the data nodes are in sync before the sentinels look at them, so they see every replica at once
    yield* syncTo(primary, undefined, readyTimeout)

    // A sentinel that switches to a promoted replica makes a new link to it, but no sooner than a
    // ping period after its last attempt on the old master's link, and counts the silence since the
    // switch: with the ping period as long as down-after, it can call the new master down and fail
    // over again, onto whatever replica is left (an emptied old primary, if it is back).
    const pingPeriod = Duration.min(Duration.unsafeDivide(downAfter, 4), MAX_PING_PERIOD)
    const debugArgs = [
      "SENTINEL",
      "DEBUG",
      "info-period",
      String(Duration.toMillis(infoPeriod)),
      "publish-period",
      String(Duration.toMillis(publishPeriod)),
      "ping-period",
      String(Math.max(1, Math.round(Duration.toMillis(pingPeriod))))
    ]
    // SENTINEL DEBUG (Redis >= 7.0) is not kept in the rewritten config, so it is set on every start
    const tune = (server: RedisServer) => Effect.ignore(call(server.port, debugArgs))
    const sentinels: ReadonlyArray<RedisServer> = yield* Effect.forEach(
      Array.from({ length: sentinelCount }, (_, index) => index),
      () =>
        Effect.gen(function*() {
          const server = yield* launch({
            bin,
            startTimeout,
            cluster: false,
            configFile: sentinelConfig({
              name,
              primary: primary.port,
              quorum,
              downAfter,
              failoverTimeout,
              parallelSyncs: replicaCount
            }),
            args: () => ["--sentinel"],
            ...tls
          })
          yield* tune(server)
          const sentinel: RedisServer = { ...server, restart: Effect.zipRight(server.restart, tune(server)) }
          return sentinel
        })
    )
    const sentinelAddresses: ReadonlyArray<Address> = sentinels.map((sentinel) => ({ host: HOST, port: sentinel.port }))
    const sentinelLogs = logged(sentinels.map((server, index) => ({ name: `sentinel-${index}`, server })))
    const sentinelEvents = sentinelLogs.map((entry): Logged => ({ ...entry, only: SENTINEL_EVENTS }))

    const runningSentinels = Effect.filter(sentinels, (sentinel) => sentinel.isRunning)

    const masterPort = (sentinel: RedisServer): Effect.Effect<number, RedisServerError> =>
      Effect.flatMap(call(sentinel.port, ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", name]), (reply) =>
        Array.isArray(reply) && reply.length === 2
          ? Effect.succeed(Number(reply[1]))
          : Effect.fail(new RedisServerError({ message: `sentinel ${sentinel.port} does not monitor ${name}` })))

    const nodeAt = (port: number): Effect.Effect<Node, RedisServerError> => {
      const node = byPort.get(port)
      return node === undefined
        ? Effect.fail(
          new RedisServerError({ message: `sentinels report a master on port ${port}, not a node of this topology` })
        )
        : Effect.succeed(node)
    }

    const master: Effect.Effect<Node, RedisServerError> = Effect.flatMap(runningSentinels, (running) =>
      running.length === 0
        ? Effect.fail(new RedisServerError({ message: "no sentinel is running" }))
        : Effect.flatMap(Effect.firstSuccessOf(running.map(masterPort)), nodeAt))

    /** `SENTINEL REPLICAS`, by port. */
    const knownReplicas = (
      sentinel: RedisServer
    ): Effect.Effect<ReadonlyMap<number, ReadonlyMap<string, string>>, RedisServerError> =>
      Effect.map(call(sentinel.port, ["SENTINEL", "REPLICAS", name]), (reply) =>
        new Map(
          (Array.isArray(reply) ? reply : []).map(fieldsOf).map((fields) =>
            [Number(fields.get("port")), fields] as const
          )
        ))

    /** The master every answering sentinel reports, if they agree, it passes `filter`, and it says it is one. */
    const agreedMaster = (filter: (node: Node) => boolean): Check<Node> =>
      Effect.gen(function*() {
        const running = yield* runningSentinels
        const answers = yield* Effect.forEach(running, (sentinel) => Effect.either(masterPort(sentinel)), {
          concurrency: "unbounded"
        })
        const ports = answers.filter(Either.isRight).map((answer) => answer.right)
        if (ports.length === 0) return Either.left("no sentinel answered")
        const distinct = [...new Set(ports)]
        if (distinct.length > 1) return Either.left(`sentinels disagree on the master: ports ${distinct.join(", ")}`)
        const node = yield* nodeAt(distinct[0]!)
        if (!filter(node)) return Either.left(`sentinels report ${node.name} (port ${node.port})`)
        const role = yield* Effect.either(node.role)
        if (Either.isLeft(role)) {
          return Either.left(`sentinels report ${node.name}, which does not answer: ${role.left.message}`)
        }
        return role.right === "master"
          ? Either.right(node)
          : Either.left(`sentinels report ${node.name}, which answers ROLE as ${role.right}`)
      })

    const awaitMaster = (options: AwaitMasterOptions = {}): Effect.Effect<Node, RedisServerError> =>
      poll(
        "sentinels did not agree on a master that answers ROLE as master",
        decode(options.timeout, DEFAULT_WAIT_TIMEOUT),
        agreedMaster(options.filter ?? (() => true)),
        sentinelLogs
      )

    /** Every running sentinel knows the master, the other sentinels, and every running data node. */
    const sentinelsSettled: Check<void> = Effect.gen(function*() {
      const current = yield* agreedMaster(() => true)
      if (Either.isLeft(current)) return Either.left(current.left)
      const expected: Array<Node> = []
      for (const node of nodes) if (node !== current.right && (yield* node.isRunning)) expected.push(node)
      const problems: Array<string> = []
      for (const sentinel of yield* runningSentinels) {
        const state = fieldsOf(yield* call(sentinel.port, ["SENTINEL", "MASTER", name]))
        const flags = state.get("flags") ?? ""
        const others = Number(state.get("num-other-sentinels") ?? "0")
        if (others < sentinelCount - 1) problems.push(`sentinel ${sentinel.port} knows ${others} other sentinels`)
        if (flags !== "master") problems.push(`sentinel ${sentinel.port} flags the master ${flags}`)
        const seen = yield* knownReplicas(sentinel)
        for (const node of expected) {
          const replica = seen.get(node.port)
          if (replica === undefined) problems.push(`sentinel ${sentinel.port} does not know ${node.name}`)
          else if (/s_down|disconnected/.test(replica.get("flags") ?? "")) {
            problems.push(`sentinel ${sentinel.port} flags ${node.name} ${replica.get("flags")}`)
          }
        }
      }
      return problems.length === 0 ? Either.right(undefined) : Either.left(problems.join("; "))
    })

    const awaitSentinels = (timeout?: Duration.DurationInput): Effect.Effect<void, RedisServerError> =>
      poll(
        "sentinels did not settle (agree on the master, know every running node and each other)",
        decode(timeout, DEFAULT_WAIT_TIMEOUT),
        sentinelsSettled,
        sentinelLogs
      )

    yield* poll(
      "sentinels did not settle after startup (agree on the master, know every node and each other)",
      readyTimeout,
      sentinelsSettled,
      sentinelLogs
    )

    const awaitSync = (timeout?: Duration.DurationInput): Effect.Effect<void, RedisServerError> =>
      Effect.gen(function*() {
        const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
        const start = yield* Clock.currentTimeMillis
        const current = yield* awaitMaster({ timeout: limit })
        const spent = Duration.millis((yield* Clock.currentTimeMillis) - start)
        // a replica following the wrong master is the sentinels' doing: their events say why
        yield* syncTo(current, undefined, Duration.max(Duration.subtract(limit, spent), Duration.zero), sentinelEvents)
      })

    const failover = (timeout?: Duration.DurationInput): Effect.Effect<Node, RedisServerError> =>
      Effect.gen(function*() {
        const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
        const start = yield* Clock.currentTimeMillis
        const remaining = Effect.map(
          Clock.currentTimeMillis,
          (now) => Duration.max(Duration.subtract(limit, Duration.millis(now - start)), Duration.zero)
        )
        // Another sentinel would start a failover of its own while one is running, so wait until none
        // is; error replies (INPROG, NOGOODSLAVE while replica info is stale) are retried on the same
        // sentinel, and only an unreachable one is passed over. Yields the master failed over from.
        const accepted: Check<Node> = Effect.gen(function*() {
          const running = yield* runningSentinels
          for (const sentinel of running) {
            const state = yield* Effect.either(call(sentinel.port, ["SENTINEL", "MASTER", name]))
            const flags = Either.isRight(state) ? fieldsOf(state.right).get("flags") ?? "" : ""
            if (flags.includes("failover_in_progress")) {
              return Either.left(`sentinel ${sentinel.port} has a failover in progress`)
            }
          }
          const reasons: Array<string> = []
          for (const sentinel of running) {
            const attempt = yield* Effect.either(
              Effect.flatMap(masterPort(sentinel), (port) =>
                Effect.as(call(sentinel.port, ["SENTINEL", "FAILOVER", name]), port))
            )
            if (Either.isRight(attempt)) return Either.right(yield* nodeAt(attempt.right))
            if (attempt.left.cause instanceof ReplyError) return Either.left(attempt.left.message)
            reasons.push(attempt.left.message)
          }
          return Either.left(reasons.length === 0 ? "no sentinel is running" : reasons.join("; "))
        })
        const before = yield* poll(
          `SENTINEL FAILOVER ${name} was not accepted`,
          yield* remaining,
          accepted,
          sentinelLogs
        )
        return yield* poll(
          `failover from ${before.name} (port ${before.port}) did not complete`,
          yield* remaining,
          agreedMaster((node) => node !== before),
          sentinelLogs
        )
      })

    // -------------------------------------------------------------------------------------------
    // cutting replication
    // -------------------------------------------------------------------------------------------

    const linkAt = (index: number): Effect.Effect<Link, RedisServerError> => {
      const link = links[index]
      return link === undefined
        ? Effect.fail(
          new RedisServerError({ message: `no replica ${index}: the replicas are numbered 0 to ${links.length - 1}` })
        )
        : Effect.succeed(link)
    }

    const requireRunning = (node: Node, what: string): Effect.Effect<void, RedisServerError> =>
      Effect.flatMap(node.isRunning, (running) =>
        running
          ? Effect.void
          : Effect.fail(new RedisServerError({ message: `cannot ${what} ${node.name}: it is not running` })))

    /**
     * Makes `link`'s replica replicate from `target` through the link's proxy (re-aiming the proxy
     * and re-pointing the replica if a sentinel or a failover moved either), persisted with
     * CONFIG REWRITE so that a restart keeps it, and waits until it has caught up.
     */
    const routeThroughProxy = (link: Link, target: Node, timeout: Duration.Duration) =>
      Effect.gen(function*() {
        const fields = yield* info(link.node.port, "replication")
        const current = link.cell.proxy
        const routed = fields.get("role") === "slave" && Number(fields.get("master_port")) === current.proxy.port &&
          current.target === target.port
        if (!routed) {
          const next = current.target === target.port
            ? current
            : yield* openProxy(topology, target.port, () => link.cell.cut)
          yield* call(link.node.port, ["REPLICAOF", HOST, String(next.proxy.port)])
          yield* call(link.node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
          if (next !== current) {
            link.cell.proxy = next
            yield* Scope.close(current.scope, Exit.void)
          }
        }
        yield* syncTo(target, [link.node], timeout)
      })

    const cutReplication = (index: number, timeout?: Duration.DurationInput): Effect.Effect<void, RedisServerError> =>
      Effect.flatMap(linkAt(index), (link) =>
        link.serialized(Effect.gen(function*() {
          if (link.cell.cut) return
          const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
          const node = link.node
          yield* requireRunning(node, "cut the replication of")
          for (let attempt = 1;; attempt++) {
            const current = yield* master
            if (current === node) {
              return yield* new RedisServerError({
                message: `cannot cut the replication of ${node.name}: it is the master`
              })
            }
            yield* routeThroughProxy(link, current, limit)
            yield* call(node.port, lockArgs).pipe(
              Effect.mapError((error) =>
                new RedisServerError({
                  message:
                    `cannot keep sentinels from re-pointing ${node.name} (an ACL first-arg rule): ${error.message}`,
                  cause: error
                })
              )
            )
            // a sentinel's +fix-slave-config may have landed between the check and the lock
            const fields = yield* info(node.port, "replication")
            if (Number(fields.get("master_port")) === link.cell.proxy.proxy.port) {
              // kept across a restart
              yield* call(node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
              break
            }
            yield* call(node.port, unlockArgs)
            if (attempt >= CUT_ATTEMPTS) {
              return yield* new RedisServerError({
                message: `cannot cut the replication of ${node.name}: it keeps being re-pointed away from its proxy`
              })
            }
          }
          link.cell.cut = true
          yield* link.cell.proxy.proxy.resetAll
          yield* poll(
            `${node.name} still reports its master link up after the cut`,
            limit,
            Effect.map(info(node.port, "replication"), (fields) =>
              fields.get("master_link_status") === "up"
                ? Either.left("master_link_status:up")
                : Either.right(undefined)),
            logged([{ name: node.name, server: node }])
          )
        }))
      )

    const restoreReplication = (
      index: number,
      timeout?: Duration.DurationInput
    ): Effect.Effect<void, RedisServerError> =>
      Effect.flatMap(linkAt(index), (link) =>
        link.serialized(Effect.gen(function*() {
          if (!link.cell.cut) return
          link.cell.cut = false
          const node = link.node
          if (!(yield* node.isRunning)) return
          yield* call(node.port, unlockArgs)
          // a sentinel's CONFIG REWRITE may have persisted the lock
          yield* call(node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
          if ((yield* node.role) === "master") return
          const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
          const current = yield* master
          yield* routeThroughProxy(link, current, limit)
          // restored means counted by a WAIT again: the master has heard the replica acknowledge
          const offset = yield* masterOffset(current)
          yield* poll(
            `${node.name} did not acknowledge ${current.name}'s offset ${offset} after its link was restored`,
            limit,
            acknowledgedBy(node, current, offset),
            logged([{ name: node.name, server: node }])
          )
        }))
      )

    // -------------------------------------------------------------------------------------------
    // priorities
    // -------------------------------------------------------------------------------------------

    /** Sets priorities and waits until every running sentinel has read them from the replicas. */
    const setPriorities = (
      wanted: ReadonlyArray<readonly [Node, number]>,
      timeout: Duration.Duration
    ): Effect.Effect<void, RedisServerError> =>
      Effect.gen(function*() {
        for (const [node, priority] of wanted) {
          yield* call(node.port, ["CONFIG", "SET", "replica-priority", String(priority)])
          yield* call(node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
        }
        const seen: Check<void> = Effect.gen(function*() {
          const problems: Array<string> = []
          for (const sentinel of yield* runningSentinels) {
            const byNode = yield* knownReplicas(sentinel)
            for (const [node, priority] of wanted) {
              const replica = byNode.get(node.port)
              // the master's priority is read once it is a replica again
              if (replica === undefined || /disconnected|s_down/.test(replica.get("flags") ?? "")) continue
              if (replica.get("role-reported") !== "slave") continue
              const reported = replica.get("slave-priority")
              if (reported !== String(priority)) {
                problems.push(`sentinel ${sentinel.port} sees priority ${reported ?? "?"} on ${node.name}`)
              }
            }
          }
          return problems.length === 0 ? Either.right(undefined) : Either.left(problems.join("; "))
        })
        yield* poll("sentinels did not see the new replica priorities", timeout, seen, sentinelLogs)
      })

    const setReplicaPriority = (
      index: number,
      priority: number,
      timeout?: Duration.DurationInput
    ): Effect.Effect<void, RedisServerError> =>
      Effect.gen(function*() {
        const link = yield* linkAt(index)
        yield* integerAtLeast(priority, "replica-priority", 0)
        yield* requireRunning(link.node, "set the priority of")
        yield* setPriorities([[link.node, priority]], decode(timeout, DEFAULT_WAIT_TIMEOUT))
      })

    const preferReplica = (index: number, timeout?: Duration.DurationInput): Effect.Effect<void, RedisServerError> =>
      Effect.gen(function*() {
        const link = yield* linkAt(index)
        yield* requireRunning(link.node, "prefer")
        const wanted: Array<readonly [Node, number]> = []
        for (const node of nodes) {
          if (node === link.node) wanted.push([node, DEFAULT_PRIORITY])
          else if (yield* node.isRunning) wanted.push([node, 0])
        }
        yield* setPriorities(wanted, decode(timeout, DEFAULT_WAIT_TIMEOUT))
      })

    const handle: RedisSentinel = {
      name,
      ca: certificates?.ca,
      sentinels,
      sentinelAddresses,
      primary,
      replicas,
      nodes,
      master,
      awaitMaster,
      failover,
      awaitSync,
      awaitSentinels,
      cutReplication,
      restoreReplication,
      isCut: (index) => Effect.map(linkAt(index), (link) => link.cell.cut),
      proxyOf: (index) => Effect.map(linkAt(index), (link) => link.cell.proxy.proxy),
      setReplicaPriority,
      preferReplica
    }
    return handle
  })
