/**
 * Scale of the Redis backend on a real redis-server: 1,000 fibers of one process waiting on one
 * lock (one subscriber connection, every waiter granted exactly once, nothing left subscribed),
 * and 10,000 watchdog leases held by one process (renewals cost a few scripts per period, not one
 * per lease). Each test starts its own server on a free loopback port (never the shared 6379).
 * The numbers measured are printed (`[scale] ...`) so they can be quoted.
 */
import { assert, describe, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Exit, Fiber, Scope } from "effect"
import { Lock } from "@lockstep/core"
import type { Lease } from "@lockstep/core/Lease"
import type { Service } from "@lockstep/core/LockBackend"
import { History } from "@lockstep/testkit"
import { RedisServer } from "@lockstep/servers"
import { backendOn, call, eventually, instrumentCalls, nowMs, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis scale suite (scale.test.ts)")

/** The clients of `CLIENT LIST` in pub/sub mode (flag P, or any channel / pattern / shard subscription). */
const pubSubClients = (clientList: string): ReadonlyArray<string> =>
  clientList.split("\n").filter((line) => {
    if (line.trim() === "") return false
    const field = (name: string) => new RegExp(`(?:^| )${name}=(\\S*)`).exec(line)?.[1] ?? ""
    return field("flags").includes("P") || Number(field("sub")) > 0 || Number(field("psub")) > 0 ||
      Number(field("ssub")) > 0
  })

const statCalls = (info: string, command: string): number =>
  Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, "m").exec(info)?.[1] ?? 0)

