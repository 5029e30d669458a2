/**
 * The sentinels' view of a `RedisSentinel` topology: which master they report, whether they
 * agree on it, and whether they know every running node and each other.
 *
 * @since 0.1.0
 * @internal
 */
import type { Duration } from "effect"
import { Effect, Either } from "effect"
import type { RedisServer } from "../RedisServer.js"
import type { AwaitMasterOptions, Node } from "../RedisSentinel.js"
import { RedisServerError } from "./redisServer.js"
import type { DataNodes } from "./redisSentinelLaunch.js"
import type { Check, Logged } from "./redisSentinelQueries.js"
import { decode, DEFAULT_WAIT_TIMEOUT, fieldsOf, poll } from "./redisSentinelQueries.js"

/** A running topology: its data nodes and the sentinels that monitor them under `name`. */
export interface Topology extends DataNodes {
  readonly name: string
  readonly sentinels: ReadonlyArray<RedisServer>
  /** The sentinels' logs, reported when a wait on them times out. */
  readonly sentinelLogs: ReadonlyArray<Logged>
}

export const runningSentinels = (topology: Topology): Effect.Effect<Array<RedisServer>> =>
  Effect.filter(topology.sentinels, (sentinel) => sentinel.isRunning)

/** The port of the master `sentinel` reports. */
export const masterPort = (topology: Topology, sentinel: RedisServer): Effect.Effect<number, RedisServerError> =>
  Effect.flatMap(topology.call(sentinel.port, ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", topology.name]), (reply) =>
    Array.isArray(reply) && reply.length === 2
      ? Effect.succeed(Number(reply[1]))
      : Effect.fail(new RedisServerError({ message: `sentinel ${sentinel.port} does not monitor ${topology.name}` })))

/** The data node on `port`. */
export const nodeAt = (topology: Topology, port: number): Effect.Effect<Node, RedisServerError> => {
  const node = topology.nodes.find((node) => node.port === port)
  return node === undefined
    ? Effect.fail(
      new RedisServerError({ message: `sentinels report a master on port ${port}, not a node of this topology` })
    )
    : Effect.succeed(node)
}

/** `RedisSentinel.master`: the master according to the first sentinel that answers. */
export const master = (topology: Topology): Effect.Effect<Node, RedisServerError> =>
  Effect.flatMap(runningSentinels(topology), (running) =>
    running.length === 0
      ? Effect.fail(new RedisServerError({ message: "no sentinel is running" }))
      : Effect.flatMap(
        Effect.firstSuccessOf(running.map((sentinel) => masterPort(topology, sentinel))),
        (port) => nodeAt(topology, port)
      ))

/** `SENTINEL REPLICAS`, by port. */
export const knownReplicas = (
  topology: Topology,
  sentinel: RedisServer
): Effect.Effect<ReadonlyMap<number, ReadonlyMap<string, string>>, RedisServerError> =>
  Effect.map(topology.call(sentinel.port, ["SENTINEL", "REPLICAS", topology.name]), (reply) =>
    new Map(
      (Array.isArray(reply) ? reply : []).map(fieldsOf).map((fields) => [Number(fields.get("port")), fields] as const)
    ))

/** The master every answering sentinel reports, if they agree, it passes `filter`, and it says it is one. */
export const agreedMaster = (topology: Topology, filter: (node: Node) => boolean): Check<Node> =>
  Effect.gen(function*() {
    const running = yield* runningSentinels(topology)
    const answers = yield* Effect.forEach(running, (sentinel) => Effect.either(masterPort(topology, sentinel)), {
      concurrency: "unbounded"
    })
    const ports = answers.filter(Either.isRight).map((answer) => answer.right)
    if (ports.length === 0) return Either.left("no sentinel answered")
    const distinct = [...new Set(ports)]
    if (distinct.length > 1) return Either.left(`sentinels disagree on the master: ports ${distinct.join(", ")}`)
    const node = yield* nodeAt(topology, distinct[0]!)
    if (!filter(node)) return Either.left(`sentinels report ${node.name} (port ${node.port})`)
    const role = yield* Effect.either(node.role)
    if (Either.isLeft(role)) {
      return Either.left(`sentinels report ${node.name}, which does not answer: ${role.left.message}`)
    }
    return role.right === "master"
      ? Either.right(node)
      : Either.left(`sentinels report ${node.name}, which answers ROLE as ${role.right}`)
  })

/** `RedisSentinel.awaitMaster`. */
export const awaitMaster = (
  topology: Topology,
  options: AwaitMasterOptions = {}
): Effect.Effect<Node, RedisServerError> =>
  poll(
    "sentinels did not agree on a master that answers ROLE as master",
    decode(options.timeout, DEFAULT_WAIT_TIMEOUT),
    agreedMaster(topology, options.filter ?? (() => true)),
    topology.sentinelLogs
  )

/** Every running sentinel knows the master, the other sentinels, and every running data node. */
export const sentinelsSettled = (topology: Topology): Check<void> =>
  Effect.gen(function*() {
    const current = yield* agreedMaster(topology, () => true)
    if (Either.isLeft(current)) return Either.left(current.left)
    const expected: Array<Node> = []
    for (const node of topology.nodes) if (node !== current.right && (yield* node.isRunning)) expected.push(node)
    const problems: Array<string> = []
    for (const sentinel of yield* runningSentinels(topology)) {
      const state = fieldsOf(yield* topology.call(sentinel.port, ["SENTINEL", "MASTER", topology.name]))
      const flags = state.get("flags") ?? ""
      const others = Number(state.get("num-other-sentinels") ?? "0")
      if (others < topology.sentinels.length - 1) problems.push(`sentinel ${sentinel.port} knows ${others} other sentinels`)
      if (flags !== "master") problems.push(`sentinel ${sentinel.port} flags the master ${flags}`)
      const seen = yield* knownReplicas(topology, sentinel)
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

/** `RedisSentinel.awaitSentinels`. */
export const awaitSentinels = (
  topology: Topology,
  timeout?: Duration.DurationInput
): Effect.Effect<void, RedisServerError> =>
  poll(
    "sentinels did not settle (agree on the master, know every running node and each other)",
    decode(timeout, DEFAULT_WAIT_TIMEOUT),
    sentinelsSettled(topology),
    topology.sentinelLogs
  )
