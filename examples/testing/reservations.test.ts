/**
 * Unit tests of reservations.ts on the memory backend, whose leases expire by Effect's `Clock`:
 * under `it.effect` / `it.scoped` that is the `TestClock`, so `TestClock.adjust` runs a 10-minute
 * lease out at once, and nothing waits in real time.
 *
 *   npx vitest run --root examples/testing
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Option, TestClock } from "effect"
import { MemoryBackend } from "@lockstep/memory"
import { isReserved, payForSeat, reserve } from "./reservations.js"

describe("seat reservations", () => {
  it.scoped("a reservation runs out after 10 minutes", () =>
    Effect.gen(function*() {
      const lease = yield* reserve("A1")
      assert.isTrue(Option.isSome(lease))
      yield* TestClock.adjust("9 minutes")
      assert.isTrue(yield* isReserved("A1"))
      yield* TestClock.adjust("61 seconds")
      assert.isFalse(yield* isReserved("A1"))
      assert.strictEqual(yield* Option.getOrThrow(lease).state, "Lost")
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.scoped("a second checkout of a held seat gets nothing", () =>
    Effect.gen(function*() {
      yield* reserve("A2")
      // another fiber: a fiber that holds a lock would re-enter it
      const other = yield* Effect.fork(Effect.scoped(reserve("A2")))
      assert.isTrue(Option.isNone(yield* Fiber.join(other)))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.scoped("a payment waits for the seat no longer than its timeout", () =>
    Effect.gen(function*() {
      yield* reserve("B1")
      const payment = yield* Effect.fork(payForSeat("B1", Effect.succeed("paid"), "30 seconds"))
      yield* TestClock.adjust("30 seconds")
      const error = yield* Effect.flip(Fiber.join(payment))
      assert.strictEqual(error._tag, "LockTimeout")
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.scoped("a waiting payment gets the seat when the reservation runs out", () =>
    Effect.gen(function*() {
      yield* reserve("B2")
      const payment = yield* Effect.fork(payForSeat("B2", Effect.succeed("paid"), "15 minutes"))
      yield* TestClock.adjust("10 minutes")
      assert.strictEqual(yield* Fiber.join(payment), "paid")
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.scoped("a payment that outlasts the lease is interrupted with LockLost", () =>
    Effect.gen(function*() {
      const payment = yield* Effect.fork(payForSeat("C1", Effect.sleep("11 minutes"), "1 second"))
      yield* TestClock.adjust("10 minutes")
      const error = yield* Effect.flip(Fiber.join(payment))
      assert.strictEqual(error._tag, "LockLost")
      assert.isFalse(yield* isReserved("C1"))
    }).pipe(Effect.provide(MemoryBackend.layer)))
})
