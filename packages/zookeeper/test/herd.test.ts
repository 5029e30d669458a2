/**
 * Wake-ups without a herd: waiters queue in ZooKeeper and each watches the node just before its
 * own, so every release lets in, and wakes, one waiter. Counted at the backend: the acquisition
 * attempts made from the moment all waiters are queued until the last is granted.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Scope } from "effect"
import type { LockBackend as Backend } from "@lockstep/core"
import { FairLock, Lock, LockBackend } from "@lockstep/core"
import { ZooKeeperBackend } from "@lockstep/zookeeper"
import { serverForFile } from "./fixtures/server.js"

const server = await serverForFile("ZooKeeper herd suite")

const waiters = 12

/** The backend, with its acquisition attempts counted. */
const counted = (attempts: { count: number }) =>
  Layer.effect(
    LockBackend.LockBackend,
    Effect.map(LockBackend.LockBackend, (backend): Backend.Service => ({
      ...backend,
      acquire: (request) => Effect.suspend(() => {
        attempts.count += 1
        return backend.acquire(request)
      })
    }))
  ).pipe(Layer.provide(ZooKeeperBackend.layerFrom(server!.connectionString, { namespace: `/herd-${crypto.randomUUID()}` })))

describe.runIf(server !== undefined)("ZooKeeper: a release wakes one waiter", () => {
  for (const kind of ["Lock", "FairLock"] as const) {
    it.scopedLive(`${kind}: ${waiters} queued waiters are let in one by one, about one attempt each`, () =>
      Effect.gen(function*() {
        const attempts = { count: 0 }
        yield* Effect.gen(function*() {
          // waiters retry on their own only every 20 s: every attempt counted here follows a wake-up
          const lock = kind === "Lock"
            ? yield* Lock.make("herd", { waiterTimeout: "20 seconds" })
            : yield* FairLock.make("herd", { waiterTimeout: "20 seconds" })
          const holderScope = yield* Scope.make()
          yield* Scope.extend(Lock.acquire(lock), holderScope)
          const order: Array<number> = []
          const fibers = []
          for (let i = 0; i < waiters; i++) {
            fibers.push(yield* Effect.fork(Effect.scoped(Effect.zipRight(Lock.acquire(lock), Effect.sync(() => order.push(i))))))
            yield* Effect.sleep("20 millis")
          }
          yield* Effect.sleep("300 millis")
          const queued = attempts.count
          // each waiter made its first attempt and its subscribed one, and a few tried again once
          // (a waiter that queued behind the node of another's first attempt, which went at once)
          assert.isAtLeast(queued, 2 * waiters)
          assert.isAtMost(queued, 3 * waiters, `${queued} attempts to queue ${waiters} waiters`)
          yield* Scope.close(holderScope, Exit.void)
          yield* Effect.forEach(fibers, Fiber.join)
          const afterRelease = attempts.count - queued
          // one attempt per grant (the woken waiter's), and none from the waiters still queued
          assert.strictEqual(afterRelease, waiters, `${afterRelease} attempts for ${waiters} grants`)
          assert.deepStrictEqual(order, Array.from({ length: waiters }, (_, i) => i))
        }).pipe(Effect.provide(counted(attempts)))
      }), 60_000)
  }
})
