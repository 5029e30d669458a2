/**
 * CountDownLatch on a real redis-server (each test starts its own): one script per call, the
 * waiters of a process on the backend's one subscriber connection, a wake-up reaching all of them
 * at once, and waiters that survive the loss of the subscriber connection.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import { CountDownLatch } from "@lockstep/core"
import { RedisServer } from "@lockstep/testkit"
import { backendOn, call, eventually, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis CountDownLatch suite (latch.test.ts)")

/** `cmdstat_<name>` calls of `INFO commandstats`, the probes left out. */
const commandCalls = (info: string): Record<string, number> => {
  const out: Record<string, number> = {}
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    if (!["info", "config|resetstat", "config", "client|list", "pubsub|numsub"].includes(m[1]!)) out[m[1]!] = Number(m[2])
  }
  return out
}

const tuning = { commandTimeout: "5 seconds" } as const

describe.runIf(runnable)("CountDownLatch on a real redis-server", () => {
  it.scopedLive("each call is one script; 100 waiters share one subscription and one count down wakes them all", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url, tuning)
      // a recheck far beyond the test: only a wake-up can end the waits
      const latch = yield* CountDownLatch.make("latch-waiters", { recheck: "1 minute" }).pipe(withBackend(backend))
      // the scripts are loaded once
      yield* CountDownLatch.trySetCount(latch, 1)
      yield* CountDownLatch.count(latch)
      yield* CountDownLatch.countDown(latch)
      yield* call(raw, "CONFIG", "RESETSTAT")
      assert.isTrue(yield* CountDownLatch.trySetCount(latch, 2))
      assert.strictEqual(yield* CountDownLatch.count(latch), 2)
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 1)
      const calls = commandCalls(String(yield* call(raw, "INFO", "commandstats")))
      // three calls, three scripts (already loaded: no EVAL); the rest ran inside them
      assert.strictEqual(calls["evalsha"], 3)
      assert.isUndefined(calls["eval"])
      const inside = Object.entries(calls).filter(([name]) => name !== "evalsha")
      assert.isTrue(inside.every(([name]) => !["subscribe", "unsubscribe", "keys", "scan"].includes(name)), JSON.stringify(calls))
      console.log(`[latch] trySetCount + count + countDown: 3 scripts, ${inside.reduce((n, [, c]) => n + c, 0)} commands inside: ${JSON.stringify(Object.fromEntries(inside))}`)

      const waiters = yield* Effect.forEach(Array.from({ length: 100 }), () => Effect.fork(CountDownLatch.await(latch)))
      const channel = "redisson_countdownlatch__channel__{latch-waiters}"
      yield* eventually(
        "the waiters' subscription",
        Effect.map(call(raw, "PUBSUB", "NUMSUB", channel), (r) => Number((r as [string, number])[1]) === 1),
        3_000
      )
      // the backend's command connection and its subscriber, and the probe: nothing per waiter
      const clients = String(yield* call(raw, "CLIENT", "LIST")).trim().split("\n").length
      assert.strictEqual(clients, 3)
      yield* Effect.sleep("100 millis")
      for (const waiter of waiters) assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "a waiter went on before 0")
      const sentAt = performance.now()
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
      yield* Fiber.joinAll(waiters).pipe(
        Effect.timeoutFail({ duration: "3 seconds", onTimeout: () => new Error("the waiters were not woken") })
      )
      const wokenMs = performance.now() - sentAt
      console.log(`[latch] one count down to 0 woke 100 waiters in ${wokenMs.toFixed(1)} ms, over 1 subscription`)
    }), 30_000)

  it.scopedLive("the subscriber connection killed while waiting: the waiters reconnect and still see 0", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url, tuning)
      const latch = yield* CountDownLatch.make("latch-reconnect", { recheck: "1 minute" }).pipe(withBackend(backend))
      yield* CountDownLatch.trySetCount(latch, 1)
      const waiters = yield* Effect.forEach(Array.from({ length: 10 }), () => Effect.fork(CountDownLatch.await(latch)))
      const channel = "redisson_countdownlatch__channel__{latch-reconnect}"
      const subscribed = Effect.map(call(raw, "PUBSUB", "NUMSUB", channel), (r) => Number((r as [string, number])[1]) === 1)
      yield* eventually("the waiters' subscription", subscribed, 3_000)
      yield* call(raw, "CLIENT", "KILL", "TYPE", "pubsub")
      // counted down while no subscriber listens: the message is lost, the reconnect must make up for it
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
      yield* Fiber.joinAll(waiters).pipe(
        Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the waiters missed the count down") })
      )
    }), 30_000)
})
