/**
 * A Redis that may evict keys, on real redis-servers: every eviction policy is refused at build
 * with a message naming the server, the policy and the ways out; a policy changed at run time
 * refuses new grants within a renewal period; with `acceptEviction` an evicted lock is reported
 * (a log line and a metric) and its holder learns of the loss; and with `noeviction` under memory
 * pressure a new grant fails clearly with nothing written, while held leases are renewed and
 * released.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Duration, Effect, Either, Exit, Fiber, Layer, Logger, Metric, Option, Scope } from "effect"
import type { Redis } from "ioredis"
import { Lock, Semaphore } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import {
  call,
  eventually,
  nowMs,
  rawClient,
  retryWhileReconnecting,
  runnable,
  warnIfNotRun,
  withBackend
} from "./fixtures/realRedis.js"

warnIfNotRun("Redis eviction suite (eviction.test.ts)")

const POLICIES = [
  "allkeys-lru",
  "allkeys-lfu",
  "allkeys-random",
  "volatile-lru",
  "volatile-lfu",
  "volatile-random",
  "volatile-ttl"
] as const

const tuning: RedisBackend.Tuning = { commandTimeout: "2 seconds" }

const build = (layer: Layer.Layer<LockBackend, BackendError>): Effect.Effect<Service, BackendError, Scope.Scope> =>
  Effect.map(Layer.build(layer), Context.get(LockBackend))

/** Runs `effect` with a logger that records every message into `into`. */
const capturingLogs = (into: Array<string>) =>
  Effect.provide(Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ logLevel, message }) => {
      into.push(`${logLevel.label} ${(Array.isArray(message) ? message : [message]).map(String).join(" ")}`)
    })
  ))

/**
 * Writes keys of `size` bytes with a TTL until `done` says so or the server refuses one (OOM):
 * bounded by `max` writes. Returns how many were written and whether the server refused one.
 */
const fill = (raw: Redis, prefix: string, done: Effect.Effect<boolean>, max: number, size = 8192) =>
  Effect.gen(function*() {
    const value = "x".repeat(size)
    for (let i = 0; i < max; i += 50) {
      const replies = yield* Effect.promise(() => {
        const pipeline = raw.pipeline()
        for (let j = i; j < i + 50; j++) pipeline.set(`${prefix}${j}`, value, "PX", 600_000)
        return pipeline.exec()
      })
      if (replies?.some(([error]) => error !== null)) return { written: i, refused: true }
      if (yield* done) return { written: i + 50, refused: false }
    }
    return { written: max, refused: false }
  })

