import { assert } from "@effect/vitest"
import { Effect, Fiber } from "effect"
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

export const freedCapacity = ({ everyKind, settle, promptly, freshKey, hold, withBackend }: Kit): void =>
  everyKind("freed capacity reaches every shared waiter that fits, not only the first one woken", () =>
    withBackend(Effect.gen(function*() {
      // semaphore: a 3-permit waiter queued before a 1-permit waiter; one permit frees up
      const sem = yield* Semaphore.make(yield* freshKey("capacity"), { limit: 3 })
      const one = yield* hold(Semaphore.acquire(sem, { permits: 1 }))
      const two = yield* hold(Semaphore.acquire(sem, { permits: 2 }))
      const big = yield* Effect.fork(Effect.scoped(Semaphore.acquire(sem, { permits: 3 })))
      yield* settle
      const small = yield* Effect.fork(Effect.scoped(Semaphore.acquire(sem, { permits: 1 })))
      yield* settle
      yield* one.release
      // the holders' leases are 30 s: only a wake-up can end this wait in time
      yield* Fiber.join(small).pipe(promptly)
      yield* two.release
      yield* Fiber.join(big).pipe(promptly)
      // read-write: a writer holds; R1, W2, R3 wait; both readers enter when the writer leaves
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
      const reader3 = yield* Fiber.join(r3).pipe(promptly)
      yield* reader1.release
      yield* reader3.release
      yield* Fiber.join(w2).pipe(promptly)
    })))
