/**
 * A jump of the memory backend's clock. The backend judges leases on Effect's `Clock`: the live one
 * is monotonic (a step of the system clock does not move it), so a jump happens only where the
 * program's Clock jumps — here a `TestClock`, which the lock's own deadlines follow too. Each test
 * prints what it measured; the README's "Clocks" paragraph quotes it.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Fiber, Option, Scope, TestClock } from "effect"
import type { Lease } from "@lockstep/core/Lease"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { LockLost } from "@lockstep/core/LockError"
import { MemoryBackend } from "@lockstep/memory"

/** 2026-01-01T00:00:00Z: fences then read as the clock's microseconds, as in production. */
const T0 = Date.UTC(2026, 0, 1)

/** `lease.lost` in a fiber of its own: the LockLost, and the clock's time when it came. */
const watchLoss = (lease: Lease) =>
  Effect.fork(Effect.flip(lease.lost).pipe(Effect.zip(Clock.currentTimeMillis)))

/**
 * One attempt of another holder (a fiber of its own is another holder), in a scope that stays open
 * until `scope` closes: `Some(lease)` held from then on, or `None`.
 */
const tryAsOther = (lock: Lock.Lock, scope: Scope.Scope): Effect.Effect<Option.Option<Lease>, unknown> =>
  Effect.fork(Scope.extend(Lock.tryAcquire(lock), scope)).pipe(Effect.flatMap(Fiber.join))

/** A fiber's exit without waiting: `None` while it runs. */
const poll = <A, E>(fiber: Fiber.Fiber<A, E>) => Fiber.poll(fiber)

/** The live holds of `key`, as the backend sees them now (ttl on its clock). */
const holdsOf = (key: string) => Effect.flatMap(LockBackend, (backend) => backend.inspect(key))

/**
 * A test on a backend of its own: the body's scope (its leases) closes before the backend does.
 * On the TestClock of `it.effect`.
 */
const test = <A, E>(name: string, body: Effect.Effect<A, E, LockBackend | Scope.Scope>) =>
  it.effect(name, () => Effect.provide(Effect.scoped(body), MemoryBackend.layer))

