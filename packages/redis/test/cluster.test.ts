import { afterAll, beforeAll, describe } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { Redis } from "ioredis"
import { RedisBackend } from "@lockstep/redis"
import { FaultyBackend } from "@lockstep/testkit"
import { RedisServer } from "@lockstep/servers"
import * as Conformance from "@lockstep/testkit/Conformance"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
if (!available) {
  console.warn("Redis Cluster conformance suite NOT RUN: redis-server not found (set REDIS_SERVER_BIN)")
}

describe.runIf(available || required)("Redis backend on a 3-master Redis Cluster", () => {
  // one cluster for the file (starting one takes seconds); every test uses fresh random keys,
  // which land in different slots and so on different masters
  const scope = Effect.runSync(Scope.make())
  const nodes: Array<{ readonly host: string; readonly port: number }> = []
  beforeAll(async () => {
    const cluster = await Effect.runPromise(Scope.extend(RedisServer.makeCluster(), scope))
    nodes.push(...cluster.startupNodes.map(({ host, port }) => ({ host, port })))
  }, 60_000)
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

  const layer = Layer.suspend(() => RedisBackend.layerFrom({ cluster: nodes })).pipe(Layer.orDie)
  // the data-loss tests empty every master with FLUSHALL
  const wipe = Effect.forEach(nodes, ({ host, port }) =>
    Effect.acquireUseRelease(
      Effect.sync(() => new Redis({ host, port })),
      (client) => Effect.promise(() => client.flushall()),
      (client) => Effect.sync(() => client.disconnect())
    ), { discard: true })
  const dataLoss = Layer.merge(layer, Layer.succeed(FaultyBackend.DataLoss, { wipe }))
  Conformance.suite({ name: "redis-cluster", layer, clock: "live", dataLoss })
})
