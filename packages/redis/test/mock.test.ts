import { afterAll, beforeAll, describe } from "@effect/vitest"
import { Effect, Layer } from "effect"
import RedisMock from "ioredis-mock"
import type { Redis } from "ioredis"
import { LockBackend } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import { Conformance } from "@lockstep/testkit"

let port = 40_000
/** A fresh in-process mock per test: ioredis-mock runs the backend's Lua scripts in its own Lua VM. */
const mock = Layer.scoped(
  LockBackend,
  Effect.flatMap(
    Effect.acquireRelease(
      Effect.sync(() => new RedisMock({ port: port++ }) as unknown as Redis),
      (client) => Effect.sync(() => client.disconnect())
    ),
    (client) => RedisBackend.make({ client })
  )
)

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
  Conformance.suite({ name: "ioredis-mock", layer: mock, clock: "live" })
})
