import { assert } from "@effect/vitest"
import type { Scope } from "effect"
import { Deferred, Effect, Either, Fiber, FiberRef, Layer, Option, Runtime } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import * as Lock from "@lockstep/core/Lock"
import * as Semaphore from "@lockstep/core/Semaphore"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Kit } from "./conformanceKit.js"
import { assertStrictlyIncreasing, counting, failureOf, occupancy, range } from "./conformanceKit.js"

// Lock: mutual exclusion and fences, wake-ups, interruption and timeouts, re-entrancy per fiber,
// scopes and `withLock`, and a request that would wait for its own hold.

export const waiterHandOff = ({ test, freshKey, waiterTimeout, handOff }: Kit): void =>
  test("hand-off: a Lock waiter is let in at the release, not at its own retry", () =>
    handOff("Lock", Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("hand-off-lock"), { waiterTimeout })
      const take = (body: Effect.Effect<void>) => Lock.withLock(body, lock)
      return { hold: take, wait: take }
    })), 60_000)

export const mutualExclusion = ({ test, freshKey, withHistory, contend }: Kit): void =>
  test("60 fibers contend for one Lock: mutual exclusion, increasing fences", () =>
    withHistory(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("mutex"))
      const { fences } = yield* contend(60, 1, () => Lock.acquire(lock), Effect.yieldNow())
      assert.strictEqual(fences.length, 60)
      assertStrictlyIncreasing(fences)
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

export const fenceFloor = ({ harness, test, freshKey, withBackend }: Kit): void =>
  test("a raised fence floor puts every later fence above it; a lower raise or a copy changes nothing", () =>
    withBackend(Effect.gen(function*() {
      const backend = yield* LockBackend
      const lock = yield* Lock.make(yield* freshKey("floor"))
      const first = (yield* Effect.scoped(Lock.acquire(lock))).fence
      // far above anything the backend's clock would give for a long while
      const floor = first + 3_600_000_000
      // the most the next fence may be above the last one: one, or (gapped fences) far less than
      // the floor's height, which a copy of the raise that moved the floor again would add
      const step = harness.fences === "gapped" ? 1_000_000 : 1
      yield* backend.raiseFence({ key: lock.key, fence: floor, leaseMs: 30_000 })
      yield* backend.raiseFence({ key: lock.key, fence: floor, leaseMs: 30_000 })
      const second = (yield* Effect.scoped(Lock.acquire(lock))).fence
      assert.isAbove(second, floor)
      assert.isAtMost(second, floor + step, "a copy of the raise moved the floor again")
      yield* backend.raiseFence({ key: lock.key, fence: first, leaseMs: 30_000 })
      const third = (yield* Effect.scoped(Lock.acquire(lock))).fence
      assert.isAbove(third, second)
      assert.isAtMost(third, second + step, "a lower raise moved the floor")
      const reported = (yield* backend.inspect(lock.key)).fence
      if (harness.fences === "gapped") assert.include([0, third], reported)
      else assert.strictEqual(reported, third)
    })))

export const wakeUp = ({ test, settle, promptly, freshKey, hold, withBackend }: Kit): void =>
  test("a release wakes a waiter at once (no polling)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("wake"))
      const first = yield* hold(Lock.acquire(lock))
      const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)))
      yield* first.release
      // the holder's lease is 30 s: only a wake-up can end this wait in time
      const lease = yield* Fiber.join(waiter).pipe(promptly)
      assert.isAbove(lease.fence, first.lease.fence)
    })))

export const interruptionAtEveryStep = ({ live, everyKind, promptly, freshKey, assertFree, hold, withBackend }: Kit): void =>
  everyKind("interruption at every step of acquire leaves nothing held or queued", () =>
    withBackend(Effect.gen(function*() {
      for (const steps of range(24)) {
        for (const kind of ["Lock", "FairLock", "Semaphore"] as const) {
          const key = yield* freshKey(`interrupt-${kind}-${steps}`)
          const acquire = kind === "Lock"
            ? Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l))
            : kind === "FairLock"
            ? Effect.flatMap(FairLock.make(key), (l) => Lock.acquire(l))
            : Effect.flatMap(Semaphore.make(key, { limit: 1 }), (s) => Semaphore.acquire(s))
          const stepOnce = live ? Effect.sleep(steps % 6) : Effect.yieldNow()
          // uncontended: the grant is either released on interruption or never made
          const alone = yield* Effect.fork(Effect.scoped(Effect.zipRight(acquire, Effect.never)))
          yield* Effect.repeatN(stepOnce, steps)
          yield* Fiber.interrupt(alone)
          yield* assertFree(key)
          // contended: the interrupted waiter leaves no queue entry and swallows no wake-up
          const first = yield* hold(acquire)
          const interrupted = yield* Effect.fork(Effect.scoped(acquire))
          const next = yield* Effect.fork(Effect.scoped(Effect.asVoid(acquire)))
          yield* Effect.repeatN(stepOnce, steps)
          yield* Fiber.interrupt(interrupted)
          yield* first.release
          yield* Fiber.join(next).pipe(promptly)
          yield* assertFree(key)
        }
      }
    })), 120_000)