describe.runIf(runnable)("Redis backend on a server that may evict keys", () => {
  it.scopedLive("every eviction policy with a maxmemory is refused at build, naming the server, the policy and the ways out", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--maxmemory", "64mb"] })
      const raw = yield* rawClient(server.url)
      const where = `127.0.0.1:${server.port}`
      for (const policy of POLICIES) {
        yield* call(raw, "CONFIG", "SET", "maxmemory-policy", policy)
        const refused = yield* Effect.flip(Effect.scoped(build(RedisBackend.layerFrom(server.url, tuning))))
        assert.strictEqual(refused.operation, "connect")
        assert.instanceOf(refused.cause, RedisBackend.EvictionRisk)
        assert.include(refused.message, where)
        assert.include(refused.message, `maxmemory-policy ${policy}`)
        assert.include(refused.message, "set maxmemory-policy noeviction")
        assert.include(refused.message, "a Redis of their own")
        assert.include(refused.message, "acceptEviction")
        // a client of the user's own is refused as well
        const client = yield* rawClient(server.url)
        const borrowed = yield* Effect.flip(Effect.scoped(build(RedisBackend.layer({ client, ...tuning }))))
        assert.instanceOf(borrowed.cause, RedisBackend.EvictionRisk, borrowed.message)
        if (policy === "volatile-lru") console.log(`[eviction] refused: ${refused.message}`)
      }
      // noeviction with a maxmemory, and any policy without one, can evict nothing
      yield* call(raw, "CONFIG", "SET", "maxmemory-policy", "noeviction")
      yield* Effect.scoped(build(RedisBackend.layerFrom(server.url, tuning)))
      yield* call(raw, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
      yield* call(raw, "CONFIG", "SET", "maxmemory", "0")
      yield* Effect.scoped(build(RedisBackend.layerFrom(server.url, tuning)))
    }), 60_000)

  it.scopedLive("on a Redis Cluster every master is read: one that may evict is named", () =>
    Effect.gen(function*() {
      const cluster = yield* RedisServer.makeCluster({ masters: 3 })
      const startupNodes = cluster.startupNodes.map((node) => ({ host: node.host, port: node.port }))
      yield* Effect.scoped(build(RedisBackend.layerFrom({ cluster: startupNodes }, tuning)))
      const raw = yield* rawClient(cluster.nodes[2]!.url)
      yield* call(raw, "CONFIG", "SET", "maxmemory", "64mb")
      yield* call(raw, "CONFIG", "SET", "maxmemory-policy", "allkeys-lfu")
      const refused = yield* Effect.flip(Effect.scoped(build(RedisBackend.layerFrom({ cluster: startupNodes }, tuning))))
      assert.instanceOf(refused.cause, RedisBackend.EvictionRisk, refused.message)
      assert.include(refused.message, `Redis 127.0.0.1:${cluster.nodes[2]!.port} may evict lock keys`)
      assert.include(refused.message, "maxmemory-policy allkeys-lfu")
    }), 60_000)

  it.scopedLive("after a reconnection the policy is read again before the next grant", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"] })
      const raw = yield* rawClient(server.url)
      const backend = yield* build(RedisBackend.layerFrom(server.url, tuning))
      const lock = yield* Lock.make("evict:reconnect").pipe(withBackend(backend))
      yield* Effect.scoped(Lock.acquire(lock))
      // a reconfigured server behind a new connection (a failover looks the same to the client),
      // well within the second a reading stays fresh
      yield* call(raw, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
      yield* call(raw, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
      // a read (which no eviction check holds back) answers once the backend has reconnected
      yield* retryWhileReconnecting(Lock.isLocked(lock))
      const refused = yield* Effect.flip(Effect.scoped(Lock.acquire(lock, { timeout: "5 seconds" })))
      assert.strictEqual(refused._tag, "BackendError")
      if (refused._tag === "BackendError") assert.instanceOf(refused.cause, RedisBackend.EvictionRisk, refused.message)
    }), 60_000)

  it.scopedLive("a policy changed at run time refuses new grants within a renewal period; held leases go on", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"] })
      const raw = yield* rawClient(server.url)
      const backend = yield* build(RedisBackend.layerFrom(server.url, tuning))
      // renewed every second
      const held = yield* Lock.make("evict:held", { watchdog: "3 seconds" }).pipe(withBackend(backend))
      const other = yield* Lock.make("evict:other", { watchdog: "3 seconds" }).pipe(withBackend(backend))
      const lease = yield* Lock.acquire(held)
      yield* Effect.scoped(Lock.acquire(other))

      yield* call(raw, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
      const changedAt = nowMs()
      // no acquisition in between: the renewals alone read the new policy
      yield* Effect.sleep("3 seconds")
      const refused = yield* Effect.flip(Effect.scoped(Lock.acquire(other)))
      assert.strictEqual(refused._tag, "BackendError")
      if (refused._tag === "BackendError") {
        assert.strictEqual(refused.operation, "acquire")
        assert.instanceOf(refused.cause, RedisBackend.EvictionRisk)
      }
      assert.isFalse(yield* Lock.isLocked(other), "the refused acquisition wrote nothing")
      assert.strictEqual(yield* lease.state, "Held", "the held lease is kept and renewed")
      console.log(`[eviction] a run-time change refused a grant ${Math.round(nowMs() - changedAt)} ms after CONFIG SET: ${refused.message}`)

      // back to noeviction: grants go on once the policy was read again
      yield* call(raw, "CONFIG", "SET", "maxmemory-policy", "noeviction")
      yield* eventually("a grant after noeviction is back", Effect.map(Effect.either(Effect.scoped(Lock.acquire(other))), Either.isRight), 5_000, 200)
    }), 60_000)

  it.scopedLive("with acceptEviction: an evicted lock is logged and counted, and its holder learns of the loss", () =>
    Effect.gen(function*() {
      const logs: Array<string> = []
      yield* Effect.gen(function*() {
        const server = yield* RedisServer.make({ args: ["--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru"] })
        const raw = yield* rawClient(server.url)
        const accepting: RedisBackend.Tuning = { ...tuning, acceptEviction: true }
        const a = yield* build(RedisBackend.layerFrom(server.url, accepting))
        const b = yield* build(RedisBackend.layerFrom(server.url, accepting))
        assert.isTrue(logs.some((line) => line.includes("may evict lock keys") && line.includes("volatile-lru")), logs.join("\n"))

        const lockA = yield* Lock.make("evict:victim", { watchdog: "3 seconds" }).pipe(withBackend(a))
        const lockB = yield* Lock.make("evict:victim", { watchdog: "3 seconds" }).pipe(withBackend(b))
        const leaseA = yield* Lock.acquire(lockA)
        const lostA = yield* Effect.fork(Effect.either(leaseA.lost))
        const counter = Metric.tagged(RedisBackend.evictedKeys, "server", `127.0.0.1:${server.port}`)
        const before = (yield* Metric.value(counter)).count

        // other data with a TTL fills the memory until Redis evicts the lock's key
        const gone = Effect.map(Effect.promise(() => raw.exists("evict:victim")), (n) => n === 0)
        const filled = yield* fill(raw, "cache:", gone, 20_000)
        assert.isTrue(yield* gone, `the lock's key was not evicted after ${filled.written} writes`)

        // the double grant the option accepts: B is granted while A believes it holds
        const granted = yield* Effect.scoped(Effect.map(Lock.tryAcquire(lockB), Option.map((lease) => lease.fence)))
        assert.isTrue(Option.isSome(granted))
        if (Option.isSome(granted)) assert.isAbove(granted.value, leaseA.fence)

        // A learns at its next renewal (every second)
        const lost = yield* Fiber.join(lostA).pipe(Effect.timeout("5 seconds"))
        assert.isTrue(Either.isLeft(lost))
        if (Either.isLeft(lost)) assert.strictEqual(lost.left.reason, "NotHeld")

        // the next reading (at most a second later, as renewals and acquisitions come by) reports it
        yield* eventually(
          "the eviction log line",
          Effect.sync(() => logs.some((line) => / evicted \d+ keys? /.test(line))),
          5_000,
          100
        ).pipe(Effect.onInterrupt(() => Effect.sync(() => console.log(logs.join("\n")))), Effect.tapDefect(() => Effect.sync(() => console.log(logs.join("\n")))))
        const after = (yield* Metric.value(counter)).count
        assert.isAbove(after, before)
        const line = logs.find((l) => / evicted \d+ keys? /.test(l))!
        console.log(`[eviction] acceptEviction: log "${line}"; lockstep_redis_evicted_keys_total{server=127.0.0.1:${server.port}} ${before} -> ${after}`)
      }).pipe(capturingLogs(logs))
    }), 60_000)

  it.scopedLive("noeviction under memory pressure: a new grant fails clearly and writes nothing; held leases are renewed and released", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"] })
      const raw = yield* rawClient(server.url)
      const backend = yield* build(RedisBackend.layerFrom(server.url, tuning))
      // renewed every 500 ms: an exclusive hold and a shared one
      const lock = yield* Lock.make("oom:held", { watchdog: "1500 millis" }).pipe(withBackend(backend))
      const semaphore = yield* Semaphore.make("oom:permits", { limit: 3, watchdog: "1500 millis" }).pipe(withBackend(backend))
      const lockScope = yield* Scope.make()
      const lease = yield* Scope.extend(Lock.acquire(lock), lockScope)
      // a hold re-entered at the backend: its first release only counts down, a write that a full
      // server refuses when it comes first
      const request = {
        key: "oom:counted",
        holder: `${backend.clientId}:reentered`,
        mode: "exclusive",
        permits: 1,
        limit: 1,
        leaseMs: 30_000,
        fair: false,
        waiterTtlMs: 5_000
      } as const
      yield* backend.acquire({ ...request, count: 1 })
      yield* backend.acquire({ ...request, count: 2 })
      const permits = yield* Semaphore.acquire(semaphore, { permits: 2 })

      // some data, then a maxmemory below what the server uses: every write that may grow memory
      // is refused from now on, whatever the buffers of the moment take
      yield* fill(raw, "filler:", Effect.succeed(false), 200)
      const used = Number(/used_memory:(\d+)/.exec(String(yield* call(raw, "INFO", "memory")))![1])
      yield* call(raw, "CONFIG", "SET", "maxmemory", String(Math.floor(used / 2)))
      const refusedWrite = yield* Effect.flip(Effect.tryPromise(() => raw.set("probe", "1")))
      assert.include(String(refusedWrite.error), "OOM")

      const fresh = yield* Lock.make("oom:fresh").pipe(withBackend(backend))
      const refused = yield* Effect.flip(Effect.scoped(Lock.acquire(fresh)))
      assert.strictEqual(refused._tag, "BackendError")
      assert.include(refused.message, "OOM")
      assert.include(refused.message, "out of memory")
      console.log(`[eviction] noeviction, out of memory: ${refused.message}`)
      // no hold, no fence: only the marker of the attempt's clean-up (a holder that ended, so that
      // a late copy of the attempt grants nothing)
      const written = yield* Effect.promise(() => raw.keys("*oom:fresh*"))
      assert.deepStrictEqual(written.filter((k) => !k.startsWith("lockstep_ended:")), [], "the refused grant left keys behind")
      assert.isFalse(yield* Lock.isLocked(fresh))

      // four renewal periods at full memory: both holds are kept
      yield* Effect.sleep("2 seconds")
      assert.strictEqual(yield* lease.state, "Held")
      assert.strictEqual(yield* permits.state, "Held")
      assert.isAbove(Duration.toMillis(yield* lease.expiresIn), 500)

      // and released
      assert.strictEqual(yield* backend.release({ ...request, count: 2 }), 1)
      assert.strictEqual(yield* backend.release({ ...request, count: 1 }), 0)
      yield* Effect.exit(Scope.close(lockScope, Exit.void))
      assert.isFalse(yield* Lock.isLocked(lock), "the release went through at full memory")
    }), 60_000)
})
