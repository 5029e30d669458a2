/**
 * CountDownLatch on a real redis-server (each test starts its own): one script per call, the
 * waiters of a process on the backend's one subscriber connection, a wake-up reaching all of them
 * at once, waiters that survive the loss of the subscriber connection, and what a server that
 * loses its data does to a latch.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import type { Duration } from "effect"
import { CountDownLatch } from "@lockstep/core"
import { RedisServer } from "@lockstep/servers"
import { backendOn, call, commandStats, eventually, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis CountDownLatch suite (latch.test.ts)")

/** A server of the test's own, a probe client, and a latch on `key` with `recheck`. */
const latchOn = (key: string, recheck: Duration.DurationInput) =>
  Effect.gen(function*() {
    const server = yield* RedisServer.make()
    const raw = yield* rawClient(server.url)
    const backend = yield* backendOn(server.url, { commandTimeout: "5 seconds" })
    const latch = yield* CountDownLatch.make(key, { recheck }).pipe(withBackend(backend))
    // the waiters of a process share one subscription to the latch's channel
    const subscribed = Effect.map(
      call(raw, "PUBSUB", "NUMSUB", `redisson_countdownlatch__channel__{${key}}`),
      (r) => Number((r as [string, number])[1]) === 1
    )
    return { raw, latch, subscribed }
  })

const waiting = (latch: CountDownLatch.CountDownLatch, n: number) =>
  Effect.forEach(Array.from({ length: n }), () => Effect.fork(CountDownLatch.await(latch)))

describe.runIf(runnable)("CountDownLatch on a real redis-server", () => {
  it.scopedLive("each call is one script; 100 waiters share one subscription and one count down wakes them all", () =>
    Effect.gen(function*() {
      // a recheck far beyond the test: only a wake-up can end the waits
      const { latch, raw, subscribed } = yield* latchOn("latch-waiters", "1 minute")
      // the scripts are loaded once
      yield* CountDownLatch.trySetCount(latch, 1)
      yield* CountDownLatch.count(latch)
      yield* CountDownLatch.countDown(latch)
      yield* call(raw, "CONFIG", "RESETSTAT")
      assert.isTrue(yield* CountDownLatch.trySetCount(latch, 2))
      assert.strictEqual(yield* CountDownLatch.count(latch), 2)
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 1)
      const calls = Object.fromEntries(commandStats(String(yield* call(raw, "INFO", "commandstats"))))
      // three calls, three scripts (already loaded: no EVAL); the rest ran inside them
      assert.strictEqual((calls["evalsha"] ?? 0) + (calls["fcall"] ?? 0), 3)
      assert.isUndefined(calls["eval"])
      const inside = Object.entries(calls).filter(([name]) => name !== "evalsha" && name !== "fcall")
      assert.isTrue(inside.every(([name]) => !["subscribe", "unsubscribe", "keys", "scan"].includes(name)), JSON.stringify(calls))
      console.log(
        `[latch] trySetCount + count + countDown: 3 scripts, ${inside.reduce((n, [, c]) => n + c, 0)} commands inside: ${
          JSON.stringify(Object.fromEntries(inside))
        }`
      )

      const waiters = yield* waiting(latch, 100)
      yield* eventually("the waiters' subscription", subscribed, 3_000)
      // the backend's command connection and its subscriber, and the probe: nothing per waiter
      assert.strictEqual(String(yield* call(raw, "CLIENT", "LIST")).trim().split("\n").length, 3)
      yield* Effect.sleep("100 millis")
      for (const waiter of waiters) assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "a waiter went on before 0")
      const sentAt = performance.now()
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
      yield* Fiber.joinAll(waiters).pipe(
        Effect.timeoutFail({ duration: "3 seconds", onTimeout: () => new Error("the waiters were not woken") })
      )
      console.log(`[latch] one count down to 0 woke 100 waiters in ${(performance.now() - sentAt).toFixed(1)} ms, over 1 subscription`)
    }), 30_000)

  it.scopedLive("the subscriber connection killed while waiting: the waiters reconnect and still see 0", () =>
    Effect.gen(function*() {
      const { latch, raw, subscribed } = yield* latchOn("latch-reconnect", "1 minute")
      yield* CountDownLatch.trySetCount(latch, 1)
      const waiters = yield* waiting(latch, 10)
      yield* eventually("the waiters' subscription", subscribed, 3_000)
      yield* call(raw, "CLIENT", "KILL", "TYPE", "pubsub")
      // counted down while no subscriber listens: the message is lost, the reconnect must make up for it
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
      yield* Fiber.joinAll(waiters).pipe(
        Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the waiters missed the count down") })
      )
    }), 30_000)

  it.scopedLive("a server that loses its data opens the latch: the count reads 0 and the waiters go on", () =>
    Effect.gen(function*() {
      const { latch, raw, subscribed } = yield* latchOn("latch-flushed", "500 millis")
      yield* CountDownLatch.trySetCount(latch, 3)
      const waiters = yield* waiting(latch, 5)
      yield* eventually("the waiters' subscription", subscribed, 3_000)
      yield* call(raw, "FLUSHALL")
      // nothing is published: the waiters learn it at their next recheck
      yield* Fiber.joinAll(waiters).pipe(
        Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the waiters did not see the lost count") })
      )
      assert.strictEqual(yield* CountDownLatch.count(latch), 0)
      // and the latch can be set again
      assert.isTrue(yield* CountDownLatch.trySetCount(latch, 1))
    }), 30_000)
})
