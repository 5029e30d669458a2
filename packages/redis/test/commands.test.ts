/**
 * What the Redis backend's scripts cost and whom a release wakes, on a real redis-server: the
 * commands an uncontended cycle runs, that a fair-queue operation does not read per-waiter state,
 * and that a release wakes the waiter that can win (one across backends, one per freed permit),
 * not every waiter. Counts, not timings. Each test starts its own server (never the shared 6379).
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import { Lock, Semaphore } from "@lockstep/core"
import type { AcquireRequest, Service } from "@lockstep/core/LockBackend"
import { RedisServer } from "@lockstep/servers"
import { backendOn, call, commandStats, eventually, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis command-count suite (commands.test.ts)")

/** Calls per command run inside the scripts (the scripts themselves and the probes left out). */
const commandCalls = (info: string): Map<string, number> => {
  const out = commandStats(info)
  out.delete("evalsha")
  out.delete("eval")
  out.delete("fcall")
  return out
}
const total = (calls: Map<string, number>) => [...calls.values()].reduce((a, b) => a + b, 0)

/** Counts the acquire calls a backend receives. */
const counting = (backend: Service) => {
  const counts = { acquire: 0, granted: 0 }
  const service: Service = {
    ...backend,
    acquire: (request) =>
      Effect.suspend(() => {
        counts.acquire++
        return Effect.tap(backend.acquire(request), (result) =>
          Effect.sync(() => {
            if (result._tag === "Granted") counts.granted++
          }))
      })
  }
  return { service, counts }
}

const tuning = { commandTimeout: "5 seconds" } as const

