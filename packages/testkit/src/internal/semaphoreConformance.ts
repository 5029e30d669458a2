import { assert } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import * as Lock from "@lockstep/core/Lock"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import * as Semaphore from "@lockstep/core/Semaphore"
import type { Kit } from "./conformanceKit.js"

// Semaphore: permits never above the limit, and freed capacity reaches every shared waiter
// that fits (the read-write lock's readers too).

export const waiterHandOff = ({ everyKind, freshKey, waiterTimeout, handOff }: Kit): void =>
  everyKind("hand-off: a Semaphore waiter for permits is let in when they are released", () =>
    handOff("Semaphore", Effect.gen(function*() {
      const sem = yield* Semaphore.make(yield* freshKey("hand-off-sem"), { limit: 3, waiterTimeout })
      // two of three permits held: a waiter for two fits only once they are back
      const take = (body: Effect.Effect<void>) => Semaphore.withPermits(body, sem, { permits: 2 })
      return { hold: take, wait: take }
    })), 60_000)

export const permitLimit = ({ everyKind, freshKey, withHistory, contend }: Kit): void =>
  everyKind("Semaphore: permits never above the limit", () =>
    withHistory(Effect.gen(function*() {
      const sem = yield* Semaphore.make(yield* freshKey("sem"), { limit: 3 })
      const seen = yield* contend(30, 3, (i) => Semaphore.acquire(sem, { permits: 1 + (i % 3) }))
      assert.isAbove(seen.maxHolders, 1, "permits were never shared")
      assert.strictEqual(yield* Semaphore.available(sem), 3)
    })))

export const limitMismatch = ({ everyKind, freshKey, assertFree, withBackend }: Kit): void =>
  everyKind("a semaphore with another limit on a held key fails with InvalidLockOptions(limit)", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("limit")
      const three = yield* Semaphore.make(key, { limit: 3 })
      const five = yield* Semaphore.make(key, { limit: 5 })
      const error = yield* Effect.scoped(Effect.gen(function*() {
        yield* Semaphore.acquire(three)
        return yield* Effect.flip(Semaphore.acquire(five))
      }))
      assert.isTrue(error._tag === "InvalidLockOptions" && error.field === "limit", error.message)
      yield* assertFree(key)
    })))

/**
 * A semaphore's 3-permit waiter queued before a 1-permit waiter when one permit frees up; a
 * read-write lock's readers R1 and R3 with a writer W2 between them when the writer holding it
 * leaves. Freed capacity reaches every waiter it fits (`order: "fit"`), or the waiters in the order
 * they queued, one that does not fit keeping those behind it out (`order: "fifo"`).
 */
export const freedCapacity = ({ everyKind, harness, settle, promptly, freshKey, hold, withBackend }: Kit): void => {
  const fifo = harness.order === "fifo"
  /** Still waiting, as a backend that lets waiters in in order keeps it. */
  const stillWaiting = (fiber: Fiber.Fiber<unknown, unknown>, what: string) =>
    Effect.flatMap(Fiber.poll(fiber), (exit) => Effect.sync(() => assert.isTrue(Option.isNone(exit), what)))
  everyKind(
    fifo
      ? "freed capacity reaches the waiters in the order they queued, each as soon as it fits"
      : "freed capacity reaches every shared waiter that fits, not only the first one woken",
    () =>
      withBackend(Effect.gen(function*() {
        const sem = yield* Semaphore.make(yield* freshKey("capacity"), { limit: 3 })
        const one = yield* hold(Semaphore.acquire(sem, { permits: 1 }))
        const two = yield* hold(Semaphore.acquire(sem, { permits: 2 }))
        const big = yield* Effect.fork(Effect.scoped(Semaphore.acquire(sem, { permits: 3 })))
        yield* settle
        const small = yield* Effect.fork(Effect.scoped(Semaphore.acquire(sem, { permits: 1 })))
        yield* settle
        yield* one.release
        // the holders' leases are 30 s: only wake-ups can end these waits in time
        if (fifo) yield* Effect.zipRight(settle, stillWaiting(small, "a waiter was let in past an earlier one"))
        else yield* Fiber.join(small).pipe(promptly)
        yield* two.release
        yield* Fiber.join(big).pipe(promptly)
        if (fifo) yield* Fiber.join(small).pipe(promptly)
        const rw = yield* ReadWriteLock.make(yield* freshKey("readers"))
        const writer = yield* hold(Lock.acquire(rw.write))
        const r1 = yield* hold(Lock.acquire(rw.read)).pipe(Effect.fork)
        yield* settle
        const w2 = yield* Effect.fork(Effect.scoped(Lock.acquire(rw.write)))
        yield* settle
        const r3 = yield* hold(Lock.acquire(rw.read)).pipe(Effect.fork)
        yield* settle
        yield* writer.release
        const reader1 = yield* Fiber.join(r1).pipe(promptly)
        if (fifo) {
          // R3 waits behind the waiting writer, which enters once R1 leaves
          yield* Effect.zipRight(settle, stillWaiting(r3, "a reader was let in past a waiting writer"))
          yield* reader1.release
          yield* Fiber.join(w2).pipe(promptly)
          yield* Effect.flatMap(Fiber.join(r3).pipe(promptly), (reader3) => reader3.release)
        } else {
          // both readers enter when the writer leaves
          const reader3 = yield* Fiber.join(r3).pipe(promptly)
          yield* reader1.release
          yield* reader3.release
          yield* Fiber.join(w2).pipe(promptly)
        }
      }))
  )
}
