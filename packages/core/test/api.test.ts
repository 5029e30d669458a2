import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Either, Exit, Fiber, Layer, Option, Schedule, TestClock } from "effect"
import { Lock, LockBackend, LockError, MultiLock, ReadWriteLock, Semaphore } from "@lockstep/core"
import type { Service } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"

/** The memory backend, counting the calls made to it; acquisitions fail while `down` says so. */
const instrumented = Effect.map(MemoryBackend.make, (backend) => {
  const calls = { acquire: 0, inspect: 0, release: 0, holders: new Array<string>() }
  const control = { down: 0 }
  const service: Service = {
    ...backend,
    acquire: (request) =>
      Effect.suspend(() => {
        calls.acquire++
        calls.holders.push(request.holder)
        if (control.down > 0) {
          control.down--
          return Effect.fail(new LockError.BackendError({ operation: "acquire", cause: "connection refused" }))
        }
        return backend.acquire(request)
      }),
    inspect: (key) => Effect.suspend(() => (calls.inspect++, backend.inspect(key))),
    release: (request) => Effect.suspend(() => (calls.release++, backend.release(request)))
  }
  return { service, calls, control }
})

const withBackend = <A, E>(f: (backend: Effect.Effect.Success<typeof instrumented>) => Effect.Effect<A, E, LockBackend.LockBackend>) =>
  Effect.flatMap(instrumented, (backend) => Effect.provide(f(backend), Layer.succeed(LockBackend.LockBackend, backend.service)))

