/**
 * Subscriptions and whom a change of a key wakes (internal/wakeups.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope, TestClock } from "effect"
import type { Service } from "@lockstep/core/LockBackend"
import { awaitFork, denied, fair, fresh, granted, isDone, KEY, read, rel, request, settle, waitFor } from "./fixtures/memoryBackend.js"

describe("MemoryBackend", () => {
  describe("subscriptions", () => {
    it.effect("a release wakes one subscriber, in arrival order", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const scopes = yield* Effect.forEach(["b:1", "c:1", "d:1"], () => Scope.make())
        const subs = yield* Effect.forEach(["b:1", "c:1", "d:1"], (h, i) =>
          backend.subscribe(KEY, h, "exclusive").pipe(Scope.extend(scopes[i]!)))
        const waits = yield* Effect.forEach(subs, awaitFork)
        yield* backend.release(rel("a:1", "exclusive"))
        assert.deepStrictEqual(yield* Effect.forEach(waits, isDone), [true, false, false])
        granted(yield* backend.acquire(request("b:1")))
        // the granted waiter stops waiting: its subscription closes successfully
        yield* Scope.close(scopes[0]!, Exit.void)
        yield* backend.release(rel("b:1", "exclusive"))
        assert.deepStrictEqual(yield* Effect.forEach(waits, isDone), [true, true, false])
        yield* Effect.forEach(scopes, (scope) => Scope.close(scope, Exit.void))
      }).pipe(Effect.scoped))

    it.effect("a count decrement that keeps the hold wakes nobody", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        granted(yield* backend.acquire(request("a:1")))
        const wait = yield* awaitFork(yield* backend.subscribe(KEY, "b:1", "exclusive"))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isFalse(yield* isDone(wait))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(wait))
      }).pipe(Effect.scoped))

    it.effect("a signal delivered before await is pending and consumed once", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive")
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(yield* awaitFork(sub)))
        assert.isFalse(yield* isDone(yield* awaitFork(sub)))
      }).pipe(Effect.scoped))

    it.effect("a signal delivered to a waiting await is consumed by it", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive")
        const wait = yield* awaitFork(sub)
        yield* settle
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(wait))
        assert.isFalse(yield* isDone(yield* awaitFork(sub)))
      }).pipe(Effect.scoped))

    it.effect("a subscriber holding an unconsumed signal is skipped by the next wake-up", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const sem = (holder: string) => request(holder, { mode: "shared", limit: 2 })
        granted(yield* backend.acquire(sem("a:1")))
        granted(yield* backend.acquire(sem("b:1")))
        const subC = yield* backend.subscribe(KEY, "c:1", "exclusive")
        const subD = yield* backend.subscribe(KEY, "d:1", "exclusive")
        yield* backend.release(rel("a:1", "shared"))
        yield* backend.release(rel("b:1", "shared"))
        assert.isTrue(yield* isDone(yield* awaitFork(subC)))
        assert.isTrue(yield* isDone(yield* awaitFork(subD)))
      }).pipe(Effect.scoped))

    it.effect("a fair key wakes the queue head's subscriber first", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(fair("a:1")))
        denied(yield* backend.acquire(fair("b:1")))
        denied(yield* backend.acquire(fair("c:1")))
        const waitC = yield* awaitFork(yield* backend.subscribe(KEY, "c:1", "exclusive"))
        const waitB = yield* awaitFork(yield* backend.subscribe(KEY, "b:1", "exclusive"))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(waitB))
        assert.isFalse(yield* isDone(waitC))
      }).pipe(Effect.scoped))

    it.effect("await is interruptible and an interrupted await does not eat later signals", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive")
        const first = yield* awaitFork(sub)
        yield* settle
        const exit = yield* Fiber.interrupt(first)
        assert.isTrue(Exit.isInterrupted(exit))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(yield* awaitFork(sub)))
      }).pipe(Effect.scoped))

    it.effect("closing a subscription releases its awaiting fibers instead of leaving them blocked", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const scope = yield* Scope.make()
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive").pipe(Scope.extend(scope))
        const wait = yield* awaitFork(sub)
        assert.isFalse(yield* isDone(wait))
        yield* Scope.close(scope, Exit.void)
        assert.isTrue(yield* isDone(wait))
        assert.isTrue(yield* isDone(yield* awaitFork(sub)))
      }))

    it.effect("a woken subscriber that is interrupted hands the wake-up on", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        // b:1 subscribes but never gets to await: the wake-up stays pending on it
        const b = yield* Effect.fork(Effect.scoped(Effect.zipRight(backend.subscribe(KEY, "b:1", "exclusive"), Effect.never)))
        yield* settle
        const subC = yield* backend.subscribe(KEY, "c:1", "exclusive")
        const waitC = yield* awaitFork(subC)
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isFalse(yield* isDone(waitC))
        yield* Fiber.interrupt(b)
        assert.isTrue(yield* isDone(waitC))
      }).pipe(Effect.scoped))

    it.effect("a subscription closed with a failure hands on; one closed successfully does not", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        let round = 0
        const handsOn = (exit: Exit.Exit<unknown, unknown>) =>
          Effect.gen(function* () {
            // a fresh holder each round: an ended one is remembered and refused
            const holder = `a:${++round}`
            granted(yield* backend.acquire(request(holder)))
            const scope = yield* Scope.make()
            yield* backend.subscribe(KEY, "b:1", "exclusive").pipe(Scope.extend(scope))
            const waitC = yield* awaitFork(yield* backend.subscribe(KEY, "c:1", "exclusive"))
            yield* backend.release(rel(holder, "exclusive"))
            yield* Scope.close(scope, exit)
            const done = yield* isDone(waitC)
            yield* Fiber.interrupt(waitC)
            return done
          }).pipe(Effect.scoped)
        assert.isTrue(yield* handsOn(Exit.fail("timeout")))
        assert.isFalse(yield* handsOn(Exit.void))
      }))

    it.effect("a shared grant wakes the next reader, so all readers enter after one release", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("w:1")))
        const readers = yield* Effect.forEach(["r:1", "r:2", "r:3"], (h) => Effect.fork(waitFor(backend, read(h))))
        yield* settle
        yield* backend.release(rel("w:1", "exclusive"))
        assert.deepStrictEqual(yield* Effect.forEach(readers, isDone), [true, true, true])
        assert.strictEqual((yield* backend.inspect(KEY)).holders.length, 3)
      }))

    const touches: ReadonlyArray<readonly [string, (backend: Service) => Effect.Effect<unknown, unknown>]> = [
      ["inspect", (backend) => backend.inspect(KEY)],
      ["release", (backend) => Effect.either(backend.release(rel("a:1", "exclusive")))],
      ["renew", (backend) => backend.renew([{ key: KEY, holder: "a:1", leaseMs: 1000 }])],
      ["acquire", (backend) => backend.acquire(request("x:1", { key: KEY }))],
      ["forceRelease", (backend) => backend.forceRelease({ key: KEY, id: crypto.randomUUID() })],
      ["cancel", (backend) => backend.cancel({ key: KEY, holder: "x:1", leaseMs: 1000 })]
    ]
    for (const [name, touch] of touches) {
      it.effect(`an expiry noticed by ${name} wakes a waiter`, () =>
        Effect.gen(function* () {
          const { service: backend } = yield* fresh
          granted(yield* backend.acquire(request("a:1")))
          const wait = yield* awaitFork(yield* backend.subscribe(KEY, "b:1", "exclusive"))
          yield* TestClock.adjust(1000)
          // no timers: nothing happens until the key is touched
          assert.isFalse(yield* isDone(wait))
          yield* touch(backend)
          assert.isTrue(yield* isDone(wait))
        }).pipe(Effect.scoped))
    }

    it.effect("waiters take turns on an exclusive key and leave no state behind", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        const holders = ["w:1", "w:2", "w:3", "w:4"]
        granted(yield* backend.acquire(fair("w:0")))
        const order: Array<string> = []
        const workers = yield* Effect.forEach(holders, (h) =>
          Effect.fork(
            waitFor(backend, fair(h, { waiterTtlMs: 10_000 })).pipe(
              Effect.tap(() => Effect.sync(() => order.push(h))),
              Effect.zipRight(backend.release(rel(h, "exclusive")))
            )
          ))
        yield* settle
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue.map((w) => w.holder), holders)
        yield* backend.release(rel("w:0", "exclusive"))
        yield* Effect.forEach(workers, Fiber.join)
        assert.deepStrictEqual(order, holders)
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.queue, state.limit, state.fence], [[], [], undefined, 5])
        // ended holders and the fence are remembered for a lease, then the key is gone
        assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 0, subscriptions: 0, fences: 1, ended: 5 })
        yield* TestClock.adjust(1000)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), { keys: 0, subscribedKeys: 0, subscriptions: 0, fences: 0, ended: 0 })
      }))

    it.effect("no state is left after holders, waiters and subscriptions are gone", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        yield* Effect.gen(function* () {
          granted(yield* backend.acquire(request("a:1", { mode: "shared", limit: 2 })))
          denied(yield* backend.acquire(request("w:1", { fair: true })))
          const sub = yield* backend.subscribe(KEY, "w:1", "exclusive")
          yield* awaitFork(sub)
          assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 1, subscriptions: 1, fences: 1, ended: 0 })
        }).pipe(Effect.scoped)
        yield* backend.release(rel("a:1", "shared"))
        // the queue entry of w:1 outlives the hold until its waiter ttl
        assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 0, subscriptions: 0, fences: 1, ended: 1 })
        yield* TestClock.adjust(100)
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.queue, state.limit], [[], [], undefined])
        // the ended holder and the fence a lease longer
        yield* TestClock.adjust(900)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), { keys: 0, subscribedKeys: 0, subscriptions: 0, fences: 0, ended: 0 })
      }))
  })

  it.effect("a repeated forced release that notices an expiry wakes a waiter, as every other operation does", () =>
    Effect.gen(function* () {
      const { service: backend } = yield* fresh
      granted(yield* backend.acquire(request("a:1")))
      assert.isTrue(yield* backend.forceRelease({ key: KEY, id: "x" }))
      granted(yield* backend.acquire(request("b:1")))
      const wait = yield* awaitFork(yield* backend.subscribe(KEY, "c:1", "exclusive"))
      yield* TestClock.adjust(1000)
      // b's hold expired: the copy of the forced release answers as the first did and wakes c
      assert.isTrue(yield* backend.forceRelease({ key: KEY, id: "x" }))
      assert.isTrue(yield* isDone(wait))
    }).pipe(Effect.scoped))
})