describe("memory backend: a jump of the clock", () => {
  test("forward 60 s: a fixed lease is over at once, another fiber is granted with a fence from the jumped clock",
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const lock = yield* Lock.make("clock:forward", { lease: "10 seconds" })
      const lease = yield* Lock.acquire(lock)
      const lost = yield* watchLoss(lease)
      const other = yield* Scope.make()
      assert.isTrue(Option.isNone(yield* tryAsOther(lock, other)), "held before the jump")

      yield* TestClock.adjust("60 seconds")
      const [error, lostAt]: readonly [LockLost, number] = yield* Fiber.join(lost)
      const taken = yield* tryAsOther(lock, other)
      assert.isTrue(Option.isSome(taken), "granted after the jump")
      const fenceB = Option.getOrThrow(taken).fence
      console.log(
        `[memory clock +60 s] A's fixed 10 s lease (fence ${lease.fence}) lost with ${error.reason} at +${lostAt - T0} ms; ` +
          `B granted at +60000 ms with fence ${fenceB} (+${fenceB - lease.fence})`
      )
      // the TestClock runs every timer due on the way (a fast-forward): A's own deadline, a
      // lease less its drift allowance (1% + 5 ms), fired at its time, before B's attempt
      assert.strictEqual(error._tag, "LockLost")
      assert.strictEqual(error.reason, "DeadlinePassed")
      assert.strictEqual(lostAt - T0, 10_000 - 105)
      // the fence is the jumped clock's microseconds: above A's, by the jump
      assert.strictEqual(lease.fence, T0 * 1000)
      assert.strictEqual(fenceB, (T0 + 60_000) * 1000)

      // the clock stepped back to where it should be (NTP correcting the jump): the key still
      // remembers B's fence, until the clock has passed it again, so the next one is greater
      yield* Scope.close(other, Exit.void)
      yield* TestClock.setTime(T0 + 11_000)
      const state = yield* holdsOf("clock:forward")
      assert.strictEqual(state.fence, fenceB, "remembered after the step back")
      const again = yield* tryAsOther(lock, yield* Effect.scope)
      const fenceC = Option.getOrThrow(again).fence
      console.log(`[memory clock +60 s] after the step back to +11000 ms, C granted with fence ${fenceC} (B's + ${fenceC - fenceB})`)
      assert.strictEqual(fenceC, fenceB + 1)
    })
  )

  test("forward 60 s under a watchdog: the TestClock runs every renewal on the way, and the lease is kept",
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const lock = yield* Lock.make("clock:watchdog", { watchdog: "3 seconds" })
      const lease = yield* Lock.acquire(lock)
      const lost = yield* watchLoss(lease)
      yield* TestClock.adjust("60 seconds")
      const other = yield* Scope.make()
      const taken = yield* tryAsOther(lock, other)
      const state = yield* holdsOf("clock:watchdog")
      const ttl = state.holders[0]?.ttlMs
      console.log(`[memory clock +60 s, watchdog 3 s] B refused: ${Option.isNone(taken)}; A's lease has ${Math.round(ttl ?? 0)} ms left; A not lost: ${Option.isNone(yield* poll(lost))}`)
      // a TestClock cannot step past a timer: what a real jump would take (a renewal due before
      // it never sent) is here renewed on time, every watchdog/3
      assert.isTrue(Option.isNone(taken))
      assert.isTrue(Option.isNone(yield* poll(lost)))
      assert.isAbove(ttl ?? 0, 0)
      yield* Scope.close(other, Exit.void)
    })
  )

  test("backward 60 s: a held lease lasts 60 s longer on both sides, and a fence remembered is still exceeded",
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const lock = yield* Lock.make("clock:backward", { lease: "10 seconds" })
      const lease = yield* Lock.acquire(lock)
      const lost = yield* watchLoss(lease)
      const fenced = yield* Lock.make("clock:backward-fence", { lease: "10 seconds" })
      const held = yield* Scope.make()
      const fenceA = (yield* Scope.extend(Lock.acquire(fenced), held)).fence

      // setTime to an earlier instant moves the clock back; pending sleeps keep their instants
      yield* TestClock.setTime(T0 - 60_000)
      assert.strictEqual(yield* Clock.currentTimeMillis, T0 - 60_000, "the TestClock went back")
      const ttl = (yield* holdsOf("clock:backward")).holders[0]?.ttlMs
      const other = yield* Scope.make()
      assert.isTrue(Option.isNone(yield* tryAsOther(lock, other)), "refused after the step back")

      // released while the clock is behind: the key remembers its fence, the next is above it
      yield* Scope.close(held, Exit.void)
      const fenceB = Option.getOrThrow(yield* tryAsOther(fenced, other)).fence
      console.log(`[memory clock -60 s] a key released after the step: B granted with fence ${fenceB} (A's ${fenceA} + ${fenceB - fenceA})`)
      assert.strictEqual(fenceA, T0 * 1000)
      assert.strictEqual(fenceB, fenceA + 1)

      // 65 s after the step: the 10 s lease has run 65 s, and still holds
      yield* TestClock.adjust("65 seconds")
      const stillHeld = Option.isNone(yield* tryAsOther(lock, other))
      const notLostYet = Option.isNone(yield* poll(lost))
      yield* TestClock.adjust("5 seconds")
      const [error, lostAt] = yield* Fiber.join(lost)
      console.log(
        `[memory clock -60 s] A's fixed 10 s lease had ${ttl} ms left after the step back; still held 65 s later: ${stillHeld}; ` +
          `lost with ${error.reason} ${lostAt - (T0 - 60_000)} ms after the step`
      )
      assert.strictEqual(ttl, 70_000)
      assert.isTrue(stillHeld)
      assert.isTrue(notLostYet)
      assert.strictEqual(error.reason, "DeadlinePassed")
      // A's deadline is an instant of the clock it was set on: it comes 60 s later too
      assert.strictEqual(lostAt - (T0 - 60_000), 60_000 + 10_000 - 105)
      yield* Scope.close(other, Exit.void)
    })
  )

  test("backward 60 s on a key the backend has forgotten: the fence goes back (the documented assumption)",
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const lock = yield* Lock.make("clock:forgotten", { lease: "1 second" })
      const fenceA = (yield* Effect.scoped(Lock.acquire(lock))).fence
      // 2 s later nothing of the key is needed any more: the backend forgets it
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual((yield* holdsOf("clock:forgotten")).fence, 0, "forgotten")

      yield* TestClock.setTime(T0 + 2_000 - 60_000)
      const fenceB = (yield* Effect.scoped(Lock.acquire(lock))).fence
      console.log(
        `[memory clock -60 s] a key forgotten before the step: B's fence ${fenceB} is below A's ${fenceA} by ${fenceA - fenceB} µs`
      )
      // a fence is never below the clock in microseconds, and nothing else: a clock that steps
      // back issues lower fences on keys it no longer remembers
      assert.strictEqual(fenceB, (T0 - 58_000) * 1000)
      assert.isBelow(fenceB, fenceA)
    })
  )
})
