import { describe } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { Redis } from "ioredis"
import { RedisBackend } from "@lockstep/redis"
import { FaultyBackend } from "@lockstep/testkit"
import { RedisServer } from "@lockstep/servers"
import * as Conformance from "@lockstep/testkit/Conformance"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
if (!available) {
  console.warn("Redis conformance suite NOT RUN: redis-server not found (set REDIS_SERVER_BIN)")
}

describe.runIf(available || required)("Redis backend on a real redis-server", () => {
  // each test gets a server of its own, started on a free loopback port and killed afterwards
  const server = Layer.unwrapScoped(Effect.map(RedisServer.make(), (s) => RedisBackend.layerFrom(s.url))).pipe(Layer.orDie)
  // the data-loss tests empty the server with FLUSHALL, as a restart without persistence would
  const dataLoss = Layer.unwrapScoped(Effect.gen(function*() {
    const redis = yield* RedisServer.make()
    const raw = yield* Effect.acquireRelease(Effect.sync(() => new Redis(redis.url)), (c) => Effect.sync(() => c.disconnect()))
    const wipe = Effect.asVoid(Effect.promise(() => raw.flushall()))
    return Layer.merge(RedisBackend.layerFrom(redis.url), Layer.succeed(FaultyBackend.DataLoss, { wipe }))
  })).pipe(Layer.orDie)
  Conformance.suite({ name: "redis", layer: server, clock: "live", dataLoss })
})
