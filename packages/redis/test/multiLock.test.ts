/**
 * A MultiLock whose parts live on different backends: two independent redis-servers (started by
 * the test on free loopback ports) and the memory backend. What it costs in backend calls, what a
 * waiting multi-lock holds, and what happens to every part when one server dies under a holder.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Option } from "effect"
import { Lock, MultiLock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import { RedisServer } from "@lockstep/servers"
import { backendOn, counted, eventually, runnable, typedFailure, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("MultiLock across backends (multiLock.test.ts)")

/** Two servers and the memory backend, each with one lock handle on `key`. */
const threeBackends = (key: string, options?: Lock.Options) =>
  Effect.gen(function*() {
    const serverA = yield* RedisServer.make()
    const serverB = yield* RedisServer.make()
    const a = counted(yield* backendOn(serverA.url))
    const b = counted(yield* backendOn(serverB.url))
    const memory = counted(Context.get(yield* Layer.build(MemoryBackend.layer), LockBackend))
    const locks = yield* Effect.all([a, b, memory].map(({ service }) => Lock.make(key, options).pipe(withBackend(service))))
    return { serverB, backends: [a, b, memory], locks }
  })

describe.runIf(runnable)("MultiLock across two redis-servers and memory", () => {
  it.scopedLive("one backend call per part to acquire and one to release; a waiting multi-lock holds nothing past the bound", () =>
    Effect.gen(function*() {
      const { backends, locks } = yield* threeBackends("multi-orders")
      const multi = yield* MultiLock.make(...locks)
      // uncontended: one acquire and one release per part, nothing else
      const lease = yield* Effect.scoped(Effect.tap(MultiLock.acquire(multi), () =>
        Effect.forEach(locks, Lock.isLocked).pipe(Effect.map((held) => assert.deepStrictEqual(held, [true, true, true])))))
      assert.strictEqual(lease.parts.length, 3)
      assert.deepStrictEqual(backends.map((b) => b.calls.acquire), [1, 1, 1])
      assert.deepStrictEqual(backends.map((b) => b.calls.release), [1, 1, 1])
      assert.deepStrictEqual(backends.map((b) => b.calls.renew), [0, 0, 0])
      // the part on server B is busy: the multi-lock waits for it alone
      const released = yield* Deferred.make<void>()
      const other = yield* Effect.fork(Deferred.await(released).pipe(Lock.withLock(locks[1]!)))
      yield* eventually("B held by the other fiber", Lock.isLocked(locks[1]!).pipe(Effect.orDie), 2_000)
      const waiter = yield* Effect.fork(Effect.scoped(Effect.flatMap(MultiLock.acquire(multi), () =>
        Effect.forEach(locks, Lock.isLocked))))
      // the parts are ordered by key, then as given: A, B, memory. It holds A while it waits for
      // B, for a bounded time, then waits for B alone
      yield* eventually("A taken before waiting for B", Lock.isLocked(locks[0]!).pipe(Effect.orDie), 2_000)
      assert.isFalse(yield* Lock.isLocked(locks[2]!), "took the memory part before B")
      yield* Effect.sleep(MultiLock.holdWhileWaiting)
      yield* eventually(
        "the part on server A released past the bound while waiting for B",
        Effect.map(Lock.isLocked(locks[0]!).pipe(Effect.orDie), (locked) => !locked),
        3_000
      )
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)))
      assert.isFalse(yield* Lock.isLocked(locks[2]!), "held the memory part while waiting for B")
      const sentAt = performance.now()
      yield* Deferred.succeed(released, undefined)
      yield* Fiber.join(other)
      const held = yield* Fiber.join(waiter)
      const handoffMs = performance.now() - sentAt
      assert.deepStrictEqual(held, [true, true, true])
      // a wake-up, not the 5 s waiter timeout, ended the wait (a loaded machine may be slow, not 5 s slow)
      assert.isBelow(handoffMs, 4_000)
      for (const lock of locks) assert.isFalse(yield* Lock.isLocked(lock))
      console.log(`[multi] handoff from B's release to all three held: ${handoffMs.toFixed(1)} ms`)
    }), 30_000)

  it.scopedLive("server B killed under a holder: LockLost names B, the body is interrupted, A and memory are released", () =>
    Effect.gen(function*() {
      const { backends, locks, serverB } = yield* threeBackends("multi-killed", { watchdog: Duration.millis(600) })
      const multi = yield* MultiLock.make(...locks)
      const entered = yield* Deferred.make<void>()
      const interrupted = yield* Deferred.make<void>()
      const body = Effect.zipRight(Deferred.succeed(entered, undefined), Effect.never).pipe(
        Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined))
      )
      const holder = yield* Effect.fork(MultiLock.withLock(body, multi))
      yield* Deferred.await(entered)
      const killedAt = performance.now()
      yield* serverB.kill
      const exit = yield* Fiber.await(holder).pipe(
        Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error("the holder did not end within 5 s of the kill") })
      )
      const lostAfterMs = performance.now() - killedAt
      const error = typedFailure(exit)
      assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost", String(exit))
      assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "DeadlinePassed")
      // the part lost is B's: its holder carries B's client id
      assert.isTrue(
        Option.isSome(error) && error.value._tag === "LockLost" && error.value.holder.startsWith(`${backends[1]!.service.clientId}:`)
      )
      assert.isTrue(yield* Deferred.isDone(interrupted), "the body was not interrupted")
      assert.isFalse(Exit.isSuccess(exit))
      // the parts on the live backends were released with the body, not left to expire
      assert.isFalse(yield* Lock.isLocked(locks[0]!))
      assert.isFalse(yield* Lock.isLocked(locks[2]!))
      assert.isBelow(lostAfterMs, 600 + 500)
      console.log(`[multi] server B killed: LockLost(DeadlinePassed) ${lostAfterMs.toFixed(0)} ms after the kill (watchdog 600 ms)`)
    }), 30_000)
})
