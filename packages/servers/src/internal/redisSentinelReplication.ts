/**
 * Replication in a `RedisSentinel` topology: waiting until replicas caught up with a master, and
 * cutting and restoring a replica's link (through its proxy).
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Duration, Effect, Either, Exit, Scope } from "effect"
import type { Node } from "../RedisSentinel.js"
import { RedisServerError } from "./redisServer.js"
import type { DataNodes, Link } from "./redisSentinelLaunch.js"
import { lockArgs, openProxy, unlockArgs } from "./redisSentinelLaunch.js"
import type { Topology } from "./redisSentinelMonitor.js"
import { awaitMaster, master } from "./redisSentinelMonitor.js"
import type { Check, Logged } from "./redisSentinelQueries.js"
import {
  decode,
  DEFAULT_WAIT_TIMEOUT,
  info,
  logged,
  poll,
  REWRITE_TIMEOUT,
  SENTINEL_EVENTS
} from "./redisSentinelQueries.js"
import { HOST } from "./serverProcess.js"

const CUT_ATTEMPTS = 3

const isCut = (data: DataNodes, node: Node): boolean => data.links.some((link) => link.node === node && link.cell.cut)

/** The server a replica's `master_port` leads to: the port itself, or its proxy's target. */
const upstreamOf = (data: DataNodes, port: number): number | undefined => {
  const link = data.links.find((link) => link.cell.proxy.proxy.port === port)
  return link === undefined ? port : link.cell.proxy.target
}

/** Whether `node` replicates from `master` (directly or through a proxy) and has reached `offset`. */
const caughtUp = (data: DataNodes, node: Node, master: Node, offset: number): Check<void> =>
  Effect.map(info(data.call, node.port, "replication"), (fields) => {
    const role = fields.get("role")
    if (role !== "slave") return Either.left(`${node.name} is a ${role ?? "?"}`)
    const upstream = upstreamOf(data, Number(fields.get("master_port")))
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
const acknowledgedBy = (data: DataNodes, node: Node, master: Node, offset: number): Check<void> =>
  Effect.map(info(data.call, master.port, "replication"), (fields) => {
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

const masterOffset = (data: DataNodes, master: Node): Effect.Effect<number, RedisServerError> =>
  Effect.map(info(data.call, master.port, "replication"), (fields) => Number(fields.get("master_repl_offset") ?? "0"))

/** Waits until the running replicas (or `only`) caught up with `master`; `alsoLogged` on a timeout. */
export const syncTo = (
  data: DataNodes,
  master: Node,
  only: ReadonlyArray<Node> | undefined,
  timeout: Duration.Duration,
  alsoLogged: ReadonlyArray<Logged> = []
): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    const candidates = only ?? data.nodes.filter((node) => node !== master && !isCut(data, node))
    const expected: Array<Node> = []
    for (const node of candidates) if (yield* node.isRunning) expected.push(node)
    const offset = yield* masterOffset(data, master)
    yield* poll(
      `replicas did not catch up with ${master.name} (port ${master.port}, offset ${offset})`,
      timeout,
      Effect.map(
        Effect.forEach(expected, (node) => caughtUp(data, node, master, offset), { concurrency: "unbounded" }),
        (results) => {
          const pending = results.filter(Either.isLeft).map((result) => result.left)
          return pending.length === 0 ? Either.right(undefined) : Either.left(pending.join("; "))
        }
      ),
      [...logged(expected.map((node) => ({ name: node.name, server: node }))), ...alsoLogged]
    )
  })

/** `RedisSentinel.awaitSync`. */
export const awaitSync = (topology: Topology, timeout?: Duration.DurationInput): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
    const start = yield* Clock.currentTimeMillis
    const current = yield* awaitMaster(topology, { timeout: limit })
    const spent = Duration.millis((yield* Clock.currentTimeMillis) - start)
    const sentinelEvents = topology.sentinelLogs.map((entry): Logged => ({ ...entry, only: SENTINEL_EVENTS }))
    // a replica following the wrong master is the sentinels' doing: their events say why
    yield* syncTo(topology, current, undefined, Duration.max(Duration.subtract(limit, spent), Duration.zero), sentinelEvents)
  })

// ---------------------------------------------------------------------------------------------
// cutting replication
// ---------------------------------------------------------------------------------------------

/** Replica `index`'s link. */
export const linkAt = (data: DataNodes, index: number): Effect.Effect<Link, RedisServerError> => {
  const link = data.links[index]
  return link === undefined
    ? Effect.fail(
      new RedisServerError({ message: `no replica ${index}: the replicas are numbered 0 to ${data.links.length - 1}` })
    )
    : Effect.succeed(link)
}

/** `body` on replica `index`'s link, one at a time per link. */
const onLink = <A>(
  data: DataNodes,
  index: number,
  body: (link: Link) => Effect.Effect<A, RedisServerError>
): Effect.Effect<A, RedisServerError> => Effect.flatMap(linkAt(data, index), (link) => link.serialized(body(link)))

