import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer, Option, Schedule } from "effect"
import { Lock, LockBackend, LockError, MultiLock } from "@lockstep/core"
import type { Service } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"

// Real time: a waiter that misses its wake-up only gets in at `waiterTimeout` (20 s here), so the
// bounds below fail on a lost wake-up instead of hanging on a TestClock nobody moves.
const waiterTimeout = "20 seconds"

describe("a waiting MultiLock", () => {
  for (const parts of [1, 2]) {
    it.live(`is woken by the release (${parts} part(s)), not by its waiter timeout`, () =>
      Effect.gen(function*() {
        const stamps: Array<{ who: string; at: "in" | "out"; ms: number }> = []
        const worker = (who: string) =>
          Effect.gen(function*() {
            const locks = yield* Effect.forEach(
              Array.from({ length: parts }, (_, i) => `handoff:multi:${parts}:${i}`),
              (key) => Lock.make(key, { waiterTimeout })
            )
            const multi = yield* MultiLock.make(...locks)
            yield* Effect.gen(function*() {
              stamps.push({ who, at: "in", ms: performance.now() })
              yield* Effect.sleep("200 millis")
              stamps.push({ who, at: "out", ms: performance.now() })
            }).pipe(MultiLock.withLock(multi))
          })
        yield* Effect.all([worker("w1"), worker("w2")], { concurrency: "unbounded" })
        assert.deepStrictEqual(stamps.map((s) => s.at), ["in", "out", "in", "out"])
        const gap = stamps[2]!.ms - stamps[1]!.ms
        assert.isBelow(gap, 250, `the second entered ${gap.toFixed(1)} ms after the first left`)
      }).pipe(Effect.provide(MemoryBackend.layer)), 30_000)
  }

  it.live("withLock is interrupted at once while it waits, leaving nothing held", () =>
    Effect.gen(function*() {
      const a = yield* Lock.make("handoff:interrupt:a", { waiterTimeout })
      const b = yield* Lock.make("handoff:interrupt:b", { waiterTimeout })
      const both = yield* MultiLock.make(a, b)
      const holder = yield* Effect.fork(Lock.withLock(Effect.never, b))
      yield* Effect.sleep("20 millis")
      const waiter = yield* Effect.fork(MultiLock.withLock(Effect.void, both))
      yield* Effect.sleep("50 millis")
      const startedAt = performance.now()
      yield* Fiber.interrupt(waiter)
      const took = performance.now() - startedAt
      assert.isBelow(took, 250, `the interruption took ${took.toFixed(1)} ms`)
      assert.isFalse(yield* Lock.isLocked(a), "the part it took while waiting was released")
      yield* Fiber.interrupt(holder)
    }).pipe(Effect.provide(MemoryBackend.layer)), 30_000)
})


describe("MultiLock's tries, as Lock's", () => {
  it.live("tryAcquire with `wait`: None past it (holding nothing), Some when the parts are freed within it", () =>
    Effect.gen(function*() {
      const a = yield* Lock.make("multi:try:a", { waiterTimeout })
      const b = yield* Lock.make("multi:try:b", { waiterTimeout })
      const both = yield* MultiLock.make(a, b)
      const holder = yield* Effect.fork(Lock.withLock(Effect.sleep("150 millis"), b))
      yield* Effect.sleep("20 millis")
      assert.isTrue(Option.isNone(yield* Effect.scoped(MultiLock.tryAcquire(both))))
      assert.isTrue(Option.isNone(yield* Effect.scoped(MultiLock.tryAcquire(both, { wait: "30 millis" }))))
      assert.isFalse(yield* Lock.isLocked(a), "a part taken while waiting was released")
      const later = yield* Effect.scoped(
        Effect.flatMap(MultiLock.tryAcquire(both, { wait: "2 seconds" }), (lease) =>
          Effect.map(Effect.all([Lock.isLocked(a), Lock.isLocked(b)]), (locked) => ({ lease, locked })))
      )
      assert.isTrue(Option.isSome(later.lease))
      assert.deepStrictEqual(later.locked, [true, true])
      yield* Fiber.join(holder)
      const refused = yield* Effect.flip(Effect.scoped(MultiLock.tryAcquire(both, { wait: "0 millis" })))
      assert.strictEqual(refused._tag, "InvalidLockOptions")
    }).pipe(Effect.provide(MemoryBackend.layer)), 30_000)

  it.live("withLockIfAvailable: Some when free, None without running the body when taken or past `wait`", () =>
    Effect.gen(function*() {
      const a = yield* Lock.make("multi:if:a", { waiterTimeout })
      const b = yield* Lock.make("multi:if:b", { waiterTimeout })
      const both = yield* MultiLock.make(a, b)
      let runs = 0
      const body = Effect.sync(() => ++runs)
      assert.deepStrictEqual(yield* MultiLock.withLockIfAvailable(body, both), Option.some(1))
      assert.isFalse(yield* Lock.isLocked(a))
      const holder = yield* Effect.fork(Lock.withLock(Effect.sleep("150 millis"), a))
      yield* Effect.sleep("20 millis")
      assert.deepStrictEqual(yield* body.pipe(MultiLock.withLockIfAvailable(both)), Option.none())
      assert.deepStrictEqual(yield* body.pipe(MultiLock.withLockIfAvailable(both, { wait: "30 millis" })), Option.none())
      assert.strictEqual(runs, 1, "the body did not run")
      assert.isFalse(yield* Lock.isLocked(b), "nothing is left held")
      const fences = yield* MultiLock.withLockIfAvailable(
        (lease) => Effect.succeed(lease.parts.map((part) => part.fence)),
        both,
        { wait: "2 seconds" }
      )
      assert.isTrue(Option.isSome(fences) && fences.value.length === 2)
      yield* Fiber.join(holder)
      // a LockTimeout of the body's own is the body's failure, not "unavailable"
      const own = yield* Effect.flip(MultiLock.withLockIfAvailable(Effect.fail(new LockError.LockTimeout({ key: "elsewhere", timeout: Duration.seconds(1) })), both))
      assert.strictEqual(own._tag, "LockTimeout")
    }).pipe(Effect.provide(MemoryBackend.layer)), 30_000)

  it.effect("`retry` takes a part again after a BackendError, as Lock.acquire does", () =>
    Effect.gen(function*() {
      const memory = yield* MemoryBackend.make
      let failures = 2
      const flaky: Service = {
        ...memory,
        acquire: (request) =>
          failures > 0 && request.key === "multi:retry:b"
            ? Effect.suspend(() => (failures--, Effect.fail(new LockError.BackendError({ operation: "acquire", cause: "connection refused" }))))
            : memory.acquire(request)
      }
      const result = yield* Effect.gen(function*() {
        const both = yield* MultiLock.make(yield* Lock.make("multi:retry:a"), yield* Lock.make("multi:retry:b"))
        const failed = yield* Effect.flip(MultiLock.withLockIfAvailable(Effect.void, both))
        assert.strictEqual(failed._tag, "BackendError", "without a schedule the first BackendError fails")
        return yield* MultiLock.withLock(Effect.succeed("in"), both, { retry: Schedule.recurs(3) })
      }).pipe(Effect.provide(Layer.succeed(LockBackend.LockBackend, flaky)))
      assert.strictEqual(result, "in")
      assert.strictEqual(failures, 0)
    }))
})
