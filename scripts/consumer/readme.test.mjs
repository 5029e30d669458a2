// A test file as an application writes one after the README's testing line: @effect/vitest on
// vitest 3, locks on the memory backend (on the TestClock) and on the Redis backend over
// ioredis-mock (@lockstep/testkit/RedisMock). Run by scripts/consumer-check.sh with `npx vitest run`.
import { assert, it } from "@effect/vitest"
import { Duration, Effect, Fiber, TestClock } from "effect"
import { Lock } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"
import * as RedisMock from "@lockstep/testkit/RedisMock"

it.effect("a waiter is granted the lock when the holder's scope closes, with a higher fence", () =>
  Effect.gen(function* () {
    const lock = yield* Lock.make("consumer:readme")
    const first = yield* Lock.acquire(lock).pipe(Effect.map((lease) => lease.fence), Effect.scoped)
    const second = yield* Effect.fork(Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
    yield* TestClock.adjust(Duration.seconds(1))
    assert.isAbove(yield* Fiber.join(second), first)
  }).pipe(Effect.provide(MemoryBackend.layer)))

it.live("a lock on the Redis backend over ioredis-mock", () =>
  Effect.gen(function* () {
    const lock = yield* Lock.make("consumer:readme")
    const fence = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
    assert.isAbove(fence, 0)
    assert.isFalse(yield* Lock.isLocked(lock))
  }).pipe(Effect.provide(RedisMock.layer)))