export const timeout = ({ everyKind, settle, advance, freshKey, inspect, assertFree, hold, withBackend }: Kit): void =>
  everyKind("a waiter times out with LockTimeout and leaves no queue entry", () =>
    withBackend(Effect.gen(function*() {
      for (const fair of [false, true]) {
        const key = yield* freshKey(`timeout-${fair}`)
        const lock = yield* (fair ? FairLock.make(key) : Lock.make(key))
        const first = yield* hold(Lock.acquire(lock))
        const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock, { timeout: "500 millis" })))
        yield* settle
        yield* advance(500)
        const error = failureOf(yield* Fiber.await(waiter))
        assert.isTrue(Option.isSome(error) && error.value._tag === "LockTimeout")
        assert.deepStrictEqual((yield* inspect(key)).queue, [])
        yield* first.release
        yield* assertFree(key)
      }
    })))

export const reentrancy = ({ test, freshKey, withBackend }: Kit): void =>
  test("re-entrancy is per fiber: the holder re-enters, fibers it forks and other fibers are excluded", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("reentrant"))
      const go = yield* Deferred.make<void>()
      // forked before the lock is taken: a different holder
      const other = yield* Effect.fork(
        Effect.zipRight(Deferred.await(go), Effect.scoped(Effect.map(Lock.tryAcquire(lock), Option.isSome)))
      )
      yield* Effect.scoped(Effect.gen(function*() {
        const outer = yield* Lock.acquire(lock)
        const inner = yield* Lock.acquire(lock)
        assert.strictEqual(inner.fence, outer.fence)
        assert.strictEqual(inner.holder, outer.holder)
        assert.strictEqual(yield* Lock.holdCount(lock), 2)
        // a fiber forked while holding does not hold the lock: it would run beside its parent
        const child = yield* Effect.fork(Effect.scoped(Effect.flatMap(Lock.tryAcquire(lock), (lease) =>
          Effect.map(Lock.holdCount(lock), (count) => [Option.isSome(lease), count] as const))))
        assert.deepStrictEqual(yield* Fiber.join(child), [false, 0])
        yield* Deferred.succeed(go, undefined)
        assert.isFalse(yield* Fiber.join(other), "another fiber entered a held lock")
        // nested withLock re-enters instead of deadlocking (its body runs in a raced fiber)
        assert.strictEqual(yield* Lock.holdCount(lock).pipe(Lock.withLock(lock), Lock.withLock(lock)), 4)
      }))
      assert.strictEqual(yield* Lock.holdCount(lock), 0)
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

export const children = ({ test, settle, promptly, freshKey, withBackend }: Kit): void =>
  test("concurrent children each take the lock in turn: they never share their parent's critical section", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("children"))
      const inside = occupancy(1)
      const section = Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        yield* inside.enter(lease)
        yield* settle
        yield* inside.leave(lease)
      }))
      // the children start while the parent holds the lock: they wait, then enter one at a time
      yield* Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        yield* inside.enter(lease)
        const children = yield* Effect.fork(Effect.all(range(4).map(() => section), { concurrency: "unbounded" }))
        yield* settle
        yield* inside.leave(lease)
        return children
      })).pipe(Effect.flatMap((children) => Fiber.join(children).pipe(promptly)))
      assert.deepStrictEqual(inside.state.violations, [])
      assert.strictEqual(inside.state.maxHolders, 1)
    })))

export const heldByLayer = ({ test, freshKey, withBackend }: Kit): void =>
  test("a lock acquired while building a layer is not held by the fibers later run on its runtime", () =>
    Effect.gen(function*() {
      const backend = yield* LockBackend
      const key = yield* freshKey("layer")
      const held = Layer.scopedDiscard(Effect.flatMap(Lock.make(key), (lock) => Lock.acquire(lock)))
      const runtime = yield* Layer.toRuntime(Layer.merge(held, Layer.succeed(LockBackend, backend)))
      const probe = Effect.scoped(Effect.flatMap(Lock.make(key), (lock) => Effect.map(Lock.tryAcquire(lock), Option.isSome)))
      const entered = yield* Effect.promise(() => Runtime.runPromise(runtime)(probe))
      assert.isFalse(entered, "a fiber of the runtime entered the lock its layer holds")
    }).pipe(Effect.scoped, withBackend))

