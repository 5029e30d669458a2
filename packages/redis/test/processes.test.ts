/**
 * Two OS processes contend on one lock against real redis-servers (`contention.ts`): mutual
 * exclusion and increasing fences across processes, on one server and on a RedLock over three.
 */
import { describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { RedisServer } from "@lockstep/servers"
import { contendAcrossProcesses } from "../../testkit/test/fixtures/contention.js"
import { runnable, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis multi-process suite (processes.test.ts)")

describe.runIf(runnable)("two processes contend on one lock on real redis-servers", () => {
  it.scopedLive("mutual exclusion and increasing fences across processes; both processes hold the lock", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      yield* contendAcrossProcesses("processes", server.url, "processes-contended", 60)
    }), 60_000)

  it.scopedLive("the same with a RedLock over three servers in each process", () =>
    Effect.gen(function*() {
      const servers = yield* Effect.forEach([0, 1, 2], () => RedisServer.make(), { concurrency: "unbounded" })
      yield* contendAcrossProcesses("redlock processes", servers.map((s) => s.url).join(","), "processes-redlock", 40)
    }), 60_000)
})
