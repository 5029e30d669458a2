/**
 * The hand-off on a real redis-server: a release grants a waiter that can win a claim (a hold of
 * count 1 with a fresh fence, kept `maxClaimMs` unless confirmed) and tells it so in its wake
 * message. What must hold whatever happens to that message or that waiter: a claim no one confirms
 * ends by itself and the next waiter gets the lock; a lost message leaves the waiter to find
 * itself the holder at its next look (the same fence, one hold); a duplicated or stale message
 * grants nothing twice; a waiter that gives up while the release was in flight leaves nothing held.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Deferred, Duration, Effect, Exit, Fiber, Option } from "effect"
import { FairLock, Lock, Semaphore } from "@lockstep/core"
import type { Service } from "@lockstep/core/LockBackend"
import { subscriptionOf } from "@lockstep/core/LockBackend"
import { RedisServer } from "@lockstep/servers"
import { maxClaimMs } from "../src/internal/redisBackend.js"
import * as scripts from "../src/internal/scripts/lock.js"
import { wakeCode } from "../src/internal/wakeups.js"
import { backendOn, call, counted, eventually, nowMs, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis hand-off suite (handoff.test.ts)")

const tuning = { commandTimeout: "3 seconds" } as const

/**
 * `backend` whose waiters never hear a wake-up: the subscription is made (so the waiter registers
 * and asks for hand-offs) but its messages are dropped, as if lost on the way. The waiters look
 * again only at their own retry.
 */
const deaf = (backend: Service): Service => ({
  ...backend,
  subscribe: (key, holder, mode) =>
    Effect.as(backend.subscribe(key, holder, mode), subscriptionOf(() => () => undefined))
})

/** The holders of `key` as the backend reports them: holder -> { fence, exclusive, shared }. */
const holdersOf = (backend: Service, key: string) =>
  Effect.map(backend.inspect(key), (state) => state.holders)

/** The two messages of a hand-off to `holder` with `fence`, as a release publishes them. */
const handOffMessages = (holder: string, fence: number): [string, string] => {
  const code = wakeCode(holder)
  return [`1${code.padStart(17, "0")}`, String(fence)]
}

/**
 * A holder that takes a lock with `around` (in a fiber of its own) and keeps it until the effect
 * returned runs, which lets it go and waits for the holder to end. Returns once the lock is held.
 */
const holdUntilReleased = (around: (body: Effect.Effect<void>) => Effect.Effect<unknown, unknown, Scope.Scope>) =>
  Effect.gen(function*() {
    const held = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.fork(Effect.scoped(around(Effect.zipRight(Deferred.succeed(held, undefined), Deferred.await(release)))))
    yield* Deferred.await(held)
    return Effect.zipRight(Deferred.succeed(release, undefined), Fiber.join(holder))
  })

type Kind = "Lock" | "FairLock" | "Semaphore"

/** A lock of `kind` on `key` through `backend` (a semaphore of one permit): its acquire and try-acquire. */
const kindOn = (kind: Kind, key: string, waiterTimeout: Duration.DurationInput, backend: Service) =>
  Effect.gen(function*() {
    if (kind === "Semaphore") {
      const semaphore = yield* Semaphore.make(key, { waiterTimeout, limit: 1 }).pipe(withBackend(backend))
      return { acquire: Semaphore.acquire(semaphore), tryAcquire: Semaphore.tryAcquire(semaphore) }
    }
    const lock = yield* (kind === "Lock" ? Lock.make(key, { waiterTimeout }) : FairLock.make(key, { waiterTimeout })).pipe(
      withBackend(backend)
    )
    return { acquire: Lock.acquire(lock), tryAcquire: Lock.tryAcquire(lock) }
  })