describe("withLock gives its body the lease", () => {
  it.effect("data-first and piped, with the fence the backend granted", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:lease")
      const seen = yield* Lock.withLock(
        (lease) => Effect.map(Lock.holders(lock), (holders) => ({ lease, holders })),
        lock
      )
      assert.strictEqual(seen.lease.key, "api:lease")
      assert.strictEqual(seen.holders.length, 1)
      assert.strictEqual(seen.holders[0]!.holder, seen.lease.holder)
      const fence = yield* Lock.withLock(lock)((lease) => Effect.succeed(lease.fence))
      assert.isAbove(fence, seen.lease.fence)
      const left = yield* Lock.withLock(lock, { timeout: "1 second" })((lease) => lease.expiresIn)
      assert.isAbove(Duration.toMillis(left), 0)
      assert.isFalse(yield* Lock.isLocked(lock))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a logged or serialized lease shows its key, holder, mode, permits and fence", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:shown")
      const lease = yield* Lock.withLock((lease) => Effect.succeed(lease), lock)
      const shown = { key: "api:shown", holder: lease.holder, mode: "exclusive", permits: 1, fence: lease.fence }
      assert.deepStrictEqual(JSON.parse(JSON.stringify(lease)), shown)
      const { inspect } = yield* Effect.promise(() => import("node:util"))
      assert.include(inspect(lease), `fence: ${lease.fence}`)
      assert.include(inspect(lease), "key: 'api:shown'")
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a re-entered withLock sees the outer lease's fence", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:reenter")
      const [outer, inner] = yield* Lock.withLock(
        (outer) => Lock.withLock((inner) => Effect.succeed([outer.fence, inner.fence] as const), lock),
        lock
      )
      assert.strictEqual(inner, outer)
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("Semaphore.withPermits passes the lease with its permits", () =>
    Effect.gen(function*() {
      const sem = yield* Semaphore.make("api:sem", { limit: 3 })
      const permits = yield* Semaphore.withPermits((lease) => Effect.succeed(lease.permits), sem, { permits: 2 })
      assert.strictEqual(permits, 2)
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("withLockIfAvailable / withPermitsIfAvailable", () => {
  it.effect("Some when free (and released after), None without running the body when taken", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:if")
      const ran = yield* Effect.succeed("ran").pipe(Lock.withLockIfAvailable(lock))
      assert.deepStrictEqual(ran, Option.some("ran"))
      assert.isFalse(yield* Lock.isLocked(lock))

      let bodies = 0
      const taken = yield* Effect.fork(Lock.withLock(Effect.never, lock))
      yield* Effect.yieldNow()
      assert.isTrue(yield* Lock.isLocked(lock))
      const skipped = yield* Lock.withLockIfAvailable(Effect.sync(() => ++bodies), lock)
      assert.deepStrictEqual(skipped, Option.none())
      assert.strictEqual(bodies, 0)
      yield* Fiber.interrupt(taken)
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("with `wait`: Some if the lock is released in time, None (not LockTimeout) if not", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:if-wait")
      const holder = yield* Effect.fork(Lock.withLock(Effect.sleep("300 millis"), lock))
      yield* Effect.yieldNow()
      const tooShort = yield* Effect.fork(Lock.withLockIfAvailable(Effect.succeed(1), lock, { wait: "100 millis" }))
      const longEnough = yield* Effect.fork(
        Lock.withLockIfAvailable((lease) => Effect.succeed(lease.fence), lock, { wait: "1 second" })
      )
      yield* TestClock.adjust("150 millis")
      assert.deepStrictEqual(yield* Fiber.join(tooShort), Option.none())
      yield* TestClock.adjust("200 millis")
      yield* Fiber.join(holder)
      const fence = yield* Fiber.join(longEnough)
      assert.isTrue(Option.isSome(fence))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a lost lease interrupts the body with LockLost", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:if-lost", { lease: "1 second" })
      const fiber = yield* Effect.fork(Lock.withLockIfAvailable(Effect.never, lock))
      yield* TestClock.adjust("2 seconds")
      const result = yield* Effect.either(Fiber.join(fiber))
      assert.isTrue(Either.isLeft(result) && result.left._tag === "LockLost")
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("Semaphore.withPermitsIfAvailable: None when the permits are taken", () =>
    Effect.gen(function*() {
      const sem = yield* Semaphore.make("api:sem-if", { limit: 2 })
      const first = yield* Effect.fork(Semaphore.withPermits(Effect.never, sem, { permits: 2 }))
      yield* Effect.yieldNow()
      assert.deepStrictEqual(yield* Semaphore.withPermitsIfAvailable(Effect.succeed(1), sem), Option.none())
      yield* Fiber.interrupt(first)
      assert.deepStrictEqual(yield* Semaphore.withPermitsIfAvailable(Effect.succeed(1), sem, { permits: 2 }), Option.some(1))
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("tryAcquire with a bounded wait", () => {
  it.scoped("None after `wait`; Some when released within it; a bad wait is refused", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:try-wait")
      const holder = yield* Effect.fork(Lock.withLock(Effect.sleep("500 millis"), lock))
      yield* Effect.yieldNow()
      const gaveUp = yield* Effect.fork(Effect.scoped(Lock.tryAcquire(lock, { wait: "200 millis" })))
      const waited = yield* Effect.fork(Effect.scoped(Effect.map(Lock.tryAcquire(lock, { wait: "2 seconds" }), Option.isSome)))
      yield* TestClock.adjust("250 millis")
      assert.isTrue(Option.isNone(yield* Fiber.join(gaveUp)))
      yield* TestClock.adjust("300 millis")
      yield* Fiber.join(holder)
      assert.isTrue(yield* Fiber.join(waited))
      const refused = yield* Effect.either(Lock.tryAcquire(lock, { wait: -1 }))
      assert.isTrue(Either.isLeft(refused) && refused.left._tag === "InvalidLockOptions")
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("isHeldByCurrentFiber", () => {
  it.effect("answers from the fiber's records, without a backend call", () =>
    withBackend(({ calls }) =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("api:mine")
        assert.isFalse(yield* Lock.isHeldByCurrentFiber(lock))
        const [inside, inChild] = yield* Lock.withLock(
          Effect.all([Lock.isHeldByCurrentFiber(lock), Effect.flatMap(Effect.fork(Lock.isHeldByCurrentFiber(lock)), Fiber.join)]),
          lock
        )
        assert.isTrue(inside)
        assert.isFalse(inChild, "a forked fiber does not hold its parent's lock")
        assert.isFalse(yield* Lock.isHeldByCurrentFiber(lock))
        const scoped = yield* Effect.scoped(Effect.zipRight(Lock.acquire(lock), Lock.isHeldByCurrentFiber(lock)))
        assert.isTrue(scoped)
        assert.strictEqual(calls.inspect, 0)
      })))

  it.effect("false once the lease's deadline passed, and per view of a read/write lock", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("api:mine-expired", { lease: "1 second" })
      const fiber = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock)
        const before = yield* Lock.isHeldByCurrentFiber(lock)
        yield* Effect.sleep("2 seconds")
        return [before, yield* Lock.isHeldByCurrentFiber(lock)] as const
      })))
      yield* TestClock.adjust("3 seconds")
      assert.deepStrictEqual(yield* Fiber.join(fiber), [true, false])

      const rw = yield* ReadWriteLock.make("api:mine-rw")
      const [read, write] = yield* Lock.withLock(
        Effect.all([Lock.isHeldByCurrentFiber(rw.read), Lock.isHeldByCurrentFiber(rw.write)]),
        rw.read
      )
      assert.deepStrictEqual([read, write], [true, false])
      const sem = yield* Semaphore.make("api:mine-sem", { limit: 2 })
      assert.isTrue(yield* Semaphore.withPermits(Semaphore.isHeldByCurrentFiber(sem), sem))
      assert.isFalse(yield* Semaphore.isHeldByCurrentFiber(sem))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a fiber that joins many children holds every lease they took, and forgets them when they end", () =>
    withBackend(({ calls }) =>
      Effect.gen(function*() {
        const n = 2_000
        const locks = yield* Effect.forEach(Array.from({ length: n }, (_, i) => i), (i) => Lock.make(`api:burst:${i}`))
        yield* Effect.scoped(Effect.gen(function*() {
          // each child's lease passes to this fiber when Effect.forEach joins it
          yield* Effect.forEach(locks, (lock) => Lock.acquire(lock), { concurrency: "unbounded", discard: true })
          const held = yield* Effect.forEach(locks, Lock.isHeldByCurrentFiber)
          assert.strictEqual(held.filter(Boolean).length, n)
          // re-entry: the same holder, no new one
          const before = calls.holders.length
          yield* Lock.withLock(Effect.void, locks[7]!)
          assert.strictEqual(calls.holders.at(-1), calls.holders[7])
          assert.strictEqual(calls.holders.length, before + 1)
          // a re-entered lease released: the outer one still holds
          yield* Effect.scoped(Lock.acquire(locks[0]!))
          assert.isTrue(yield* Lock.isHeldByCurrentFiber(locks[0]!))
        }))
        assert.strictEqual(calls.release, n + 2)
        const after = yield* Effect.forEach(locks, Lock.isHeldByCurrentFiber)
        assert.strictEqual(after.filter(Boolean).length, 0)
      })))
})

describe("retry of backend failures while acquiring", () => {
  it.effect("without a schedule the first BackendError fails the acquisition, with nothing held", () =>
    withBackend(({ control }) =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("api:retry-none")
        control.down = 1
        const result = yield* Effect.either(Lock.withLock(Effect.void, lock))
        assert.isTrue(Either.isLeft(result) && result.left._tag === "BackendError")
        assert.isFalse(yield* Lock.isLocked(lock))
      })))

  it.effect("a schedule retries (as a new holder) until the backend answers; each delay is the schedule's", () =>
    withBackend(({ calls, control }) =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("api:retry")
        control.down = 3
        const fiber = yield* Effect.fork(
          Lock.withLock((lease) => Effect.succeed(lease), lock, { retry: Schedule.spaced("100 millis") })
        )
        yield* TestClock.adjust("250 millis")
        assert.strictEqual(calls.acquire, 3, "two delays of 100 ms passed: three attempts")
        assert.isNull(yield* Fiber.poll(fiber).pipe(Effect.map(Option.getOrNull)))
        yield* TestClock.adjust("100 millis")
        const lease = yield* Fiber.join(fiber)
        assert.isAbove(lease.fence, 0)
        assert.strictEqual(calls.acquire, 4)
        assert.strictEqual(new Set(calls.holders).size, 4, "each retry starts over as a new holder")
        assert.strictEqual(lease.holder, calls.holders[3])
      })))

  it.effect("when the schedule ends, the acquisition fails with the BackendError", () =>
    withBackend(({ calls, control }) =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("api:retry-exhausted")
        control.down = 10
        const fiber = yield* Effect.fork(
          Effect.either(Lock.withLock(Effect.void, lock, { retry: Schedule.recurs(2) }))
        )
        yield* TestClock.adjust("1 second")
        const result = yield* Fiber.join(fiber)
        assert.isTrue(Either.isLeft(result) && result.left._tag === "BackendError")
        assert.strictEqual(calls.acquire, 3)
        control.down = 0
        assert.isFalse(yield* Lock.isLocked(lock))
      })))

  it.effect("the retries stay within the timeout (LockTimeout) and are interruptible", () =>
    withBackend(({ control }) =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("api:retry-timeout")
        control.down = 1_000
        const timed = yield* Effect.fork(Effect.either(
          Lock.withLock(Effect.void, lock, { timeout: "450 millis", retry: Schedule.spaced("100 millis") })
        ))
        yield* TestClock.adjust("1 second")
        const result = yield* Fiber.join(timed)
        assert.isTrue(Either.isLeft(result) && result.left._tag === "LockTimeout")

        const waiting = yield* Effect.fork(Lock.withLock(Effect.void, lock, { retry: Schedule.spaced("1 hour") }))
        yield* TestClock.adjust("1 second")
        const exit = yield* Fiber.interrupt(waiting)
        assert.isTrue(Exit.isInterrupted(exit))
        control.down = 0
        assert.isFalse(yield* Lock.isLocked(lock))
      })))
})

