import { assert } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Option, Scope } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import * as Lock from "@lockstep/core/Lock"
import * as MultiLock from "@lockstep/core/MultiLock"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import type { Kit } from "./conformanceKit.js"
import { failureOf, range } from "./conformanceKit.js"

/** The multi-lock scenarios, over parts that all live on the suite's backend. */
export const register = (kit: Kit): void => {
  waiting(kit)
  endings(kit)
}

/** Three fresh keys and a lock on each. */
const threeLocks = (kit: Kit, label: string) =>
  Effect.gen(function*() {
    const keys = [yield* kit.freshKey(`${label}-a`), yield* kit.freshKey(`${label}-b`), yield* kit.freshKey(`${label}-c`)]
    return { keys, locks: yield* Effect.forEach(keys, (key) => Lock.make(key)) }
  })

/** How a multi-lock waits for its parts: the bound, hand-offs, overlapping sets. */
const waiting = (kit: Kit): void => {
  const { advance, assertFree, everyKind, freshKey, handOff, hold, promptly, settle, waiterTimeout, withBackend } = kit

  everyKind("MultiLock: a part held long is waited for holding nothing else once the bound passes; then all are held", () =>
    withBackend(Effect.gen(function*() {
      const { keys, locks } = yield* threeLocks(kit, "multi-wait")
      const [a, b, c] = locks as [Lock.Lock, Lock.Lock, Lock.Lock]
      const busy = yield* hold(Lock.acquire(b))
      const multi = yield* MultiLock.make(c, b, a)
      assert.deepStrictEqual(multi.locks.map((lock) => lock.key), keys, "parts not in key order")
      const waiter = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
        const lease = yield* MultiLock.acquire(multi)
        const held = yield* Effect.forEach(locks, Lock.isLocked)
        return { lease, held }
      })))
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "granted while a part was held by another")
      // in order: it holds a while it waits for b, for a bounded time; c is not taken yet (a is
      // polled, for at most 75 settles: a loaded machine may take it late)
      const aTaken = yield* Lock.isLocked(a).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked, times: 75 }))
      assert.isTrue(aTaken, "a not taken before waiting for b")
      assert.isFalse(yield* Lock.isLocked(c), "c taken before b")
      yield* advance(Duration.toMillis(MultiLock.holdWhileWaiting))
      // past the bound it waits for b alone: a is free for anyone (polled: a loaded machine may be late)
      yield* Lock.isLocked(a).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => !locked }), promptly)
      assert.isTrue(Option.isSome(yield* Effect.scoped(Lock.tryAcquire(a))), "a not free for others")
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)))
      yield* busy.release
      const { held, lease } = yield* Fiber.join(waiter).pipe(promptly)
      assert.deepStrictEqual(held, [true, true, true])
      assert.deepStrictEqual(lease.parts.map((part) => part.key), keys)
      for (const key of keys) yield* assertFree(key)
    })))

  for (const parts of [1, 2]) {
    everyKind(`hand-off: a MultiLock of ${parts} part${parts === 1 ? "" : "s"} waiting for another over the same parts is let in at its release`, () =>
      handOff(`MultiLock of ${parts}`, Effect.gen(function*() {
        const locks = yield* Effect.forEach(range(parts), (i) =>
          Effect.flatMap(freshKey(`hand-off-multi-${parts}-${i}`), (key) => Lock.make(key, { waiterTimeout })))
        const multi = yield* MultiLock.make(...locks)
        const take = (body: Effect.Effect<void>) => MultiLock.withLock(body, multi)
        return { hold: take, wait: take }
      })), 60_000)
  }

  everyKind("MultiLock: overlapping sets in opposite orders never deadlock and never overlap", () =>
    withBackend(Effect.gen(function*() {
      const { keys, locks } = yield* threeLocks(kit, "multi-overlap")
      const [a, b, c] = locks as [Lock.Lock, Lock.Lock, Lock.Lock]
      const forward = yield* MultiLock.make(a, b)
      const backward = yield* MultiLock.make(c, b)
      const all = yield* MultiLock.make(c, b, a)
      const inside = new Map(keys.map((key) => [key, 0]))
      const violations: Array<string> = []
      const enter = (lease: MultiLock.MultiLease) =>
        Effect.sync(() => {
          for (const part of lease.parts) {
            const n = inside.get(part.key)! + 1
            if (n > 1) violations.push(`${part.key} held twice`)
            inside.set(part.key, n)
          }
        })
      const leave = (lease: MultiLock.MultiLease) =>
        Effect.sync(() => lease.parts.forEach((part) => inside.set(part.key, inside.get(part.key)! - 1)))
      const worker = (multi: MultiLock.MultiLock) =>
        Effect.scoped(Effect.gen(function*() {
          const lease = yield* MultiLock.acquire(multi)
          yield* enter(lease)
          yield* Effect.yieldNow()
          yield* leave(lease)
        }))
      const single = Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(b)
        yield* enter({ parts: [lease], expiresIn: lease.expiresIn, lost: lease.lost, state: lease.state })
        yield* leave({ parts: [lease], expiresIn: lease.expiresIn, lost: lease.lost, state: lease.state })
      }))
      yield* Effect.forEach(
        range(24),
        (i) => (i % 4 === 0 ? worker(forward) : i % 4 === 1 ? worker(backward) : i % 4 === 2 ? worker(all) : single),
        { concurrency: "unbounded", discard: true }
      ).pipe(Effect.timeoutFail({ duration: "45 seconds", onTimeout: () => new Error("no progress: workers never finished") }))
      assert.deepStrictEqual(violations, [])
      for (const key of keys) yield* assertFree(key)
    })))
}

