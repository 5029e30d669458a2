import { assert, describe, it, vi } from "@effect/vitest"
import { Clock, Duration, Effect, Either, FastCheck, Fiber, Layer, Option, TestClock } from "effect"
import { Lock } from "@lockstep/core"
import { LockBackend, subscriptionOf } from "@lockstep/core/LockBackend"
import type { RenewRequest, Service } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import { Heap } from "../src/internal/heap.js"
import type { Entry } from "../src/internal/keeper.js"
import { awaitWakeUp } from "../src/internal/wakeUp.js"

const entry = (): Entry => ({
  key: "k",
  holder: "h",
  watchdogMs: undefined,
  deadline: Infinity,
  confirmedAt: 0,
  attemptedAt: -Infinity,
  renewing: false,
  done: false,
  at: Infinity,
  index: -1,
  onLost: () => Effect.void
})

/** The memory backend, counting renewal calls and the leases they carry. */
const counting = Effect.gen(function*() {
  // a backend of the test's own: a layer's backend closes with the layer
  const backend = yield* MemoryBackend.make
  const counts = { calls: 0, leases: 0 }
  const service: Service = {
    ...backend,
    renew: (requests: ReadonlyArray<RenewRequest>) =>
      Effect.suspend(() => {
        counts.calls++
        counts.leases += requests.length
        return backend.renew(requests)
      })
  }
  return { counts, layer: Layer.succeed(LockBackend, service) }
})

describe("the lease keeper", () => {
  it("its heap always yields the earliest entry, through moves and removals", () =>
    FastCheck.assert(
      FastCheck.property(
        FastCheck.array(
          FastCheck.oneof(
            FastCheck.record({ op: FastCheck.constant("set" as const), slot: FastCheck.nat(15), at: FastCheck.integer({ min: 0, max: 1000 }) }),
            FastCheck.record({ op: FastCheck.constant("remove" as const), slot: FastCheck.nat(15) })
          ),
          { maxLength: 200 }
        ),
        (ops) => {
          const heap = new Heap()
          const entries = Array.from({ length: 16 }, entry)
          const inHeap = new Set<Entry>()
          for (const op of ops) {
            const target = entries[op.slot]!
            if (op.op === "set") {
              heap.set(target, op.at)
              inHeap.add(target)
            } else {
              heap.remove(target)
              inHeap.delete(target)
            }
            assert.strictEqual(heap.size, inHeap.size)
            const earliest = Math.min(...[...inHeap].map((e) => e.at))
            assert.strictEqual(heap.peek()?.at ?? Infinity, earliest)
            for (const e of entries) assert.strictEqual(e.index >= 0, inHeap.has(e))
          }
        }
      )
    ))

  it.scoped("1,000 leases with one watchdog are renewed together, in a few backend calls, and none is lost", () =>
    Effect.gen(function*() {
      const { counts, layer } = yield* counting
      const leases = 1_000
      const watchdog = Duration.seconds(3)
      const holders = yield* Effect.forEach(
        Array.from({ length: leases }, (_, i) => i),
        (i) =>
          Effect.fork(Effect.gen(function*() {
            const lock = yield* Lock.make(`keeper:${i}`, { watchdog })
            yield* Lock.withLock(Effect.never, lock)
          }).pipe(Effect.provide(layer))),
        { concurrency: "unbounded" }
      )
      yield* Effect.repeatN(Effect.yieldNow(), 100)
      // ten watchdog periods: every lease renewed about thirty times
      for (let step = 0; step < 40; step++) yield* TestClock.adjust(Duration.millis(750))
      yield* Effect.repeatN(Effect.yieldNow(), 100)
      for (const holder of holders) assert.isTrue(Option.isNone(yield* Fiber.poll(holder)), "a lease ended")
      assert.isAtLeast(counts.leases, leases * 30)
      // one call per renewal round, not one per lease
      assert.isAtMost(counts.calls, 60, JSON.stringify(counts))
      yield* Effect.forEach(holders, Fiber.interrupt, { discard: true })
    }))

  it.scoped("a lease whose renewals fail is lost at its deadline while the others are kept", () =>
    Effect.gen(function*() {
      const backend = yield* MemoryBackend.make
      const failing: Service = {
        ...backend,
        renew: (requests: ReadonlyArray<RenewRequest>) =>
          Effect.map(backend.renew(requests), (results) =>
            results.map((result, i) => (requests[i]!.key === "keeper:bad" ? Either.right(false) : result)))
      }
      const layer = Layer.succeed(LockBackend, failing)
      const run = (key: string) =>
        Effect.fork(Effect.provide(
          Effect.flatMap(Lock.make(key, { watchdog: Duration.seconds(3) }), (lock) => Lock.withLock(Effect.never, lock)),
          layer
        ))
      const good = yield* run("keeper:good")
      const bad = yield* run("keeper:bad")
      yield* Effect.repeatN(Effect.yieldNow(), 50)
      for (let step = 0; step < 8; step++) yield* TestClock.adjust(Duration.millis(750))
      yield* Effect.repeatN(Effect.yieldNow(), 50)
      const badExit = yield* Fiber.poll(bad)
      assert.isTrue(Option.isSome(badExit), "the lease whose renewal said 'not held' was not lost")
      assert.isTrue(Option.isNone(yield* Fiber.poll(good)), "the healthy lease was lost")
      yield* Fiber.interrupt(good)
    }))
})

