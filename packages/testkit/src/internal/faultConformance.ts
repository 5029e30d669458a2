import { assert } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import * as Lock from "@lockstep/core/Lock"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import * as Semaphore from "@lockstep/core/Semaphore"
import * as FaultyBackend from "../FaultyBackend.js"
import type { Kit } from "./conformanceKit.js"
import { assertStrictlyIncreasing, everyOperation, onLayer } from "./conformanceKit.js"

// Faults: every operation may be delivered twice or late, a reply may be lost, a call may be
// slow enough for an interruption to land while it is in flight, and the backend may lose its
// data. A lock stays safe and leaves nothing held behind.

/** Whether a fiber other than the caller can take the lock right now (it releases at once). */
const othersCanTake = (lock: Lock.Lock) =>
  Effect.flatMap(Effect.fork(Effect.scoped(Effect.map(Lock.tryAcquire(lock), Option.isSome))), Fiber.join)

export const fairLostReply = ({ harness, everyKind, freshKey, inspect, assertFree, hold }: Kit): void =>
  everyKind("a fair attempt whose reply is lost leaves no queue entry behind", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("lost-reply")
      // the first attempt of the second acquirer is queued by the backend, but its reply is lost
      const lossy = FaultyBackend.failingLayer({ operation: "acquire", when: (n) => n === 2, timing: "after" })(harness.layer)
      yield* Effect.gen(function*() {
        const lock = yield* FairLock.make(key)
        const first = yield* hold(Lock.acquire(lock))
        const error = yield* Effect.flip(Effect.scoped(Lock.acquire(lock)))
        assert.strictEqual(error._tag, "BackendError")
        assert.deepStrictEqual((yield* inspect(key)).queue, [])
        yield* first.release
        yield* assertFree(key)
      }).pipe(Effect.provide(lossy))
    }))

export const releaseTwice = ({ harness, test, freshKey, assertFree }: Kit): void =>
  test("a release delivered twice takes one hold: the outer hold stays", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("release-twice")
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(lock)
          yield* Effect.scoped(Lock.acquire(lock))
          assert.strictEqual(yield* Lock.holdCount(lock), 1)
          assert.isFalse(yield* othersCanTake(lock), "another fiber took a lock whose outer hold is open")
        }))
        yield* assertFree(key)
      }).pipe(onLayer(FaultyBackend.duplicatingLayer({ operation: "release", when: 1 })(harness.layer)))
    }))

export const acquireTwice = ({ harness, everyKind, freshKey, assertFree }: Kit): void =>
  everyKind("an acquisition delivered twice takes one hold: nothing is left after the release", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("acquire-twice")
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(lock)
          yield* Lock.acquire(lock)
          assert.strictEqual(yield* Lock.holdCount(lock), 2)
        }))
        yield* assertFree(key)
        const sem = yield* Semaphore.make(`${key}-s`, { limit: 2 })
        yield* Effect.scoped(Semaphore.acquire(sem, { permits: 2 }))
        yield* assertFree(`${key}-s`)
      }).pipe(onLayer(FaultyBackend.duplicatingLayer({ operation: "acquire", when: 1 })(harness.layer)))
    }))

export const lateCopy = ({ harness, live, everyKind, settle, elapse, shortMs, freshKey, assertFree, hold }: Kit): void =>
  everyKind("a late copy of an acquisition, arriving after its holder released, grants nothing", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("late-copy")
      const late = FaultyBackend.duplicatingLayer({ operation: ["acquire", "cancel"], when: 1, copyAfter: shortMs })
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        yield* Effect.scoped(Lock.acquire(lock))
        const fair = yield* FairLock.make(`${key}-fair`)
        const first = yield* hold(Lock.acquire(fair))
        // a try-acquire queues, is denied, and leaves the queue; both copies arrive late
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(fair))))
        yield* first.release
        yield* elapse(shortMs * 2)
        yield* Effect.yieldNow()
        if (live) yield* settle
        yield* assertFree(key)
        yield* assertFree(`${key}-fair`)
      }).pipe(onLayer(late(harness.layer)))
    }))