describe.runIf(runnable)("Redis backend: the hand-off", () => {
  it.scopedLive("a release hands the lock to the waiter: one acquire of its own, the fence of the claim", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const a = yield* backendOn(server.url, tuning)
      const b = yield* backendOn(server.url, tuning)
      const { calls, service: counting } = counted(b)
      const key = "handoff-plain"
      const lockA = yield* Lock.make(key).pipe(withBackend(a))
      const lockB = yield* Lock.make(key, { waiterTimeout: "20 seconds" }).pipe(withBackend(counting))
      const release = yield* holdUntilReleased(Lock.withLock(lockA))
      const waiter = yield* Effect.fork(Effect.scoped(Effect.map(Lock.acquire(lockB), (lease) => lease.fence)))
      // waiting: registered as a waiter (its first attempt, then the one on its subscription)
      yield* eventually("the waiter waits", Effect.sync(() => calls.acquire >= 2), 5_000)
      const before = calls.acquire
      const releasedAt = nowMs()
      yield* release
      const fence = yield* Fiber.join(waiter)
      assert.isBelow(nowMs() - releasedAt, 1_000)
      assert.strictEqual(calls.acquire, before, "the waiter asked again for a lock it was handed")
      assert.isAbove(fence, 0)
      // released with its scope: nothing is left
      assert.deepStrictEqual(yield* holdersOf(a, key), [])
    }), 30_000)

  for (const lease of [undefined, "6 seconds"] as const) {
    it.scopedLive(`a lock handed over and held past the claim is confirmed to its full lease (${lease === undefined ? "watchdog" : "fixed lease"})`, () =>
      Effect.gen(function*() {
        const server = yield* RedisServer.make()
        const a = yield* backendOn(server.url, tuning)
        const b = yield* backendOn(server.url, tuning)
        const { calls, service: counting } = counted(b)
        const key = `handoff-confirmed-${lease ?? "watchdog"}`
        const lockA = yield* Lock.make(key).pipe(withBackend(a))
        const lockB = yield* Lock.make(key, { waiterTimeout: "20 seconds", ...(lease === undefined ? {} : { lease }) }).pipe(
          withBackend(counting)
        )
        const release = yield* holdUntilReleased(Lock.withLock(lockA))
        const handedOver = yield* Deferred.make<void>()
        const waiter = yield* Effect.fork(Lock.withLock(lockB)((l) =>
          Effect.gen(function*() {
            yield* Deferred.succeed(handedOver, undefined)
            // past the claim: only a confirmation keeps it
            yield* Effect.sleep(Duration.millis(maxClaimMs + 1_000))
            return { fence: l.fence, state: yield* l.state, left: Duration.toMillis(yield* l.expiresIn) }
          })
        ))
        yield* eventually("the waiter waits", Effect.sync(() => calls.acquire >= 2), 5_000)
        const before = calls.acquire
        yield* release
        yield* Deferred.await(handedOver)
        assert.strictEqual(calls.acquire, before, "the lock was not handed over")
        const claimed = yield* holdersOf(a, key)
        const result = yield* Fiber.join(waiter)
        assert.strictEqual(result.state, "Held")
        assert.strictEqual(result.fence, claimed[0]!.fence)
        assert.isAbove(result.left, 1_000)
        assert.deepStrictEqual(yield* holdersOf(a, key), [])
      }), 30_000)
  }

  it.scopedLive("a claim whose waiter died is freed within the claim lease, and the next waiter gets the lock", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const a = yield* backendOn(server.url, tuning)
      const c = yield* backendOn(server.url, tuning)
      const key = "handoff-dead"
      const claimMs = 600
      const lockA = yield* Lock.make(key).pipe(withBackend(a))
      const lease = yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lockA)
        // a waiter that registered for a hand-off and died: its entry, as its acquire wrote it
        const dead = "00000000-dead-4000-8000-000000000000:1"
        const request = {
          key,
          holder: dead,
          mode: "exclusive" as const,
          permits: 1,
          limit: 1,
          leaseMs: 30_000,
          fair: false,
          waiterTtlMs: 20_000,
          count: 1
        }
        const keys = scripts.acquire.keys(key, dead, undefined)
        const args = scripts.acquire.args(request, wakeCode(dead), true, claimMs, undefined)
        const reply = (yield* call(raw, "EVAL", scripts.acquire.lua, keys.length, ...keys, ...args)) as Array<unknown>
        assert.strictEqual(Number(reply[0]), 0, "the dead waiter was not denied")
        // the next waiter, which looks again on its own every 200 ms
        const lockC = yield* Lock.make(key, { waiterTimeout: "200 millis" }).pipe(withBackend(c))
        return { dead, lockC }
      }))
      // the release granted the dead waiter a claim
      const claimed = yield* holdersOf(a, key)
      assert.deepStrictEqual(claimed.map((h) => h.holder), [lease.dead])
      assert.isAtMost(claimed[0]!.ttlMs, claimMs)
      const startedAt = nowMs()
      const fence = yield* Effect.scoped(Effect.map(Lock.acquire(lease.lockC), (l) => l.fence))
      // the claim ran out unconfirmed, and the next waiter was let in at its next look
      assert.isBelow(nowMs() - startedAt, claimMs + 1_000)
      assert.isAbove(fence, claimed[0]!.fence)
      assert.deepStrictEqual(yield* holdersOf(a, key), [])
    }), 30_000)

  for (const kind of ["Lock", "FairLock", "Semaphore"] as const) {
    it.scopedLive(`${kind}: a lost wake message: the waiter finds itself the holder at its next look (one fence, one hold)`, () =>
      Effect.gen(function*() {
        const server = yield* RedisServer.make()
        const a = yield* backendOn(server.url, tuning)
        const b = deaf(yield* backendOn(server.url, tuning))
        const c = yield* backendOn(server.url, tuning)
        const key = `handoff-lost-${kind}`
        // the waiter looks again on its own every 900 ms (a fair one heartbeats at a third of it),
        // well within the claim
        const options = { waiterTimeout: kind === "FairLock" ? "2700 millis" : "900 millis" } as const
        const make = (backend: Service) => kindOn(kind, key, options.waiterTimeout, backend)
        const lockA = yield* make(a)
        const lockB = yield* make(b)
        const lockC = yield* make(c)
        const release = yield* holdUntilReleased((body) => Effect.zipRight(lockA.acquire, body))
        const granted = yield* Deferred.make<{ fence: number; holder: string }>()
        const done = yield* Deferred.make<void>()
        const waiter = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
          const lease = yield* lockB.acquire
          yield* Deferred.succeed(granted, { fence: lease.fence, holder: lease.holder })
          yield* Deferred.await(done)
        })))
        // its first attempt, its subscription, and its registering attempt
        yield* Effect.sleep("300 millis")
        yield* release
        // the release granted the deaf waiter a claim, which it has not heard of
        const claimed = yield* holdersOf(a, key)
        assert.strictEqual(claimed.length, 1)
        assert.isFalse(yield* Deferred.isDone(granted))
        // no one else gets it meanwhile
        assert.isTrue(Option.isNone(yield* Effect.scoped(lockC.tryAcquire)))
        const lease = yield* Deferred.await(granted)
        assert.strictEqual(lease.holder, claimed[0]!.holder)
        assert.strictEqual(lease.fence, claimed[0]!.fence, "the retry was granted afresh, not the claim")
        const holding = yield* holdersOf(a, key)
        assert.strictEqual(holding.length, 1)
        assert.strictEqual(holding[0]!.exclusive + holding[0]!.shared, 1, "the retry made the claim count 2")
        assert.isAbove(holding[0]!.ttlMs, maxClaimMs, "the retry did not confirm the claim to the full lease")
        yield* Deferred.succeed(done, undefined)
        yield* Fiber.join(waiter)
        // one release frees it
        assert.deepStrictEqual(yield* holdersOf(a, key), [])
        assert.isTrue(Option.isSome(yield* Effect.scoped(lockC.tryAcquire)))
      }), 30_000)
  }

  it.scopedLive("a duplicated wake message grants nothing twice; a stale one grants nothing", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const a = yield* backendOn(server.url, tuning)
      const b = yield* backendOn(server.url, tuning)
      const key = "handoff-duplicate"
      const channel = scripts.channelOf(key)
      const lockA = yield* Lock.make(key).pipe(withBackend(a))
      const lockB = yield* Lock.make(key, { waiterTimeout: "20 seconds" }).pipe(withBackend(b))
      const release = yield* holdUntilReleased(Lock.withLock(lockA))
      const leases: Array<{ fence: number; holder: string }> = []
      const done = yield* Deferred.make<void>()
      const waiter = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lockB)
        leases.push({ fence: lease.fence, holder: lease.holder })
        yield* Deferred.await(done)
      })))
      // the waiter's holder id: it is the one registered in the waiters set
      let waiterId = ""
      yield* eventually("the waiter is registered", Effect.gen(function*() {
        const members = (yield* call(raw, "ZRANGE", `lockstep_waiters:{${key}}`, 0, -1)) as Array<string>
        waiterId = members[0]?.split("|")[5] ?? ""
        return waiterId !== ""
      }), 5_000)
      // a stale hand-off (a fence issued before the waiter's last look, as a late copy of an old
      // message would carry) lets it in to nothing: it keeps waiting
      const token = Number((yield* call(raw, "GET", `redisson_lock_token:{${key}}`)) ?? 0)
      for (const m of handOffMessages(waiterId, token)) yield* call(raw, "PUBLISH", channel, m)
      yield* Effect.sleep("300 millis")
      assert.deepStrictEqual(leases, [], "a stale hand-off let the waiter in while the lock was held")
      yield* release
      yield* eventually("the waiter is let in", Effect.sync(() => leases.length > 0), 2_000)
      const claimed = yield* holdersOf(a, key)
      assert.strictEqual(leases[0]!.fence, claimed[0]!.fence)
      // the same hand-off delivered again, twice
      for (let i = 0; i < 2; i++) {
        for (const m of handOffMessages(waiterId, leases[0]!.fence)) yield* call(raw, "PUBLISH", channel, m)
      }
      yield* Effect.sleep("200 millis")
      assert.strictEqual(leases.length, 1)
      const holding = yield* holdersOf(a, key)
      assert.strictEqual(holding.length, 1)
      assert.strictEqual(holding[0]!.exclusive, 1)
      yield* Deferred.succeed(done, undefined)
      yield* Fiber.join(waiter)
      assert.deepStrictEqual(yield* holdersOf(a, key), [])
      assert.isTrue(Option.isSome(yield* Effect.scoped(Lock.tryAcquire(lockA))))
    }), 30_000)

  for (const kind of ["Lock", "FairLock", "Semaphore"] as const) {
    it.scopedLive(`${kind}: a waiter interrupted while the release was in flight leaves nothing held`, () =>
      Effect.gen(function*() {
        const server = yield* RedisServer.make()
        const a = yield* backendOn(server.url, tuning)
        // deaf: the claim is granted, and the waiter gives up before it hears of it
        const b = deaf(yield* backendOn(server.url, tuning))
        const key = `handoff-interrupted-${kind}`
        const options = { waiterTimeout: "20 seconds" } as const
        const make = (backend: Service) => kindOn(kind, key, options.waiterTimeout, backend)
        const lockA = yield* make(a)
        const lockB = yield* make(b)
        const release = yield* holdUntilReleased((body) => Effect.zipRight(lockA.acquire, body))
        const waiter = yield* Effect.fork(Effect.scoped(lockB.acquire))
        yield* Effect.sleep("300 millis")
        yield* release
        const claimed = yield* holdersOf(a, key)
        assert.strictEqual(claimed.length, 1, "the release granted no claim")
        const exit = yield* Fiber.interrupt(waiter)
        assert.isTrue(Exit.isInterrupted(exit))
        // the claim is released at once, well before it would run out
        yield* eventually("the claim is released", Effect.orDie(Effect.map(holdersOf(a, key), (h) => h.length === 0)), 500)
        const state = yield* a.inspect(key)
        assert.deepStrictEqual(state.queue, [])
        assert.isTrue(Option.isSome(yield* Effect.scoped(lockA.tryAcquire)))
      }), 30_000)
  }
})
