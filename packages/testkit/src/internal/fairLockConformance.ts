import { assert } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import * as Lock from "@lockstep/core/Lock"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { LockError } from "@lockstep/core/LockError"
import type { Kit } from "./conformanceKit.js"
import { range } from "./conformanceKit.js"

// FairLock: grants in arrival order, and a waiter that stopped heartbeating is dropped.

export const waiterHandOff = ({ everyKind, freshKey, waiterTimeout, handOff }: Kit): void =>
  everyKind("hand-off: a FairLock waiter is let in at the release, not at its own retry", () =>
    handOff("FairLock", Effect.gen(function*() {
      const lock = yield* FairLock.make(yield* freshKey("hand-off-fair"), { waiterTimeout })
      const take = (body: Effect.Effect<void>) => Lock.withLock(body, lock)
      return { hold: take, wait: take }
    })), 60_000)

export const arrivalOrder = ({ everyKind, settle, freshKey, inspect, assertFree, hold, withBackend }: Kit): void =>
  everyKind("FairLock grants in arrival order", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("fair")
      const lock = yield* FairLock.make(key)
      const first = yield* hold(Lock.acquire(lock))
      const order: Array<number> = []
      const waiters: Array<Fiber.RuntimeFiber<void, LockError>> = []
      for (const i of range(8)) {
        waiters.push(yield* Effect.fork(Effect.scoped(Effect.zipRight(Lock.acquire(lock), Effect.sync(() => void order.push(i))))))
        // the next waiter arrives only once this one is queued
        yield* inspect(key).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (s) => s.queue.length === i + 1 }))
      }
      yield* first.release
      yield* Fiber.joinAll(waiters)
      assert.deepStrictEqual(order, range(8))
      yield* assertFree(key)
    })))

export const deadWaiter = ({ everyKind, settle, advance, promptly, freshKey, inspect, hold, withBackend }: Kit): void =>
  everyKind("a fair waiter that stops heartbeating is dropped once its queue entry expires", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("ghost")
      const lock = yield* FairLock.make(key, { waiterTimeout: "600 millis" })
      const backend = yield* LockBackend
      const first = yield* hold(Lock.acquire(lock))
      // a waiter that queues once and dies: it never retries and never cancels
      const ghost = `${backend.clientId}:ghost`
      const queued = yield* backend.acquire({
        key,
        holder: ghost,
        mode: "exclusive",
        permits: 1,
        limit: 1,
        leaseMs: 30_000,
        fair: true,
        waiterTtlMs: 600,
        count: 1
      })
      assert.strictEqual(queued._tag, "Denied")
      const waiter = yield* Effect.fork(Effect.scoped(Effect.asVoid(Lock.acquire(lock))))
      yield* settle
      yield* first.release
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "granted past a live queue entry ahead of it")
      yield* advance(600)
      yield* Fiber.join(waiter).pipe(promptly)
      assert.isFalse((yield* inspect(key)).queue.some((w) => w.holder === ghost))
    })))