export const lostGrant = ({ harness, test, freshKey, inspect, assertFree }: Kit): void =>
  test("an acquisition whose reply was lost leaves nothing held", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("lost-grant")
      const lossy = FaultyBackend.failingLayer({ operation: "acquire", when: (n) => n === 1 || n === 3, timing: "after" })
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        assert.strictEqual((yield* Effect.flip(Effect.scoped(Lock.acquire(lock))))._tag, "BackendError")
        yield* assertFree(key)
        // a re-entry whose reply is lost leaves the outer hold as it was
        yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(lock)
          assert.strictEqual((yield* Effect.flip(Lock.acquire(lock)))._tag, "BackendError")
          const [state] = (yield* inspect(key)).holders
          assert.strictEqual(state?.exclusive, 1)
        }))
        yield* assertFree(key)
      }).pipe(onLayer(lossy(harness.layer)))
    }))

export const inFlightInterruption = ({ harness, live, test, elapse, freshKey, assertFree, withBackend }: Kit): void =>
  test("an interruption while a grant is in flight releases it at once (Effect.timeout, Effect.race)", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("in-flight")
      const slowMs = live ? 300 : 200
      yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        // the caller's scope stays open: the grant must not be attached to it
        const timedOut = yield* Effect.fork(Lock.acquire(lock).pipe(Effect.timeout(slowMs / 4), Effect.option))
        yield* elapse(slowMs / 2)
        yield* elapse(slowMs)
        assert.isTrue(Option.isNone(yield* Fiber.join(timedOut)), "the acquisition should have timed out")
        const raced = yield* Effect.fork(Effect.race(Lock.acquire(lock), Effect.delay(Effect.succeed("other"), slowMs / 4)))
        yield* elapse(slowMs / 2)
        yield* elapse(slowMs)
        assert.strictEqual(yield* Fiber.join(raced), "other")
        yield* assertFree(key)
        // the same fiber takes the lock afresh
        const again = yield* Effect.fork(Lock.tryAcquire(lock))
        yield* elapse(slowMs)
        assert.isTrue(Option.isSome(yield* Fiber.join(again)))
      })).pipe(onLayer(FaultyBackend.slowLayer({ operation: "acquire", delay: slowMs })(harness.layer)))
      yield* assertFree(key).pipe(withBackend)
    }))

export const deadLease = ({ harness, live, test, settle, elapse, shortMs, short, promptly, freshKey, assertFree }: Kit): void =>
  test("a lease lost to its deadline is dead: no more renewals, released, and taken afresh", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("dead-lease")
      // every renewal is carried out, but its reply is lost
      const deaf = FaultyBackend.failingLayer({ operation: "renew", when: 1, timing: "after" })
      yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* Lock.make(key, { watchdog: short })
        const lease = yield* Lock.acquire(lock)
        const lost = yield* Effect.fork(Effect.flip(lease.lost))
        yield* elapse(shortMs * 2)
        const error = yield* Fiber.join(lost).pipe(promptly)
        assert.strictEqual(error.reason, "DeadlinePassed")
        if (live) yield* settle
        // the scope is still open, yet the key is free and stays free
        yield* assertFree(key)
        yield* elapse(shortMs * 2)
        yield* assertFree(key)
        // the same fiber takes it as a new holder
        const fresh = yield* Lock.tryAcquire(lock)
        assert.isTrue(Option.isSome(fresh))
        assert.notStrictEqual(Option.getOrThrow(fresh).holder, lease.holder)
      })).pipe(onLayer(deaf(harness.layer)))
    }))