describe("handle names", () => {
  it.effect("an empty name is refused before any backend call", () =>
    Effect.gen(function*() {
      const result = yield* Effect.either(Lock.make("api:name", { name: "" }))
      assert.isTrue(Either.isLeft(result) && result.left._tag === "InvalidLockOptions" && result.left.field === "name")
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("MultiLock.withLock gives its body the multi-lease", () => {
  it.effect("with each part's fence", () =>
    Effect.gen(function*() {
      const a = yield* Lock.make("api:multi-a")
      const b = yield* Lock.make("api:multi-b")
      const both = yield* MultiLock.make(a, b)
      const seen = yield* MultiLock.withLock(
        (lease) => Effect.map(Effect.all([Lock.holders(a), Lock.holders(b)]), (holders) => ({ lease, holders })),
        both
      )
      assert.strictEqual(seen.lease.parts.length, 2)
      assert.deepStrictEqual(
        seen.lease.parts.map((part) => part.key).sort(),
        ["api:multi-a", "api:multi-b"]
      )
      for (const part of seen.lease.parts) assert.isAbove(part.fence, 0)
      assert.deepStrictEqual(seen.holders.map((h) => h.length), [1, 1])
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("an acquisition that starts over", () => {
  it.effect("an interruption while the new holder's grant is in flight leaves nothing held", () =>
    Effect.gen(function*() {
      const memory = yield* MemoryBackend.make
      let calls = 0
      const backend: Service = {
        ...memory,
        acquire: (request) => {
          calls++
          // the first attempt is refused as a late copy (NotHeld): the acquisition starts over as a
          // new holder; that attempt is granted, and its reply takes a while to come back
          if (calls === 1) return Effect.fail(new LockError.NotHeld({ key: request.key, holder: request.holder }))
          return Effect.tap(memory.acquire(request), () => Effect.sleep("100 millis"))
        }
      }
      const result = yield* Effect.gen(function*() {
        const lock = yield* Lock.make("api:restart")
        const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
        yield* TestClock.adjust("50 millis")
        assert.strictEqual(calls, 2, "the second attempt is in flight")
        const interrupted = yield* Effect.fork(Fiber.interrupt(fiber))
        yield* TestClock.adjust("100 millis")
        yield* Fiber.join(interrupted)
        return yield* Lock.isLocked(lock)
      }).pipe(Effect.provide(Layer.succeed(LockBackend.LockBackend, backend)))
      assert.isFalse(result, "the grant that arrived after the interruption was released")
    }))
})

describe("keys", () => {
  it.effect("a key with a lone UTF-16 surrogate is refused before any I/O (UTF-8 would merge it with others)", () =>
    Effect.gen(function*() {
      for (const key of ["k\uD800", "k\uDC00", "\uDC00\uD800", "a\uD83Db"]) {
        const refused = yield* Effect.either(Lock.make(key))
        assert.isTrue(
          Either.isLeft(refused) && refused.left._tag === "InvalidLockOptions" && refused.left.field === "key",
          JSON.stringify(key)
        )
      }
      // a pair is a character: accepted
      assert.isTrue(Either.isRight(yield* Effect.either(Lock.make("lock \uD83D\uDD12"))))
    }).pipe(Effect.provide(MemoryBackend.layer)))
})
