import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Stream, TestClock } from "effect"
import { Lock, MultiLock } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"

describe("withLock's body fiber", () => {
  it.effect("a multi-lock whose first part was lost while it waited for the second never runs its body", () =>
    Effect.gen(function*() {
      const a = yield* Lock.make("review:multi:a", { lease: "100 millis" })
      const b = yield* Lock.make("review:multi:b")
      const both = yield* MultiLock.make(a, b)
      // b is held elsewhere: the multi-lock takes a, then waits for b (up to holdWhileWaiting)
      const releaseB = yield* Deferred.make<void>()
      const holdingB = yield* Deferred.make<void>()
      const holderB = yield* Effect.fork(Lock.withLock(Effect.zipRight(Deferred.succeed(holdingB, undefined), Deferred.await(releaseB)), b))
      yield* Deferred.await(holdingB)
      let otherHoldsA = false
      let ranWhileOtherHeldA = false
      let ran = false
      const waiter = yield* Effect.fork(MultiLock.withLock(Effect.sync(() => {
        ran = true
        ranWhileOtherHeldA = otherHoldsA
      }), both))
      for (let i = 0; i < 10; i++) yield* Effect.yieldNow()
      assert.isTrue(yield* Lock.isLocked(a), "a was taken while waiting for b")
      // a's fixed lease runs out: its hold is lost, and someone else takes a
      yield* TestClock.adjust("300 millis")
      for (let i = 0; i < 10; i++) yield* Effect.yieldNow()
      const holdingA = yield* Deferred.make<void>()
      const releaseA = yield* Deferred.make<void>()
      const holderA = yield* Effect.fork(Lock.withLock(
        Effect.acquireUseRelease(
          Effect.sync(() => (otherHoldsA = true)),
          () => Effect.zipRight(Deferred.succeed(holdingA, undefined), Deferred.await(releaseA)),
          () => Effect.sync(() => (otherHoldsA = false))
        ),
        a
      ))
      yield* Deferred.await(holdingA)
      // b is freed: the multi-lock gets it and goes on to its body with a lost
      yield* Deferred.succeed(releaseB, undefined)
      yield* Fiber.join(holderB)
      const exit = yield* Fiber.await(waiter)
      yield* Deferred.succeed(releaseA, undefined)
      yield* Fiber.join(holderA)
      assert.isFalse(ranWhileOtherHeldA, "the multi-lock's body ran while another holder held a")
      assert.isFalse(ran, "the body ran although part a was lost before it started")
      assert.isTrue(Exit.isFailure(exit) && Exit.isFailure(exit) && String(exit.cause).includes("LockLost"))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("Effect.forkScoped in a body forks into the body's scope (interrupted when it closes)", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("review:forkScoped")
      const fiber = yield* Lock.withLock(Effect.forkScoped(Effect.never), lock)
      const exit = yield* Fiber.await(fiber)
      assert.isTrue(Exit.isInterrupted(exit))
      assert.isFalse(yield* Lock.isLocked(lock))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("Stream.broadcast in a body (forkIn the body's scope) works", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("review:broadcast")
      const got = yield* Lock.withLock(Effect.gen(function*() {
        const [x, y] = yield* Stream.broadcast(Stream.make(1, 2), 2, 4)
        return yield* Stream.runCollect(Stream.merge(x, y))
      }), lock)
      assert.strictEqual(got.length, 4)
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

