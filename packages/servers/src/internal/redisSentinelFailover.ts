/**
 * Failovers in a `RedisSentinel` topology: a planned one (`SENTINEL FAILOVER`), and the replica
 * priorities that decide which replica the sentinels promote.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Duration, Effect, Either } from "effect"
import type { Node } from "../RedisSentinel.js"
import { ReplyError } from "./redisServer.js"
import type { RedisServerError } from "./redisServer.js"
import type { Topology } from "./redisSentinelMonitor.js"
import { agreedMaster, knownReplicas, masterPort, nodeAt, runningSentinels } from "./redisSentinelMonitor.js"
import type { Check } from "./redisSentinelQueries.js"
import { decode, DEFAULT_WAIT_TIMEOUT, fieldsOf, integerAtLeast, poll, REWRITE_TIMEOUT } from "./redisSentinelQueries.js"
import { linkAt, requireRunning } from "./redisSentinelReplication.js"

/** The priority Redis gives a replica by default. */
const DEFAULT_PRIORITY = 100

/**
 * One `SENTINEL FAILOVER` accepted, yielding the master failed over from. Another sentinel would
 * start a failover of its own while one is running, so not while any has one in progress; error
 * replies (INPROG, NOGOODSLAVE while replica info is stale) are retried on the same sentinel, and
 * only an unreachable one is passed over.
 */
const failoverAccepted = (topology: Topology): Check<Node> =>
  Effect.gen(function*() {
    const running = yield* runningSentinels(topology)
    for (const sentinel of running) {
      const state = yield* Effect.either(topology.call(sentinel.port, ["SENTINEL", "MASTER", topology.name]))
      const flags = Either.isRight(state) ? fieldsOf(state.right).get("flags") ?? "" : ""
      if (flags.includes("failover_in_progress")) {
        return Either.left(`sentinel ${sentinel.port} has a failover in progress`)
      }
    }
    const reasons: Array<string> = []
    for (const sentinel of running) {
      const attempt = yield* Effect.either(
        Effect.flatMap(masterPort(topology, sentinel), (port) =>
          Effect.as(topology.call(sentinel.port, ["SENTINEL", "FAILOVER", topology.name]), port))
      )
      if (Either.isRight(attempt)) return Either.right(yield* nodeAt(topology, attempt.right))
      if (attempt.left.cause instanceof ReplyError) return Either.left(attempt.left.message)
      reasons.push(attempt.left.message)
    }
    return Either.left(reasons.length === 0 ? "no sentinel is running" : reasons.join("; "))
  })

/** `RedisSentinel.failover`. */
export const failover = (topology: Topology, timeout?: Duration.DurationInput): Effect.Effect<Node, RedisServerError> =>
  Effect.gen(function*() {
    const limit = decode(timeout, DEFAULT_WAIT_TIMEOUT)
    const start = yield* Clock.currentTimeMillis
    const remaining = Effect.map(
      Clock.currentTimeMillis,
      (now) => Duration.max(Duration.subtract(limit, Duration.millis(now - start)), Duration.zero)
    )
    const before = yield* poll(
      `SENTINEL FAILOVER ${topology.name} was not accepted`,
      yield* remaining,
      failoverAccepted(topology),
      topology.sentinelLogs
    )
    return yield* poll(
      `failover from ${before.name} (port ${before.port}) did not complete`,
      yield* remaining,
      agreedMaster(topology, (node) => node !== before),
      topology.sentinelLogs
    )
  })

// ---------------------------------------------------------------------------------------------
// priorities
// ---------------------------------------------------------------------------------------------

/** Sets priorities and waits until every running sentinel has read them from the replicas. */
const setPriorities = (
  topology: Topology,
  wanted: ReadonlyArray<readonly [Node, number]>,
  timeout: Duration.Duration
): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    for (const [node, priority] of wanted) {
      yield* topology.call(node.port, ["CONFIG", "SET", "replica-priority", String(priority)])
      yield* topology.call(node.port, ["CONFIG", "REWRITE"], REWRITE_TIMEOUT)
    }
    const seen: Check<void> = Effect.gen(function*() {
      const problems: Array<string> = []
      for (const sentinel of yield* runningSentinels(topology)) {
        const byNode = yield* knownReplicas(topology, sentinel)
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
    yield* poll("sentinels did not see the new replica priorities", timeout, seen, topology.sentinelLogs)
  })

/** `RedisSentinel.setReplicaPriority`. */
export const setReplicaPriority = (
  topology: Topology,
  index: number,
  priority: number,
  timeout?: Duration.DurationInput
): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    const link = yield* linkAt(topology, index)
    yield* integerAtLeast(priority, "replica-priority", 0)
    yield* requireRunning(link.node, "set the priority of")
    yield* setPriorities(topology, [[link.node, priority]], decode(timeout, DEFAULT_WAIT_TIMEOUT))
  })

/** `RedisSentinel.preferReplica`. */
export const preferReplica = (
  topology: Topology,
  index: number,
  timeout?: Duration.DurationInput
): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    const link = yield* linkAt(topology, index)
    yield* requireRunning(link.node, "prefer")
    const wanted: Array<readonly [Node, number]> = []
    for (const node of topology.nodes) {
      if (node === link.node) wanted.push([node, DEFAULT_PRIORITY])
      else if (yield* node.isRunning) wanted.push([node, 0])
    }
    yield* setPriorities(topology, wanted, decode(timeout, DEFAULT_WAIT_TIMEOUT))
  })