describe("awaitWakeUp", () => {
  /** A subscription fed by `wakeAll`, and how many callbacks are registered. */
  const fed = () => {
    const resumers = new Set<(resumed: Effect.Effect<void>) => void>()
    let pending = false
    const subscription = subscriptionOf((wake) => {
      if (pending) {
        pending = false
        wake(Effect.void)
        return () => undefined
      }
      resumers.add(wake)
      return () => void resumers.delete(wake)
    })
    const wakeAll = () => {
      if (resumers.size === 0) pending = true
      for (const wake of [...resumers]) wake(Effect.void)
      resumers.clear()
    }
    return { subscription, wakeAll, registered: () => resumers.size }
  }

  it.live("on a clock that is not this copy of effect's live clock, no sleep is left pending once the last hold is gone", () =>
    Effect.gen(function*() {
      // a live clock of another copy of effect (an application whose packages each have their
      // own), or any clock the keeper cannot unref the timer of: it counts the sleeps pending
      let pending = 0
      const live = yield* Effect.clock
      const foreign: Clock.Clock = {
        ...live,
        [Clock.ClockTypeId]: Clock.ClockTypeId,
        unsafeCurrentTimeMillis: () => live.unsafeCurrentTimeMillis(),
        unsafeCurrentTimeNanos: () => live.unsafeCurrentTimeNanos(),
        currentTimeMillis: live.currentTimeMillis,
        currentTimeNanos: live.currentTimeNanos,
        sleep: (duration) =>
          Effect.suspend(() => {
            pending++
            return Effect.ensuring(live.sleep(duration), Effect.sync(() => pending--))
          })
      }
      const backend = yield* MemoryBackend.make
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make("foreign-clock", { watchdog: "9 seconds" })
        // held a while, so that the keeper's loop goes to sleep until the next renewal
        const hold = Effect.scoped(Effect.zipRight(Lock.acquire(lock), Effect.sleep("30 millis").pipe(Effect.withClock(live))))
        yield* hold
        yield* hold
        // the keeper's sleep until the next renewal (3 s away) would keep the process alive
        yield* Effect.sleep("20 millis").pipe(Effect.withClock(live))
        assert.strictEqual(pending, 0, "sleeps left pending with no hold")
        const lease = yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence))
        assert.isAbove(lease, 0, "a hold taken again is kept as before")
      }).pipe(Effect.provideService(LockBackend, backend), Effect.withClock(foreign))
    }))

  it.live("on the live clock: a wake-up ends the wait at once, and one that came first is taken at once", () =>
    Effect.gen(function*() {
      const { registered, subscription, wakeAll } = fed()
      const started = Date.now()
      const waiting = yield* Effect.fork(awaitWakeUp(subscription, 60_000))
      yield* Effect.sleep(20)
      assert.strictEqual(registered(), 1)
      wakeAll()
      yield* Fiber.join(waiting)
      assert.isBelow(Date.now() - started, 5_000)
      // a wake-up that came first is taken at once
      wakeAll()
      yield* awaitWakeUp(subscription, 60_000)
      assert.strictEqual(registered(), 0)
    }))

  it.live("on the live clock: the bound ends the wait and unregisters it; so does an interruption", () =>
    Effect.gen(function*() {
      const { registered, subscription } = fed()
      const started = Date.now()
      yield* awaitWakeUp(subscription, 50, 60_000)
      assert.isAtLeast(Date.now() - started, 45)
      assert.strictEqual(registered(), 0)
      const waiting = yield* Effect.fork(awaitWakeUp(subscription, 60_000))
      yield* Effect.sleep(20)
      assert.strictEqual(registered(), 1)
      yield* Fiber.interrupt(waiting)
      assert.strictEqual(registered(), 0)
    }))

  it.scopedLive("on the live clock: a wake-up clears the bound's timer", () =>
    Effect.gen(function*() {
      const { subscription, wakeAll } = fed()
      const setSpy = vi.spyOn(globalThis, "setTimeout")
      const clearSpy = vi.spyOn(globalThis, "clearTimeout")
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          setSpy.mockRestore()
          clearSpy.mockRestore()
        })
      )
      const waiting = yield* Effect.fork(awaitWakeUp(subscription, 60_000))
      yield* Effect.sleep(20)
      const bound = setSpy.mock.calls.flatMap((call, i) => (call[1] === 60_000 ? [setSpy.mock.results[i]?.value] : []))
      assert.strictEqual(bound.length, 1, "one timer for the bound")
      wakeAll()
      yield* Fiber.join(waiting)
      assert.isTrue(clearSpy.mock.calls.some((call) => call[0] === bound[0]), "the bound's timer was left running after the wake-up")
    }))

  it.live("an uninterruptible wait still ends at a wake-up, and only then", () =>
    Effect.gen(function*() {
      const { registered, subscription, wakeAll } = fed()
      const waiting = yield* Effect.fork(Effect.uninterruptible(awaitWakeUp(subscription, 60_000)))
      yield* Effect.sleep(20)
      yield* Fiber.interruptFork(waiting)
      yield* Effect.sleep(20)
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiting)), "an uninterruptible wait was cut short")
      assert.strictEqual(registered(), 1)
      wakeAll()
      yield* Fiber.await(waiting)
      assert.strictEqual(registered(), 0)
    }))

  it.effect("on a TestClock the bound is the TestClock's", () =>
    Effect.gen(function*() {
      const { subscription } = fed()
      const waiting = yield* Effect.fork(awaitWakeUp(subscription, 1_000))
      yield* TestClock.adjust("999 millis")
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiting)))
      yield* TestClock.adjust("1 millis")
      yield* Fiber.join(waiting)
    }))
})