describe.runIf(runnable)("Redis backend: commands per operation and wake-ups", () => {
  it.scopedLive("an uncontended lock + unlock runs 9 commands in its two scripts and touches no wait structure", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url, tuning)
      const lock = yield* Lock.make("commands-uncontended").pipe(withBackend(backend))
      for (let i = 0; i < 20; i++) yield* Lock.withLock(Effect.void, lock)
      yield* call(raw, "CONFIG", "RESETSTAT")
      const cycles = 200
      for (let i = 0; i < cycles; i++) yield* Lock.withLock(Effect.void, lock)
      const calls = commandCalls(String(yield* call(raw, "INFO", "commandstats")))
      const perCycle = total(calls) / cycles
      console.log(
        `[commands] uncontended lock + unlock: ${perCycle} commands per cycle (${
          [...calls].map(([c, n]) => `${c}=${n / cycles}`).join(" ")
        })`
      )
      assert.isAtMost(perCycle, 9)
      const waitStructures = [...calls.keys()].filter((c) => /^(z|l|r)/.test(c) || c === "pttl" || c === "hget")
      assert.deepStrictEqual(waitStructures, [], "an uncontended cycle touched a queue or waiter set")
    }))

  it.scopedLive("a fair-queue operation does not read per-waiter state: its commands do not grow with the queue", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url, tuning)
      const request = (key: string, holder: string, count = 1): AcquireRequest => ({
        key,
        holder,
        mode: "exclusive",
        permits: 1,
        limit: 1,
        leaseMs: 60_000,
        fair: true,
        waiterTtlMs: 60_000,
        count
      })
      /** The commands of one heartbeat of a waiter in the middle of a queue of `n`. */
      const heartbeat = (n: number) =>
        Effect.gen(function*() {
          const key = `commands-fair-${n}`
          const first = yield* backend.acquire(request(key, `${backend.clientId}:holder`))
          assert.strictEqual(first._tag, "Granted")
          for (let i = 0; i < n; i++) {
            const queued = yield* backend.acquire(request(key, `${backend.clientId}:w${i}`))
            assert.strictEqual(queued._tag, "Denied")
          }
          assert.strictEqual((yield* backend.inspect(key)).queue.length, n)
          // a heartbeat renews the waiters' sentinel (SET) only once its PTTL has fallen below the
          // waiter TTL: let a few milliseconds pass, so that both queues take that same path
          yield* Effect.sleep("5 millis")
          yield* call(raw, "CONFIG", "RESETSTAT")
          const again = yield* backend.acquire(request(key, `${backend.clientId}:w${Math.floor(n / 2)}`))
          assert.strictEqual(again._tag, "Denied")
          return commandCalls(String(yield* call(raw, "INFO", "commandstats")))
        })
      const small = yield* heartbeat(10)
      const large = yield* heartbeat(1_000)
      console.log(
        `[commands] fair heartbeat: ${total(small)} commands with 10 waiters, ${total(large)} with 1,000 (${
          [...large].map(([c, n]) => `${c}=${n}`).join(" ")
        })`
      )
      assert.deepStrictEqual(Object.fromEntries(large), Object.fromEntries(small))
      assert.isFalse(large.has("hget") || large.has("lrange"), "a fair operation read per-waiter state")
    }))

  it.scopedLive("a 1-permit semaphore release wakes one waiter: a few acquire calls per grant, not one per waiter", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const { counts, service } = counting(yield* backendOn(server.url, tuning))
      const sem = yield* Semaphore.make("commands-semaphore", { limit: 1 }).pipe(withBackend(service))
      const n = 30
      // grants counted where they are used: a release hands the permit over without an acquire
      let grants = 0
      yield* Effect.forEach(
        Array.from({ length: n }),
        () => Semaphore.withPermits(Effect.zipRight(Effect.sync(() => grants++), Effect.sleep("2 millis")), sem, { timeout: "60 seconds" }),
        { concurrency: "unbounded", discard: true }
      )
      const perGrant = counts.acquire / grants
      console.log(
        `[commands] ${n} fibers on a 1-permit semaphore: ${counts.acquire} acquire calls for ${grants} grants (${counts.granted} answered by an acquire, the others handed over)`
      )
      assert.strictEqual(grants, n)
      // each waiter: a first attempt, one once subscribed, one when woken (plus a few lost races);
      // waking every shared waiter on each release would cost about n / 2 per grant
      assert.isAtMost(perGrant, 5)
    }))

  it.scopedLive("a release wakes one of the waiters of 7 other backends, not one per backend", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const key = "commands-backends"
      const holderLock = yield* Lock.make(key, { lease: "30 seconds" }).pipe(withBackend(yield* backendOn(server.url, tuning)))
      const waiters = yield* Effect.forEach(Array.from({ length: 7 }), () => Effect.map(backendOn(server.url, tuning), counting))
      const release = yield* Deferred.make<void>()
      const holding = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(
        Lock.withLock(Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(release)), holderLock)
      )
      yield* Deferred.await(holding)
      const done = yield* Deferred.make<void>()
      let grants = 0
      const fibers = yield* Effect.forEach(waiters, ({ service }) =>
        Effect.fork(Effect.gen(function*() {
          // no retry of its own within the test: only a wake-up makes a waiter try again
          const lock = yield* Lock.make(key, { lease: "30 seconds", waiterTimeout: "60 seconds" }).pipe(withBackend(service))
          yield* Lock.withLock(
            Effect.zipRight(Effect.sync(() => grants++), Deferred.await(done)),
            lock,
            { timeout: "60 seconds" }
          )
        })))
      // every waiter has subscribed and been denied once more: it is registered
      yield* eventually("every waiter registered", Effect.sync(() => waiters.every((w) => w.counts.acquire >= 2)), 10_000)
      const before = waiters.reduce((sum, w) => sum + w.counts.acquire, 0)
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(holder)
      yield* eventually("a waiter granted", Effect.sync(() => grants === 1), 5_000)
      // the lease is 30 s and the waiters' own retry a minute: only a wake-up makes one try again
      yield* Effect.sleep(300)
      const after = waiters.reduce((sum, w) => sum + w.counts.acquire, 0) - before
      console.log(`[commands] one release, 7 waiting backends: ${after} acquire call(s) followed`)
      assert.strictEqual(grants, 1)
      // the release handed the lock to one waiter, which holds it without an acquire of its own,
      // and woke no other
      assert.strictEqual(after, 0, "the release woke a waiter it did not hand the lock to")
      yield* Deferred.succeed(done, undefined)
      yield* Effect.forEach(fibers, Fiber.join)
    }))

  it.scopedLive("a waiter that gives up after a release chose it hands the wake-up on to the next waiter", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const [b0, b1, b2] = yield* Effect.forEach([0, 1, 2], () => backendOn(server.url, tuning))
      const key = "commands-abandon"
      const request = (backend: Service, n: string, count = 1): AcquireRequest => ({
        key,
        holder: `${backend.clientId}:${n}`,
        mode: "exclusive",
        permits: 1,
        limit: 1,
        leaseMs: 30_000,
        fair: false,
        waiterTtlMs: 5_000,
        count
      })
      assert.strictEqual((yield* b0!.acquire(request(b0!, "h")))._tag, "Granted")
      // w1 waits on a subscription and registers
      const scope1 = yield* Scope.make()
      const sub1 = yield* b1!.subscribe(key, request(b1!, "w1").holder, "exclusive").pipe(Scope.extend(scope1))
      assert.strictEqual((yield* b1!.acquire(request(b1!, "w1")))._tag, "Denied")
      // the holder's lease moves on, so w2 registers behind w1
      yield* Effect.sleep(20)
      assert.strictEqual((yield* b0!.acquire(request(b0!, "h", 2)))._tag, "Granted")
      const sub2 = yield* b2!.subscribe(key, request(b2!, "w2").holder, "exclusive")
      assert.strictEqual((yield* b2!.acquire(request(b2!, "w2")))._tag, "Denied")
      const woken2 = yield* Effect.fork(sub2.await)
      // the release chooses w1 ...
      yield* b0!.release({ key, holder: request(b0!, "h").holder, mode: "exclusive", count: 2, leaseMs: 30_000 })
      yield* b0!.release({ key, holder: request(b0!, "h").holder, mode: "exclusive", count: 1, leaseMs: 30_000 })
      yield* sub1.await.pipe(Effect.timeout("5 seconds"))
      // ... which gives up without trying: the wake-up goes on to w2 (the holder's lease was 30 s)
      yield* Scope.close(scope1, Exit.fail("gave up"))
      yield* Fiber.join(woken2).pipe(Effect.timeout("5 seconds"))
      assert.strictEqual((yield* b2!.acquire(request(b2!, "w2")))._tag, "Granted")
    }))
})