export const releasedOnce = ({ harness, test, settle, freshKey, assertFree }: Kit): void =>
  test("scope close releases exactly once: success, failure, interruption, re-entry", () =>
    Effect.gen(function*() {
      const backend = counting(harness.layer)
      yield* Effect.gen(function*() {
        const key = yield* freshKey("once")
        const lock = yield* Lock.make(key)
        yield* Lock.withLock(Effect.void, lock)
        assert.strictEqual(backend.calls("release"), 1)
        yield* Effect.either(Lock.withLock(Effect.fail("boom"), lock))
        assert.strictEqual(backend.calls("release"), 2)
        const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
        yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(backend.calls("release"), 3)
        yield* Effect.scoped(Effect.zipRight(Lock.acquire(lock), Lock.acquire(lock)))
        assert.strictEqual(backend.calls("release"), 5)
        yield* assertFree(key)
      }).pipe(Effect.provide(backend.layer))
    }))

export const scopedBody = ({ test, freshKey, withBackend }: Kit): void =>
  test("withLock closes the body's scoped resources before the release, also inside Effect.scoped", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("scoped"))
      const log: Array<string> = []
      const body = Effect.gen(function*() {
        yield* Effect.addFinalizer(() =>
          Effect.flatMap(Lock.isLocked(lock), (locked) => Effect.sync(() => log.push(`resource closed, locked: ${locked}`))).pipe(Effect.orDie)
        )
        log.push("body")
      })
      yield* Effect.scoped(Lock.withLock(body, lock))
      yield* body.pipe(Lock.withLock(lock))
      assert.deepStrictEqual(log, ["body", "resource closed, locked: true", "body", "resource closed, locked: true"])
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

export const fiberRefs = ({ test, freshKey, withBackend }: Kit): void =>
  test("withLock's body runs as part of its caller: the fiber refs it sets are seen after it, as inline", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("refs"))
      const ref = FiberRef.unsafeMake(0)
      // a body that changes no fiber ref leaves the caller's as they were
      yield* Lock.withLock(Effect.void, lock)
      assert.strictEqual(yield* FiberRef.get(ref), 0)
      // one that does hands the change on, also through a nested (re-entrant) withLock
      yield* Lock.withLock(FiberRef.set(ref, 1), lock)
      assert.strictEqual(yield* FiberRef.get(ref), 1)
      yield* Lock.withLock(Lock.withLock(FiberRef.update(ref, (n) => n + 1), lock), lock)
      assert.strictEqual(yield* FiberRef.get(ref), 2)
      // a failing body too: its change is kept with the failure, as an inline body's would be
      const failed = yield* Effect.either(Lock.withLock(Effect.zipRight(FiberRef.set(ref, 3), Effect.fail("boom")), lock))
      assert.deepStrictEqual(failed, Either.left("boom"))
      assert.strictEqual(yield* FiberRef.get(ref), 3)
      // and the lock is free after each of them, held by nobody
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

export const childFiberLease = ({ test, freshKey, withBackend }: Kit): void =>
  test("a lease acquired in a child fiber (Effect.timeout) is re-entered by the parent", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("child"))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock).pipe(Effect.timeout("5 seconds"))
        assert.strictEqual(yield* Lock.holdCount(lock), 1)
        assert.strictEqual(yield* Lock.holdCount(lock).pipe(Lock.withLock(lock, { timeout: "1 second" })), 2)
      }))
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

export const selfDeadlock = ({ everyKind, elapse, shortMs, short, freshKey, assertFree, withBackend }: Kit): void =>
  everyKind("a request that would wait for the current fiber's own hold fails with SelfDeadlock", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("self")
      const lock = yield* Lock.make(key)
      const sem = yield* Semaphore.make(key, { limit: 2 })
      // in this fiber, which holds the key (a forked fiber would not); time passes beside it
      const attempt = <E>(self: Effect.Effect<unknown, E, Scope.Scope>) =>
        Effect.gen(function*() {
          const clock = yield* Effect.fork(elapse(shortMs * 2))
          const error = yield* Effect.scoped(Effect.flip(self))
          yield* Fiber.interrupt(clock)
          return error
        })
      const tagOf = (e: unknown) => (e as { readonly _tag: string })._tag
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Semaphore.acquire(sem)
        assert.strictEqual(tagOf(yield* attempt(Lock.acquire(lock, { timeout: short }))), "SelfDeadlock")
        assert.strictEqual(tagOf(yield* attempt(Semaphore.acquire(sem, { permits: 2, timeout: short }))), "SelfDeadlock")
      }))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock)
        assert.strictEqual(tagOf(yield* attempt(Semaphore.acquire(sem, { timeout: short }))), "SelfDeadlock")
      }))
      yield* assertFree(key)
    })))