describe.runIf(runnable)("Redis backend at scale on a real redis-server", () => {
  it("redis-server can be executed", () => {
    assert.isTrue(runnable)
  })

  it.scopedLive("1,000 fibers wait on one lock: one pub/sub connection, each granted exactly once, no subscription left", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const history = yield* History.make
      const recorded = instrumentCalls(History.instrument(history, yield* backendOn(server.url, { commandTimeout: "5 seconds" })))
      const key = "scale-waiters"
      const channel = `redisson_lock__channel:{${key}}`
      const lock = yield* Lock.make(key, { watchdog: "10 seconds" }).pipe(withBackend(recorded.service))

      // the first holder runs in a fiber of its own, so that the waiters (forked from this fiber)
      // do not inherit its hold and re-enter
      const go = yield* Deferred.make<void>()
      const holding = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(Lock.withLock(lock)(Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(go))))
      yield* Deferred.await(holding)

      const n = 1_000
      const order: Array<number> = []
      const waiters = yield* Effect.forEach(
        Array.from({ length: n }, (_, i) => i),
        (i) =>
          Effect.fork(Lock.withLock(lock, { timeout: "60 seconds" })(Effect.sync(() => {
            order.push(i)
          }))),
        { concurrency: "unbounded" }
      )
      yield* eventually(`${n} open subscriptions`, Effect.sync(() => recorded.openSubscriptions() === n), 30_000)

      const clientList = String(yield* call(raw, "CLIENT", "LIST"))
      const subscribed = pubSubClients(clientList)
      const connections = clientList.split("\n").filter((l) => l.trim() !== "").length
      const numsubWaiting = (yield* call(raw, "PUBSUB", "NUMSUB", channel)) as [string, number]
      const grantsBefore = (yield* history.events).filter((e) => e._tag === "Grant").length

      const releasedAt = nowMs()
      yield* Deferred.succeed(go, undefined)
      yield* Fiber.join(holder)
      const exits = yield* Effect.forEach(waiters, Fiber.await)
      const allGrantedMs = nowMs() - releasedAt
      const failed = exits.filter(Exit.isFailure)
      yield* eventually(
        "PUBSUB NUMSUB to drop to 0",
        Effect.map(call(raw, "PUBSUB", "NUMSUB", channel), (r) => Number((r as [string, number])[1]) === 0),
        5_000
      )
      const numsubAfter = (yield* call(raw, "PUBSUB", "NUMSUB", channel)) as [string, number]
      const events = yield* history.events
      const grants = events.filter((e) => e._tag === "Grant")
      const perHolder = new Map<string, number>()
      for (const g of grants) perHolder.set(g.holder, (perHolder.get(g.holder) ?? 0) + 1)
      const acquireCalls = recorded.calls.filter((c) => c.op === "acquire").length
      console.log(
        `[scale] ${n} waiters on one lock: ${subscribed.length} pub/sub connection(s) of ${connections} clients ` +
          `(incl. this probe) while waiting; PUBSUB NUMSUB ${numsubWaiting[1]} while waiting, ${numsubAfter[1]} after; ` +
          `all ${n} granted ${allGrantedMs.toFixed(0)} ms after the first release ` +
          `(${(allGrantedMs / n).toFixed(2)} ms per handoff); ${acquireCalls} acquire scripts in all ` +
          `(${((acquireCalls - 2 * n) / n).toFixed(2)} per waiter beyond the first two)`
      )

      assert.strictEqual(grantsBefore, 1, "only the first holder was granted while it held the lock")
      assert.strictEqual(subscribed.length, 1, `pub/sub connections:\n${subscribed.join("\n")}`)
      // the backend's command connection, its subscriber connection, and this probe
      assert.strictEqual(connections, 3, clientList)
      assert.strictEqual(Number(numsubWaiting[1]), 1)
      assert.deepStrictEqual(failed, [])
      assert.strictEqual(new Set(order).size, n)
      assert.strictEqual(order.length, n)
      assert.strictEqual(grants.length, n + 1)
      assert.strictEqual(perHolder.size, n + 1, "each waiter is its own holder")
      assert.isTrue([...perHolder.values()].every((c) => c === 1), "each holder was granted exactly once")
      yield* history.assertValid
      const end = yield* recorded.service.inspect(key)
      assert.deepStrictEqual(end.holders, [])
    }), 120_000)

  // The keeper renews the leases that are due together, and the backend sends them as a few scripts
  // (one per batch and cluster slot): 10,000 leases renewed every 2 s are taken within the budget,
  // cost a few scripts per period, and none is lost.
  it.scopedLive("10,000 watchdog leases held by one process: renewals cost a few scripts per period", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const base = yield* backendOn(server.url, { commandTimeout: "5 seconds" })
      let renewed = 0
      let renewCalls = 0
      const backend: Service = {
        ...base,
        renew: (requests) =>
          Effect.tap(base.renew(requests), (results) =>
            Effect.sync(() => {
              renewCalls++
              renewed += results.filter((r) => r).length
            }))
      }
      const n = 10_000
      // renewals every 2 s: 5,000 a second, a load a loaded 2-core CI machine sustains with room to spare
      const watchdogMs = 6_000
      const periodMs = watchdogMs / 3
      const keys = Array.from({ length: n }, (_, i) => `scale-lease-${i}`)
      const locks = yield* Effect.forEach(keys, (key) => Lock.make(key, { watchdog: `${watchdogMs} millis` }).pipe(withBackend(backend)))

      // 50 workers take 200 leases each, one after the other, and hold them until told to let go
      const workers = 50
      const release = yield* Deferred.make<void>()
      const heapBefore = process.memoryUsage().heapUsed
      const startedAt = nowMs()
      const taken = yield* Effect.forEach(Array.from({ length: workers }, (_, w) => w), (w) =>
        Effect.gen(function*() {
          const got = yield* Deferred.make<ReadonlyArray<Lease>, unknown>()
          const mine = locks.filter((_, i) => i % workers === w)
          const fiber = yield* Effect.fork(
            Effect.scoped(Effect.gen(function*() {
              yield* Deferred.succeed(got, yield* Effect.forEach(mine, (lock) => Lock.acquire(lock)))
              yield* Deferred.await(release)
            })).pipe(Effect.onError((cause) => Deferred.failCause(got, cause)))
          )
          return { got, fiber }
        }))
      // on this 2-core machine this takes a few seconds; far longer means the process is
      // saturated (by then the watchdogs cannot keep up and leases are being lost)
      const leases = (yield* Effect.forEach(taken, ({ got }) => Deferred.await(got)).pipe(
        Effect.timeoutFail({
          duration: "20 seconds",
          onTimeout: () =>
            new Error(
              `acquiring ${n} leases took over 20 s (${renewCalls} renew calls so far): the process is saturated`
            )
        })
      )).flat()
      const acquiredMs = nowMs() - startedAt
      const heapPerLease = (process.memoryUsage().heapUsed - heapBefore) / n
      assert.strictEqual(leases.length, n)
      const leaseScope = yield* Scope.make()
      let lost = 0
      yield* Effect.forEach(leases, (lease) =>
        Effect.forkIn(
          Effect.catchAll(lease.lost, () =>
            Effect.sync(() => {
              lost++
            })),
          leaseScope
        ), { discard: true })

      // let the renewals settle on their schedule, then count scripts over two periods
      yield* Effect.sleep(periodMs)
      yield* call(raw, "CONFIG", "RESETSTAT")
      const renewedBefore = renewed
      const measureFrom = nowMs()
      yield* Effect.sleep(2 * periodMs)
      const info = String(yield* call(raw, "INFO", "commandstats"))
      const periods = (nowMs() - measureFrom) / periodMs
      const scripts = statCalls(info, "evalsha") + statCalls(info, "eval") + statCalls(info, "fcall")
      const scriptsPerPeriod = scripts / periods
      const renewalsPerPeriod = (renewed - renewedBefore) / periods

      // every lock key is still there, with a lease ahead of it: more than a watchdog has passed
      // since the first grants, so each was renewed
      const pipeline = raw.pipeline()
      for (const key of keys) pipeline.pttl(key)
      const ttls = ((yield* Effect.promise(() => pipeline.exec())) ?? []).map(([, ttl]) => Number(ttl))
      const held = ttls.filter((ttl) => ttl > 0).length
      const sinceFirstGrant = nowMs() - startedAt

      const releaseFrom = nowMs()
      yield* Scope.close(leaseScope, Exit.void)
      yield* Deferred.succeed(release, undefined)
      yield* Effect.forEach(taken, ({ fiber }) => Fiber.join(fiber), { discard: true })
      const releasedMs = nowMs() - releaseFrom
      const exists = raw.pipeline()
      for (const key of keys) exists.exists(key)
      const left = ((yield* Effect.promise(() => exists.exec())) ?? []).filter(([, e]) => Number(e) === 1).length

      console.log(
        `[scale] ${n} leases (watchdog ${watchdogMs} ms, renewal period ${periodMs} ms): acquired in ${
          acquiredMs.toFixed(0)
        } ms (50 workers), heap growth ~${(heapPerLease / 1024).toFixed(1)} KiB per lease (no forced GC); over ${periods.toFixed(2)} periods: ${scripts} scripts ` +
          `(EVALSHA/EVAL) = ${scriptsPerPeriod.toFixed(1)} round trips per period for ${renewalsPerPeriod.toFixed(0)} renewals per period ` +
          `(${renewCalls} renew calls from the watchdogs in all); ${held}/${n} keys held ${(sinceFirstGrant / 1000).toFixed(1)} s after the first grant; ` +
          `${lost} lost; released in ${releasedMs.toFixed(0)} ms, ${left} keys left`
      )
      assert.isAbove(sinceFirstGrant, watchdogMs, "measured past the first leases' end")
      assert.strictEqual(lost, 0, "no lease was lost")
      assert.strictEqual(held, n, "every lease is still held on the server")
      // every lease renews about once per period (watchdog / 3)...
      assert.isAbove(renewalsPerPeriod, 0.7 * n)
      // ...in a few scripts: at most 1,000 renewals per script (renewBatchSize), and the grid
      // schedule of the watchdogs gathers them; one script per lease would be ~10,000
      assert.isAtMost(scriptsPerPeriod, 40, `${scriptsPerPeriod} scripts per renewal period`)
      assert.strictEqual(left, 0, "every lock key was deleted by the releases")
    }), 180_000)

  // The command timeout bounds a connection's silence, not a call's wait in line: with every
  // acquisition started at once, the last replies are read long after the timeout (the client
  // works through the ones before them), yet the server answered each at once.
  it.scopedLive("5,000 acquisitions of distinct keys at once, with a command timeout shorter than the burst: all granted, all released", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url, { commandTimeout: "150 millis" })
      const n = 5_000
      const keys = Array.from({ length: n }, (_, i) => `scale-burst:${i}`)
      const locks = yield* Effect.forEach(keys, (key) => Lock.make(key).pipe(withBackend(backend)))
      const scope = yield* Scope.make()
      const started = nowMs()
      const exits = yield* Effect.forEach(locks, (lock) => Effect.exit(Scope.extend(Lock.acquire(lock), scope)), {
        concurrency: "unbounded"
      })
      const tookMs = nowMs() - started
      const failed = exits.filter(Exit.isFailure)
      const held = Number(yield* call(raw, "EXISTS", ...keys))
      yield* Scope.close(scope, Exit.void)
      const left = Number(yield* call(raw, "EXISTS", ...keys))
      console.log(`[scale] burst of ${n} acquisitions (command timeout 150 ms): ${tookMs.toFixed(0)} ms, ${failed.length} failed, ${held} held, ${left} left after the release`)
      assert.isAbove(tookMs, 150, "the burst outlasts the command timeout, or it tests nothing")
      assert.deepStrictEqual(failed.slice(0, 3).map((exit) => String(Cause.squash(exit.cause))), [])
      assert.strictEqual(held, n)
      assert.strictEqual(left, 0)
    }), 120_000)
})