/** How a multi-lock's acquisition or hold ends: timeouts, interruptions, a lost part; and re-entry. */
const endings = (kit: Kit): void => {
  const { advance, assertFree, everyKind, hold, live, settle, shortMs, withBackend } = kit

  everyKind("MultiLock: a timeout or an interruption while waiting, and a busy tryAcquire, leave nothing held", () =>
    withBackend(Effect.gen(function*() {
      const { keys, locks } = yield* threeLocks(kit, "multi-timeout")
      const [a, b] = locks as [Lock.Lock, Lock.Lock]
      const fair = yield* FairLock.make(keys[2]!)
      const multi = yield* MultiLock.make(a, b, fair)
      const busy = yield* hold(Lock.acquire(fair))
      const timedOut = yield* Effect.fork(Effect.flip(Effect.scoped(MultiLock.acquire(multi, { timeout: Duration.millis(shortMs) }))))
      yield* settle
      yield* advance(shortMs)
      const error = yield* Fiber.join(timedOut)
      assert.strictEqual(error._tag, "LockTimeout")
      assert.strictEqual(error._tag === "LockTimeout" && error.key, keys[2])
      assert.isTrue(Option.isNone(yield* Effect.scoped(MultiLock.tryAcquire(multi))))
      const waiting = yield* Effect.fork(Effect.scoped(MultiLock.acquire(multi)))
      yield* settle
      yield* Fiber.interrupt(waiting)
      assert.isFalse(yield* Lock.isLocked(a))
      assert.isFalse(yield* Lock.isLocked(b))
      const holders = yield* Lock.holders(fair)
      assert.deepStrictEqual(holders.map((h) => h.holder), [busy.lease.holder])
      yield* busy.release
      for (const key of keys) yield* assertFree(key)
      const lease = yield* Effect.scoped(MultiLock.tryAcquire(multi))
      assert.isTrue(Option.isSome(lease))
      for (const key of keys) yield* assertFree(key)
    })))

  everyKind("MultiLock: an interruption at any step releases the parts taken at once, not when the scope closes", () =>
    withBackend(Effect.gen(function*() {
      for (const steps of range(16)) {
        const { keys, locks } = yield* threeLocks(kit, `multi-interrupt-${steps}`)
        const multi = yield* MultiLock.make(...locks)
        const scope = yield* Scope.make()
        const fiber = yield* Effect.fork(Scope.extend(MultiLock.acquire(multi), scope))
        yield* Effect.repeatN(live ? Effect.sleep(steps % 6) : Effect.yieldNow(), steps)
        yield* Fiber.interrupt(fiber)
        const granted = Exit.isSuccess(yield* Fiber.await(fiber))
        // an acquisition that ended without a lease holds nothing, though the scope is still open
        if (!granted) for (const key of keys) yield* assertFree(key)
        yield* Scope.close(scope, Exit.void)
        for (const key of keys) yield* assertFree(key)
      }
    })), 120_000)

  everyKind("MultiLock: losing one part fails lost and interrupts the withLock body; the others are released", () =>
    withBackend(Effect.gen(function*() {
      const { keys } = yield* threeLocks(kit, "multi-lost")
      const steady = yield* Lock.make(keys[0]!)
      const expiring = yield* Lock.make(keys[1]!, { lease: Duration.millis(shortMs) })
      const multi = yield* MultiLock.make(steady, expiring)
      const interrupted = yield* Deferred.make<void>()
      const body = Effect.never.pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
      const fiber = yield* Effect.fork(MultiLock.withLock(body, multi))
      yield* Lock.isLocked(steady).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
      yield* advance(shortMs)
      const exit = yield* Fiber.await(fiber)
      const error = failureOf(exit)
      assert.isTrue(
        Option.isSome(error) && error.value._tag === "LockLost" && error.value.key === keys[1] && error.value.reason === "DeadlinePassed",
        String(exit)
      )
      assert.isTrue(yield* Deferred.isDone(interrupted), "body was not interrupted")
      for (const key of keys.slice(0, 2)) yield* assertFree(key)
      // the lease's own lost, scoped
      const lost = yield* Effect.scoped(Effect.gen(function*() {
        const lease = yield* MultiLock.acquire(multi)
        const waiting = yield* Effect.fork(Effect.flip(lease.lost))
        yield* settle
        yield* advance(shortMs)
        return yield* Fiber.join(waiting)
      }))
      assert.strictEqual(lost.key, keys[1])
      for (const key of keys.slice(0, 2)) yield* assertFree(key)
    })))

  everyKind("MultiLock: parts re-enter held locks, and the body re-enters the parts", () =>
    withBackend(Effect.gen(function*() {
      const { keys, locks } = yield* threeLocks(kit, "multi-reenter")
      const [a, b] = locks as [Lock.Lock, Lock.Lock]
      const rw = yield* ReadWriteLock.make(keys[2]!)
      const multi = yield* MultiLock.make(a, b, rw.read)
      const counts = yield* Effect.gen(function*() {
        const aCount = yield* Lock.holdCount(a)
        const inner = yield* Lock.holdCount(b).pipe(Lock.withLock(b))
        const rwInside = yield* Lock.holdCount(rw.read)
        return [aCount, inner, rwInside]
      }).pipe(MultiLock.withLock(multi), Lock.withLock(a))
      // a: once by the outer withLock, once by the multi-lock
      assert.deepStrictEqual(counts, [2, 2, 1])
      for (const key of keys) yield* assertFree(key)
      const refused = yield* Effect.flip(MultiLock.make(rw.read, rw.write))
      assert.strictEqual(refused._tag, "InvalidLockOptions")
      assert.strictEqual((yield* Effect.flip(MultiLock.make()))._tag, "InvalidLockOptions")
    })))
}
