/**
 * The Redis backend when the server loses data or a key is clobbered: a restart of a server that
 * keeps nothing on disk while leases are held, FLUSHALL, a key of another type inside a batch of
 * renewals, and the keys a lock leaves behind. Every test starts its own redis-server.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Option } from "effect"
import { Lock } from "@lockstep/core"
import { RedisServer } from "@lockstep/servers"
import { backendOn, call, instrumentCalls, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis data-loss suite (dataloss.test.ts)")

const WATCHDOG_MS = 600

describe.runIf(runnable)("Redis backend when the server loses data", () => {
  it.scopedLive("a restart without persistence while a lease is held: new fences are greater, the old holder learns it lost", () =>
    Effect.gen(function*() {
      // the test servers keep nothing on disk: a restart is a loss of every key
      const server = yield* RedisServer.make()
      const a = yield* backendOn(server.url)
      const b = yield* backendOn(server.url)
      const key = "dataloss-restart"
      const lockA = yield* Lock.make(key, { watchdog: WATCHDOG_MS }).pipe(withBackend(a))
      const lockB = yield* Lock.make(key, { watchdog: WATCHDOG_MS }).pipe(withBackend(b))
      const fences: Array<number> = []
      // a few grants first, so the counter is well ahead of 1
      for (let i = 0; i < 3; i++) fences.push(yield* Effect.scoped(Effect.map(Lock.acquire(lockB), (l) => l.fence)))
      const holderA = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lockA)
        fences.push(lease.fence)
        return yield* Effect.flip(lease.lost)
      })))
      yield* Effect.sleep(50)
      yield* server.restart
      const fenceB = yield* Effect.scoped(Effect.map(Lock.acquire(lockB, { timeout: "5 seconds" }), (l) => l.fence))
      const lost = yield* Fiber.join(holderA).pipe(Effect.timeout("5 seconds"))
      console.log(`[dataloss] fences before the restart ${JSON.stringify(fences)}, after ${fenceB}; A lost: ${lost.reason}`)
      for (const fence of fences) assert.isAbove(fenceB, fence, "a fence went back after the restart")
      assert.strictEqual(lost.reason, "NotHeld")
    }))

  it.scopedLive("FLUSHALL under a re-entrant holder: its re-entry is refused as lost, it never frees the new holder's lock", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const a = yield* backendOn(server.url)
      const b = yield* backendOn(server.url)
      const key = "dataloss-flush"
      const lockA = yield* Lock.make(key, { watchdog: "30 seconds" }).pipe(withBackend(a))
      const lockB = yield* Lock.make(key, { watchdog: "30 seconds" }).pipe(withBackend(b))
      const outer = yield* Lock.acquire(lockA)
      yield* call(raw, "FLUSHALL")
      // B takes the emptied key; A, unaware, re-enters and releases the inner hold
      const holderB = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lockB)
        yield* Effect.sleep(300)
        return { fence: lease.fence, stillHeld: (yield* Lock.holders(lockB)).some((h) => h.holder === lease.holder) }
      })))
      yield* Effect.sleep(50)
      const inner = yield* Effect.scoped(Lock.tryAcquire(lockA))
      const lost = yield* Effect.flip(outer.lost).pipe(Effect.timeout("1 second"))
      const b1 = yield* Fiber.join(holderB)
      assert.isTrue(Option.isNone(inner), "A re-entered a hold the server had forgotten")
      assert.strictEqual(lost.reason, "NotHeld")
      assert.isAbove(b1.fence, outer.fence)
      assert.isTrue(b1.stillHeld, "A's inner release freed B's lock")
    }))

  it.scopedLive("a key of another type in a batch of renewals fails only its own lease", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const recorded = instrumentCalls(yield* backendOn(server.url))
      const backend = recorded.service
      // healthy leases around the bad one, taken together so their renewals share scripts
      const healthy = Array.from({ length: 10 }, (_, i) => `batch-${i}`)
      const keys = [...healthy.slice(0, 5), "batch-bad", ...healthy.slice(5)]
      const locks = yield* Effect.forEach(keys, (key) => Lock.make(key, { watchdog: WATCHDOG_MS }).pipe(withBackend(backend)))
      const leases = yield* Effect.forEach(locks, (lock) => Lock.acquire(lock), { concurrency: "unbounded" })
      const watchers = yield* Effect.forEach(leases, (lease) => Effect.fork(Effect.flip(lease.lost)))
      // the middle lock's hash is replaced by a string: its renewals meet WRONGTYPE
      yield* call(raw, "DEL", "batch-bad")
      yield* call(raw, "SET", "batch-bad", "not a lock")
      yield* Effect.sleep(WATCHDOG_MS * 4)
      const lost = yield* Effect.forEach(watchers, (w) => Effect.map(Fiber.poll(w), Option.isSome))
      assert.deepStrictEqual(
        keys.filter((_, i) => lost[i]),
        ["batch-bad"],
        "healthy leases in the batch were reported lost, or the clobbered one was not"
      )
      for (const key of healthy) {
        const ttl = Number(yield* call(raw, "PTTL", key))
        assert.isAbove(ttl, WATCHDOG_MS / 3, `${key} was not renewed`)
        // every renewal of a healthy lease succeeded, although they shared scripts with the bad one
        const renewals = recorded.calls.filter((c) => c.op === "renew" && c.key === key)
        assert.isAbove(renewals.length, 2)
        assert.deepStrictEqual(renewals.filter((c) => c.ok !== true).map((c) => c.ok), [], `${key}: failed renewals`)
      }
      const badRenewals = recorded.calls.filter((c) => c.op === "renew" && c.key === "batch-bad")
      assert.isTrue(badRenewals.some((c) => c.ok === "error"), "the clobbered lease's renewals did not fail")
    }))

  it.scopedLive("no key a lock writes outlives the lock by more than its lease", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url)
      const lease = 400
      yield* Effect.forEach(Array.from({ length: 50 }, (_, i) => i), (i) =>
        Effect.gen(function*() {
          const lock = yield* Lock.make(`orders:${i}`, { lease }).pipe(withBackend(backend))
          yield* Effect.scoped(Lock.acquire(lock))
          const watched = yield* Lock.make(`jobs:${i}`, { watchdog: lease }).pipe(withBackend(backend))
          yield* Effect.scoped(Lock.acquire(watched))
        }), { concurrency: 10, discard: true })
      // KEYS, not DBSIZE: DBSIZE also counts expired keys the server has not reclaimed yet
      const live = Effect.map(call(raw, "KEYS", "*"), (keys) => (keys as ReadonlyArray<string>).length)
      const right = yield* live
      yield* Effect.sleep(lease + 300)
      const after = yield* live
      console.log(`[dataloss] keys right after 100 released locks: ${right}; a lease later: ${after}`)
      assert.isAbove(right, 0, "the locks wrote no keys at all: the check would prove nothing")
      assert.strictEqual(after, 0, `keys left behind: ${JSON.stringify(yield* call(raw, "KEYS", "*"))}`)
    }))
})
