import { afterAll, beforeAll, describe } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import RedisMock from "ioredis-mock"
import type { Redis } from "ioredis"
import { LockBackend } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import { FaultyBackend } from "@lockstep/testkit"
import * as Conformance from "@lockstep/testkit/Conformance"

let port = 40_000
/** A fresh in-process mock per test: ioredis-mock runs the backend's Lua scripts in its own Lua VM. */
const mockClient = Effect.acquireRelease(
  Effect.sync(() => new RedisMock({ port: port++ }) as unknown as Redis),
  (client) => Effect.sync(() => client.disconnect())
)
const mock = Layer.scoped(LockBackend, Effect.flatMap(mockClient, (client) => RedisBackend.make({ client })))
// the data-loss tests empty the mock with FLUSHALL
const dataLoss = Layer.scopedContext(Effect.gen(function*() {
  const client = yield* mockClient
  const backend = yield* RedisBackend.make({ client })
  const wipe = Effect.asVoid(Effect.promise(() => client.flushall()))
  return Context.make(LockBackend, backend).pipe(Context.add(FaultyBackend.DataLoss, { wipe }))
}))

// ioredis-mock's TIME pairs Math.round(Date.now() / 1000) seconds with the nanosecond part of
// process.hrtime() as microseconds: unrelated numbers, so the server clock the scripts read would
// jump by up to ±1 s between calls. The lock rules are judged on the server clock, so give the mock
// a consistent one: an hrtime whose nanosecond part completes the rounded seconds to Date.now().
const hrtime = process.hrtime
const consistent = Object.assign(
  (previous?: [number, number]): [number, number] => {
    if (previous !== undefined) return hrtime(previous)
    const now = Date.now()
    return [Math.floor(now / 1000), (now - Math.round(now / 1000) * 1000) * 1e6]
  },
  { bigint: hrtime.bigint }
)
beforeAll(() => {
  process.hrtime = consistent
})
afterAll(() => {
  process.hrtime = hrtime
})

describe("Redis backend on ioredis-mock", () => {
  // the mock's Lua VM is slow: fewer model-based runs than on a real server
  Conformance.suite({ name: "ioredis-mock", layer: mock, clock: "live", dataLoss, modelRuns: 100 })
})
