/**
 * Wake-ups without a herd: waiters queue in ZooKeeper and each watches the node just before its
 * own, so every release lets in, and wakes, one waiter. Counted at the backend: the acquisition
 * attempts made from the moment all waiters are queued until the last is granted.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Schedule, Scope } from "effect"
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
      // counted once answered: a waiter counted twice has its place in the queue
      acquire: (request) => Effect.ensuring(backend.acquire(request), Effect.sync(() => void (attempts.count += 1)))
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
          // each waiter queues before the next arrives: its first attempt and its subscribed one
          // (which keeps its node) are answered before the next waiter starts
          const answered = (count: number) =>
            Effect.repeat(Effect.sync(() => attempts.count >= count), {
              until: (done) => done,
              schedule: Schedule.spaced("5 millis")
            }).pipe(Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error(`${attempts.count} attempts, waiting for ${count}`) }))
          for (let i = 0; i < waiters; i++) {
            fibers.push(yield* Effect.fork(Effect.scoped(Effect.zipRight(Lock.acquire(lock), Effect.sync(() => order.push(i))))))
            yield* answered(1 + 2 * (i + 1))
          }
          const queued = attempts.count
          // the holder's one attempt, then two per waiter: nobody woken while they queued
          assert.strictEqual(queued, 1 + 2 * waiters)
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
