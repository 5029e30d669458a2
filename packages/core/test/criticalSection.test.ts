import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, ExecutionStrategy, Exit, Fiber, FiberRef, Scope, TestClock } from "effect"
import { Lock, LockError } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"

describe("withLock's body fiber", () => {
  it.effect("runs bodies nested far deeper than those started at once on the stack", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("section:nested")
      const nest = (depth: number): Effect.Effect<number, unknown> =>
        depth === 0 ? Effect.succeed(0) : Lock.withLock(Effect.map(Effect.suspend(() => nest(depth - 1)), (n) => n + 1), lock)
      assert.strictEqual(yield* nest(2_000), 2_000)
      assert.isFalse(yield* Lock.isLocked(lock))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a body that suspends is awaited, and an interruption of the caller interrupts it before the release", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("section:suspended")
      const entered = yield* Deferred.make<void>()
      const order: Array<string> = []
      const caller = yield* Effect.fork(Lock.withLock(
        Effect.zipRight(Deferred.succeed(entered, undefined), Effect.never).pipe(
          Effect.onInterrupt(() => Effect.sync(() => order.push("body interrupted")))
        ),
        lock
      ))
      yield* Deferred.await(entered)
      assert.isTrue(yield* Lock.isLocked(lock))
      const exit = yield* Fiber.interrupt(caller)
      assert.isTrue(Exit.isInterrupted(exit))
      assert.deepStrictEqual(order, ["body interrupted"])
      assert.isFalse(yield* Lock.isLocked(lock))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a lease lost while the body runs interrupts it with LockLost", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("section:lost", { lease: "1 second" })
      const error = yield* Effect.flip(Lock.withLock(Effect.zipRight(TestClock.adjust("2 seconds"), Effect.never), lock))
      assert.isTrue(error instanceof LockError.LockLost)
      assert.isFalse(yield* Lock.isLocked(lock))
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("withLock's body scope", () => {
  it.effect("closes what the body opened before the release; a finalizer added after it closed runs at once", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("section:scope")
      const order: Array<string> = []
      const bodyScope = yield* Lock.withLock(
        Effect.gen(function*() {
          yield* Effect.addFinalizer(() =>
            Effect.orDie(Effect.flatMap(Lock.isLocked(lock), (locked) => Effect.sync(() => order.push(`finalizer, locked ${locked}`))))
          )
          return yield* Effect.scope
        }),
        lock
      )
      assert.deepStrictEqual(order, ["finalizer, locked true"])
      yield* Scope.addFinalizer(bodyScope, Effect.sync(() => order.push("late finalizer")))
      assert.deepStrictEqual(order, ["finalizer, locked true", "late finalizer"])
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a body that never uses its scope leaves one that runs a late finalizer at once", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("section:unused-scope")
      const bodyScope = yield* Lock.withLock(Effect.scope, lock)
      let ran = false
      yield* Scope.addFinalizer(bodyScope, Effect.sync(() => (ran = true)))
      assert.isTrue(ran)
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a scope forked from the body's closes with it, before the release", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("section:forked-scope")
      const order: Array<string> = []
      yield* Lock.withLock(
        Effect.gen(function*() {
          const child = yield* Scope.fork(yield* Effect.scope, ExecutionStrategy.sequential)
          yield* Scope.addFinalizer(
            child,
            Effect.orDie(Effect.flatMap(Lock.isLocked(lock), (locked) => Effect.sync(() => order.push(`child, locked ${locked}`))))
          )
        }),
        lock
      )
      assert.deepStrictEqual(order, ["child, locked true"])
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("the caller's fiber refs after withLock, where the caller set a ref whose fork changes it", () => {
  const forked = FiberRef.unsafeMake(0, { fork: (n) => n + 1 })
  const forkedJoinedBack = FiberRef.unsafeMake(0, { fork: (n) => n + 1, join: (parent) => parent })
  for (const [name, ref] of [["joined as the child's", forked], ["joined back to the parent's", forkedJoinedBack]] as const) {
    it.effect(`are those of a fork and join of the body: ${name}, every time`, () =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("section:fork-refs")
        const underLock: Array<number> = []
        const joined: Array<number> = []
        yield* Effect.scoped(Effect.gen(function*() {
          yield* FiberRef.set(ref, 10)
          for (let i = 0; i < 3; i++) {
            yield* Lock.withLock(Effect.void, lock)
            underLock.push(yield* FiberRef.get(ref))
          }
        }))
        yield* Effect.scoped(Effect.gen(function*() {
          yield* FiberRef.set(ref, 10)
          for (let i = 0; i < 3; i++) {
            yield* Effect.flatMap(Effect.fork(Effect.void), Fiber.join)
            joined.push(yield* FiberRef.get(ref))
          }
        }))
        assert.deepStrictEqual(underLock, joined)
      }).pipe(Effect.provide(MemoryBackend.layer)))
  }
})
