import { assert } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Layer, Option } from "effect"
import * as Lock from "@lockstep/core/Lock"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { Kit } from "./conformanceKit.js"
import { failureOf, range } from "./conformanceKit.js"

// Leases: a fixed lease expires, the watchdog renews, and a lost lease interrupts its body and
// is reported to whoever holds it.

export const fixedLeaseExpires = ({ test, advance, shortMs, short, promptly, freshKey, hold, withBackend }: Kit): void =>
  test("a fixed lease expires; lost fails with LockLost(DeadlinePassed)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("lease"), { lease: short })
      const first = yield* hold(Lock.acquire(lock))
      const lost = yield* Effect.fork(Effect.flip(first.lease.lost))
      // a lease whose lost nobody asks for until after the loss
      const other = yield* hold(Lock.acquire(yield* Lock.make(yield* freshKey("lease-unasked"), { lease: short })))
      assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(lock))))
      yield* advance(shortMs)
      const error = yield* Fiber.join(lost)
      assert.strictEqual(error._tag, "LockLost")
      assert.strictEqual(error.reason, "DeadlinePassed")
      const late = yield* Effect.flip(other.lease.lost).pipe(promptly)
      assert.strictEqual(late.reason, "DeadlinePassed")
      yield* other.release
      const next = yield* Effect.scoped(Lock.tryAcquire(lock))
      assert.isTrue(Option.isSome(next))
      yield* first.release
    })))

/**
 * The watchdog's lease on a live clock. It renews every third of it, so a stall of the loaded
 * machine (the client's event loop or the server) longer than two thirds of the lease rightly
 * loses it: the short lease of the other tests (0.9 s) leaves too thin a margin for that.
 */
const LIVE_WATCHDOG_MS = 2_000

export const watchdog = ({ test, advance, live, shortMs, freshKey, hold, withBackend }: Kit): void =>
  test("the watchdog keeps a lock alive across many lease periods", () =>
    withBackend(Effect.gen(function*() {
      const leaseMs = live ? LIVE_WATCHDOG_MS : shortMs
      const periods = live ? 4 : 10
      const lock = yield* Lock.make(yield* freshKey("watchdog"), { watchdog: Duration.millis(leaseMs) })
      const first = yield* hold(Lock.acquire(lock))
      const lost = yield* Effect.fork(Effect.flip(first.lease.lost))
      for (const _ of range(periods * 3)) {
        yield* advance(leaseMs / 3)
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(lock))), "lock taken while its watchdog runs")
      }
      assert.isTrue(Option.isNone(yield* Fiber.poll(lost)), "lease reported lost while renewed")
      yield* first.release
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

export const lossInterruptsBody = ({ test, settle, advance, shortMs, short, freshKey, withBackend }: Kit): void =>
  test("losing the lease interrupts the body with LockLost(NotHeld)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("lost"), { watchdog: short })
      const interrupted = yield* Deferred.make<void>()
      const body = Effect.never.pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
      const fiber = yield* Effect.fork(Lock.withLock(body, lock))
      yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
      assert.isTrue(yield* Lock.forceUnlock(lock))
      yield* advance(shortMs)
      const exit = yield* Fiber.await(fiber)
      const error = failureOf(exit)
      assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "NotHeld", String(exit))
      assert.isTrue(yield* Deferred.isDone(interrupted), "body was not interrupted")
    })))

export const deadlineInterruptsBody = ({ test, settle, advance, shortMs, short, freshKey, withBackend }: Kit): void =>
  test("a fixed lease running out interrupts the body with LockLost(DeadlinePassed)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("deadline"), { lease: short })
      const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
      yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
      yield* advance(shortMs)
      const error = failureOf(yield* Fiber.await(fiber))
      assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "DeadlinePassed")
    })))

export const timeLeft = ({ test, advance, freshKey, withBackend }: Kit): void =>
  test("a lease reports the time left and renewals extend it", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("expires"), { watchdog: "3 seconds" })
      yield* Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        const initial = Duration.toMillis(yield* lease.expiresIn)
        assert.isTrue(initial > 2_000 && initial <= 3_000, `expiresIn ${initial}`)
        const ttl = yield* Lock.remainingTtl(lock)
        assert.isTrue(Option.isSome(ttl) && Duration.toMillis(ttl.value) <= 3_000 && Duration.toMillis(ttl.value) > 2_000)
        yield* advance(2_500)
        // renewed at least once in between: the deadline moved on
        const later = Duration.toMillis(yield* lease.expiresIn)
        assert.isTrue(later > 1_000, `expiresIn after renewals ${later}`)
      }))
      assert.isTrue(Option.isNone(yield* Lock.remainingTtl(lock)))
    })))

export const lostHoldReentered = ({ test, freshKey, inspect, assertFree, withBackend }: Kit): void =>
  test("re-entering a hold that was lost starts afresh and reports the loss", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("stale")
      const lock = yield* Lock.make(key)
      // another holder, forked before this fiber holds anything
      const go = yield* Deferred.make<void>()
      const otherFence = yield* Effect.fork(
        Effect.zipRight(Deferred.await(go), Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
      )
      yield* Effect.scoped(Effect.gen(function*() {
        const outer = yield* Lock.acquire(lock)
        const outerLost = yield* Effect.fork(Effect.flip(outer.lost))
        assert.isTrue(yield* Lock.forceUnlock(lock))
        yield* Deferred.succeed(go, undefined)
        const fence = yield* Fiber.join(otherFence)
        assert.isAbove(fence, outer.fence)
        const inner = yield* Lock.acquire(lock)
        assert.notStrictEqual(inner.holder, outer.holder)
        assert.isAbove(inner.fence, fence)
        const error = yield* Fiber.join(outerLost)
        assert.strictEqual(error.reason, "NotHeld")
        const state = yield* inspect(key)
        assert.deepStrictEqual(state.holders.map((h) => [h.holder, h.exclusive]), [[inner.holder, 1]])
      }))
      yield* assertFree(key)
    })))

export const dyingRenewal = ({ harness, test, settle, advance, shortMs, short, freshKey }: Kit): void =>
  test("a renewal that dies does not stop the deadline: lost fails with DeadlinePassed", () =>
    Effect.gen(function*() {
      const dying = Layer.effect(
        LockBackend,
        Effect.map(LockBackend, (backend): Service => ({ ...backend, renew: () => Effect.dieMessage("renewal exploded") }))
      ).pipe(Layer.provide(harness.layer))
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(yield* freshKey("defect"), { watchdog: short })
        const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
        yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
        yield* advance(shortMs)
        const error = failureOf(yield* Fiber.await(fiber))
        assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "DeadlinePassed")
      }).pipe(Effect.provide(dying))
    }))
