import { assert } from "@effect/vitest"
import { Duration, Effect, Fiber, Option } from "effect"
import * as CountDownLatch from "@lockstep/core/CountDownLatch"
import * as Lock from "@lockstep/core/Lock"
import { LockBackend } from "@lockstep/core/LockBackend"
import * as FaultyBackend from "../FaultyBackend.js"
import type { Kit } from "./conformanceKit.js"
import { range } from "./conformanceKit.js"

/** The CountDownLatch scenarios. */
export const register = (kit: Kit): void => {
  const { advance, everyKind, freshKey, handOff, hold, promptly, settle, shortMs, waiterTimeout, withBackend } = kit

  everyKind("CountDownLatch: set only at 0, counted down to 0 (never below), every waiter woken at once", () =>
    withBackend(Effect.gen(function*() {
      const latch = yield* CountDownLatch.make(yield* freshKey("latch"))
      assert.strictEqual(yield* CountDownLatch.count(latch), 0)
      // at 0, await returns at once
      yield* CountDownLatch.await(latch).pipe(promptly)
      assert.isTrue(yield* CountDownLatch.trySetCount(latch, 3))
      assert.isFalse(yield* CountDownLatch.trySetCount(latch, 5), "set while a count was set")
      assert.strictEqual(yield* CountDownLatch.count(latch), 3)
      const waiters = yield* Effect.forEach(range(5), () => Effect.fork(CountDownLatch.await(latch)))
      yield* settle
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 2)
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 1)
      yield* settle
      for (const waiter of waiters) assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "woken before 0")
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
      // the waiters' recheck is 5 s: only the wake-up ends this in time
      yield* Fiber.joinAll(waiters).pipe(promptly)
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0, "counted below 0")
      assert.strictEqual(yield* CountDownLatch.count(latch), 0)
      assert.isTrue(yield* CountDownLatch.trySetCount(latch, 1), "not settable again at 0")
      yield* CountDownLatch.countDown(latch)
    })))

  everyKind("hand-off: a latch waiter is let in by the countDown that reaches 0, not by its recheck", () =>
    handOff("CountDownLatch", Effect.gen(function*() {
      const latch = yield* CountDownLatch.make(yield* freshKey("hand-off-latch"), { recheck: waiterTimeout })
      return {
        // held while the count is above 0: the countDown to 0 is the release
        hold: (body) =>
          Effect.gen(function*() {
            assert.isTrue(yield* CountDownLatch.trySetCount(latch, 1))
            yield* body
            assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
          }),
        wait: (body) => Effect.zipRight(CountDownLatch.await(latch), body)
      }
    })), 60_000)

  everyKind("CountDownLatch: a call delivered twice counts once", () =>
    withBackend(Effect.gen(function*() {
      const backend = yield* LockBackend
      const key = yield* freshKey("latch-twice")
      const set = { key, id: crypto.randomUUID(), count: 2 }
      assert.isTrue(yield* backend.latchSetCount(set))
      // its copy answers as the first delivery did, and changes nothing
      assert.isTrue(yield* backend.latchSetCount(set))
      const down = { key, id: crypto.randomUUID() }
      assert.strictEqual(yield* backend.latchCountDown(down), 1)
      assert.strictEqual(yield* backend.latchCountDown(down), 1, "a copy counted down again")
      assert.strictEqual(yield* backend.latchCount(key), 1)
      assert.strictEqual(yield* backend.latchCountDown({ key, id: crypto.randomUUID() }), 0)
      // a late copy of the first set does not set the count again
      assert.isTrue(yield* backend.latchSetCount(set))
      assert.strictEqual(yield* backend.latchCount(key), 0)
    })))

  everyKind("CountDownLatch: a change whose reply is lost is tried again under its id: it counts once", () =>
    withBackend(Effect.gen(function*() {
      const backend = yield* LockBackend
      const key = yield* freshKey("latch-lost-reply")
      // the first call of each kind is carried out and its reply lost; the retry is a copy
      const lossy = FaultyBackend.failing({
        operation: ["latchSetCount", "latchCountDown"],
        when: (n) => n === 1,
        timing: "after"
      })(backend)
      const latch = yield* Effect.provideService(CountDownLatch.make(key), LockBackend, lossy)
      assert.isTrue(yield* CountDownLatch.trySetCount(latch, 3))
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 2)
      // every reply lost: the caller sees BackendError, and the count went down by exactly one
      const deaf = FaultyBackend.failing({ operation: "latchCountDown", when: 1, timing: "after" })(backend)
      const deafLatch = yield* Effect.provideService(CountDownLatch.make(key), LockBackend, deaf)
      const error = yield* Effect.flip(CountDownLatch.countDown(deafLatch))
      assert.strictEqual(error._tag, "BackendError")
      assert.strictEqual(yield* CountDownLatch.count(latch), 1)
      yield* CountDownLatch.countDown(latch)
    })))

  everyKind("CountDownLatch: a timeout fails with LockTimeout, an interrupted waiter leaves, bad input is refused", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("latch-timeout")
      const latch = yield* CountDownLatch.make(key)
      yield* CountDownLatch.trySetCount(latch, 1)
      const timedOut = yield* Effect.fork(Effect.flip(CountDownLatch.await(latch, { timeout: Duration.millis(shortMs) })))
      const interrupted = yield* Effect.fork(CountDownLatch.await(latch))
      yield* settle
      yield* advance(shortMs)
      const error = yield* Fiber.join(timedOut)
      assert.strictEqual(error._tag, "LockTimeout")
      yield* Fiber.interrupt(interrupted)
      assert.strictEqual(yield* CountDownLatch.count(latch), 1)
      for (const bad of [-1, 0, 1.5, Infinity, Number.NaN]) {
        const refused = yield* Effect.flip(CountDownLatch.trySetCount(latch, bad))
        assert.isTrue(refused._tag === "InvalidLockOptions" && refused.field === "count", `count ${bad} not refused`)
      }
      assert.strictEqual(yield* CountDownLatch.countDown(latch), 0)
      // a key a lock holds is not a latch
      const lock = yield* Lock.make(yield* freshKey("latch-lock"))
      const holder = yield* hold(Lock.acquire(lock))
      const onLock = yield* CountDownLatch.make(lock.key)
      const calls = [
        Effect.asVoid(CountDownLatch.trySetCount(onLock, 1)),
        Effect.asVoid(CountDownLatch.countDown(onLock)),
        Effect.asVoid(CountDownLatch.count(onLock))
      ]
      for (const call of calls) {
        const refused = yield* Effect.flip(call)
        assert.isTrue(refused._tag === "InvalidLockOptions" && refused.field === "key", String(refused))
      }
      yield* holder.release
      assert.isFalse(yield* Lock.isLocked(lock))
    })))
}