export const requireRunning = (node: Node, what: string): Effect.Effect<void, RedisServerError> =>
  Effect.flatMap(node.isRunning, (running) =>
    running
      ? Effect.void
      : Effect.fail(new RedisServerError({ message: `cannot ${what} ${node.name}: it is not running` })))

/**
 * Makes `link`'s replica replicate from `target` through the link's proxy (re-aiming the proxy
 * and re-pointing the replica if a sentinel or a failover moved either), persisted with
 * CONFIG REWRITE so that a restart keeps it, and waits until it has caught up.
 */
const routeThroughProxy = (data: DataNodes, link: Link, target: Node, timeout: Duration.Duration) =>
  Effect.gen(function*() {
    const fields = yield* info(data.call, link.node.port, "replication")
    const current = link.cell.proxy
    const routed = fields.get("role") === "slave" && Number(fields.get("master_port")) === current.proxy.port &&
      current.target === target.port
    if (!routed) {
      const next = current.target === target.port
        ? current
        : yield* openProxy(data.scope, target.port, () => link.cell.cut)
      yield* data.call(link.node.port, ["REPLICAOF", HOST, String(next.proxy.port)])
      yield* data.call(link.node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
      if (next !== current) {
        link.cell.proxy = next
        yield* Scope.close(current.scope, Exit.void)
      }
    }
    yield* syncTo(data, target, [link.node], timeout)
  })

/**
 * Routes `link`'s replica through its proxy from the current master and locks it there (an ACL
 * rule against REPLICAOF <host> <port>), persisted; tries again while a sentinel re-points it
 * between the check and the lock.
 */
const lockOnProxy = (topology: Topology, link: Link, limit: Duration.Duration): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    const node = link.node
    for (let attempt = 1;; attempt++) {
      const current = yield* master(topology)
      if (current === node) {
        return yield* new RedisServerError({
          message: `cannot cut the replication of ${node.name}: it is the master`
        })
      }
      yield* routeThroughProxy(topology, link, current, limit)
      yield* topology.call(node.port, lockArgs).pipe(
        Effect.mapError((error) =>
          new RedisServerError({
            message: `cannot keep sentinels from re-pointing ${node.name} (an ACL first-arg rule): ${error.message}`,
            cause: error
          })
        )
      )
      // a sentinel's +fix-slave-config may have landed between the check and the lock
      const fields = yield* info(topology.call, node.port, "replication")
      if (Number(fields.get("master_port")) === link.cell.proxy.proxy.port) {
        // kept across a restart
        yield* topology.call(node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
        return
      }
      yield* topology.call(node.port, unlockArgs)
      if (attempt >= CUT_ATTEMPTS) {
        return yield* new RedisServerError({
          message: `cannot cut the replication of ${node.name}: it keeps being re-pointed away from its proxy`
        })
      }
    }
  })

/** `RedisSentinel.cutReplication`. */
export const cutReplication = (
  topology: Topology,
  index: number,
  timeout?: Duration.DurationInput
): Effect.Effect<void, RedisServerError> =>
  onLink(topology, index, (link) =>
    Effect.gen(function*() {
      if (link.cell.cut) return
      const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
      const node = link.node
      yield* requireRunning(node, "cut the replication of")
      yield* lockOnProxy(topology, link, limit)
      link.cell.cut = true
      yield* link.cell.proxy.proxy.resetAll
      yield* poll(
        `${node.name} still reports its master link up after the cut`,
        limit,
        Effect.map(info(topology.call, node.port, "replication"), (fields) =>
          fields.get("master_link_status") === "up"
            ? Either.left("master_link_status:up")
            : Either.right(undefined)),
        logged([{ name: node.name, server: node }])
      )
    }))

/** `RedisSentinel.restoreReplication`. */
export const restoreReplication = (
  topology: Topology,
  index: number,
  timeout?: Duration.DurationInput
): Effect.Effect<void, RedisServerError> =>
  onLink(topology, index, (link) =>
    Effect.gen(function*() {
      if (!link.cell.cut) return
      link.cell.cut = false
      const node = link.node
      if (!(yield* node.isRunning)) return
      yield* topology.call(node.port, unlockArgs)
      // a sentinel's CONFIG REWRITE may have persisted the lock
      yield* topology.call(node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
      if ((yield* node.role) === "master") return
      const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
      const current = yield* master(topology)
      yield* routeThroughProxy(topology, link, current, limit)
      // restored means counted by a WAIT again: the master has heard the replica acknowledge
      const offset = yield* masterOffset(topology, current)
      yield* poll(
        `${node.name} did not acknowledge ${current.name}'s offset ${offset} after its link was restored`,
        limit,
        acknowledgedBy(topology, node, current, offset),
        logged([{ name: node.name, server: node }])
      )
    }))