export const dataLoss = ({ harness, everyKind, elapse, promptly, freshKey, hold }: Kit): void =>
  everyKind("after the backend lost its data, fences still go up and a re-entry into the lost hold is detected", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("data-loss")
      yield* Effect.scoped(Effect.gen(function*() {
        const control = yield* FaultyBackend.DataLoss
        const lock = yield* Lock.make(key)
        const before = yield* Lock.acquire(lock)
        yield* control.wipe
        // a restarted server's clock has moved on
        yield* elapse(1)
        const other = yield* hold(Lock.acquire(lock))
        assert.isAbove(other.lease.fence, before.fence)
        yield* other.release
        // re-entering the hold the backend forgot starts afresh and reports the loss
        const lost = yield* Effect.fork(Effect.flip(before.lost))
        const again = yield* Lock.acquire(lock)
        assert.notStrictEqual(again.holder, before.holder)
        assert.isAbove(again.fence, other.lease.fence)
        assert.strictEqual((yield* Fiber.join(lost).pipe(promptly)).reason, "NotHeld")
        // so is a writer taking the read lock of a key the backend forgot
        const rw = yield* ReadWriteLock.make(`${key}-rw`)
        const writer = yield* Lock.acquire(rw.write)
        yield* control.wipe
        yield* elapse(1)
        const writerLost = yield* Effect.fork(Effect.flip(writer.lost))
        const reader = yield* Lock.acquire(rw.read)
        assert.notStrictEqual(reader.holder, writer.holder)
        assert.isAbove(reader.fence, writer.fence)
        assert.strictEqual((yield* Fiber.join(writerLost).pipe(promptly)).reason, "NotHeld")
      })).pipe(onLayer(harness.dataLoss ?? FaultyBackend.losingData(harness.layer)))
    }))

export const faultyContention = ({ harness, everyKind, freshKey, assertFree, withHistory, contend }: Kit): void =>
  everyKind("contention under at-least-once delivery: history checked, nothing left held", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("faulty-contend")
      const faulty = FaultyBackend.duplicatingLayer({ operation: everyOperation, when: 0.5 })(harness.layer)
      yield* withHistory(Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        const fair = yield* FairLock.make(`${key}-fair`)
        const plain = yield* contend(30, 1, () => Lock.acquire(lock))
        const fifo = yield* contend(30, 1, () => Lock.acquire(fair))
        assert.strictEqual(plain.maxHolders, 1)
        assert.strictEqual(fifo.maxHolders, 1)
        assertStrictlyIncreasing(plain.fences)
        assertStrictlyIncreasing(fifo.fences)
        yield* assertFree(key)
        yield* assertFree(`${key}-fair`)
      }), faulty)
      // shared holders overlap, so the order their (re-sent) grants are seen in says nothing
      // about fences: permits are checked by occupancy instead
      yield* Effect.gen(function*() {
        const sem = yield* Semaphore.make(`${key}-sem`, { limit: 3 })
        const shared = yield* contend(30, 3, () => Semaphore.acquire(sem, { permits: 1 }))
        assert.isAtMost(shared.maxPermits, 3)
        yield* assertFree(`${key}-sem`)
      }).pipe(onLayer(faulty))
    }), 120_000)

export const lossyContention = ({ harness, test, freshKey, assertFree, withHistory, contend }: Kit): void =>
  test("60 fibers while replies are lost: failed attempts leave nothing held, the history stays clean", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("lossy-contend")
      // one acquisition and one release in five is carried out, but its reply is lost
      const lossy = FaultyBackend.failingLayer({ operation: ["acquire", "release"], when: (n) => n % 5 === 0, timing: "after" })
      yield* withHistory(Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        const retrying = Lock.acquire(lock).pipe(Effect.retry({ while: (e) => e._tag === "BackendError" }))
        const result = yield* contend(60, 1, () => retrying)
        assert.strictEqual(result.maxHolders, 1)
        yield* assertFree(key)
      }), lossy(harness.layer))
    }), 120_000)
