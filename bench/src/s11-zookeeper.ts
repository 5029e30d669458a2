/**
 * Scenario 11: lockstep's Lock on the ZooKeeper backend next to the Redis backend, measured the
 * same way in the same run, in this process:
 * - uncontended: one worker's lock+unlock cycles on one key (cycles/s, client CPU per cycle);
 * - contended: 8 workers on one key, in two backends of four each (as two processes: a release in
 *   one wakes the other's waiters through a ZooKeeper watch or Redis pub/sub), each critical
 *   section a 1 ms timer (grants/s, p50 and max wait).
 * Every backend is wrapped to count its `acquire` calls and their grants; ZooKeeper's requests
 * are counted at the server (the `Received` figure of the four-letter word `srvr`, before and
 * after each measured window). The ZooKeeper servers are the scenario's own (`ZooKeeperServer.make()`
 * from `@lockstep/servers`: standalone, on a free loopback port), stopped at the end: one with
 * ZooKeeper's defaults (every write fsynced to its transaction log before it is answered), one with
 * `forceSync=no` (no fsync, as the bench's redis-server runs without persistence). Without java or
 * ZooKeeper the scenario is reported as not run.
 */
import * as net from "node:net"
import type { Scope } from "effect"
import { Console, Effect, Layer } from "effect"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import * as ZooKeeperServer from "@lockstep/servers/ZooKeeperServer"
import { ZooKeeperBackend } from "@lockstep/zookeeper"
import { summarize } from "./s2-contended.js"
import type { Env, Failures, Locker } from "./shared.js"
import {
  cpuMsSince,
  describeFailures,
  fmt,
  interleave,
  median,
  mergeFailures,
  now,
  percentile,
  printTable,
  ratio,
  runLoop
} from "./shared.js"

const workers = 8
const holdMs = 1

/** `acquire` calls of a side's backends. */
interface Calls {
  acquires: number
}

interface Side {
  readonly id: string
  readonly name: string
  /** A backend with a client of its own. */
  readonly backend: Layer.Layer<LockBackend, unknown>
  readonly calls: Calls
  /** ZooKeeper only: the requests the server has received so far, and what one such read adds. */
  readonly received?: { readonly read: Effect.Effect<number, Error>; readonly overhead: number } | undefined
}

/** The backend, its `acquire` calls counted in `calls`. */
const counted = (backend: Layer.Layer<LockBackend, unknown>, calls: Calls): Layer.Layer<LockBackend, unknown> =>
  Layer.effect(
    LockBackend,
    Effect.map(LockBackend, (service): Service => ({
      ...service,
      acquire: (request) =>
        Effect.suspend(() => {
          calls.acquires++
          return service.acquire(request)
        })
    }))
  ).pipe(Layer.provide(backend))

/** A four-letter word's answer (the server closes the connection once it has answered). */
const fourLetterWord = (port: number, word: string): Effect.Effect<string, Error> =>
  Effect.async<string, Error>((resume) => {
    const socket = net.createConnection({ host: "127.0.0.1", port })
    let received = ""
    let settled = false
    const settle = (effect: Effect.Effect<string, Error>) => {
      if (settled) return
      settled = true
      socket.destroy()
      resume(effect)
    }
    socket.on("connect", () => socket.write(word))
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString("utf8")
    })
    socket.on("error", (error) => settle(Effect.fail(new Error(`${word}: ${error.message}`))))
    socket.on("close", () => settle(Effect.succeed(received)))
    return Effect.sync(() => {
      settled = true
      socket.destroy()
    })
  }).pipe(Effect.timeoutFail({ duration: "5 seconds", onTimeout: () => new Error(`${word}: no answer within 5 s`) }))

/** `Received: N` of `srvr`: the requests the server has received since it started. */
const receivedRequests = (port: number): Effect.Effect<number, Error> =>
  Effect.flatMap(fourLetterWord(port, "srvr"), (text) => {
    const found = /^Received: *(\d+)/m.exec(text)?.[1]
    return found === undefined ? Effect.fail(new Error(`srvr: no Received line in ${JSON.stringify(text)}`)) : Effect.succeed(Number(found))
  })

/** A ZooKeeper server of the scenario's own, or why there is none. */
const zooKeeper = (
  extraConfig: Record<string, string>
): Effect.Effect<ZooKeeperServer.ZooKeeperServer | string, never, Scope.Scope> => Effect.gen(function*() {
  if (!(yield* ZooKeeperServer.available)) return "ZooKeeper is not available (no java, or no ZooKeeper installation: see ZooKeeperServer.installation)"
  const started = yield* Effect.either(ZooKeeperServer.make({ extraConfig }))
  if (started._tag === "Left") return `ZooKeeper did not start: ${started.left.message}`
  const server = started.right
  // should the process die without running finalizers, the server goes with it
  const pid = yield* server.pid
  if (pid._tag === "Some") {
    const serverPid = pid.value
    const kill = () => {
      try {
        process.kill(serverPid, "SIGKILL")
      } catch {
        // already gone
      }
    }
    process.once("exit", kill)
    yield* Effect.addFinalizer(() => Effect.sync(() => process.off("exit", kill)))
  }
  return server
})

/** `count` lockers on `key`, each its own Lock instance on one backend (built once, in the scope). */
const lockers = (side: Side, key: string, count: number): Effect.Effect<Array<Locker>, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const context = yield* Layer.build(counted(side.backend, side.calls))
    return yield* Effect.forEach(Array.from({ length: count }), () =>
      Effect.map(Effect.provide(Lock.make(key), context), (lock): Locker => ({
        withLock: <A, E>(body: Effect.Effect<A, E>) => Lock.withLock(body, lock)
      })))
  })

/** A ZooKeeper side: its server's `Received` count, and what reading it adds to it. */
const received = (server: ZooKeeperServer.ZooKeeperServer): Effect.Effect<NonNullable<Side["received"]>, Error> =>
  Effect.gen(function*() {
    const read = receivedRequests(server.port)
    // 0 if a four-letter word is not counted as a request
    const probes = [yield* read, yield* read, yield* read]
    return { read, overhead: Math.min(probes[1]! - probes[0]!, probes[2]! - probes[1]!) }
  })

/**
 * Runs `loop` and counts what it cost per grant (`grantsOf`: the critical sections it ran, each a
 * grant: a grant handed over by a release comes without an `acquire` call of the waiter's): the
 * `acquire` calls of the side's backends and, for ZooKeeper, the requests the server received
 * (less what the `srvr` read after it adds).
 */
const measured = <A, E>(side: Side, loop: Effect.Effect<A, E>, grantsOf: (result: A) => number) =>
  Effect.gen(function*() {
    const before = side.received === undefined ? NaN : yield* side.received.read
    const acquires = side.calls.acquires
    const result = yield* loop
    const after = side.received === undefined ? NaN : yield* side.received.read
    const granted = grantsOf(result)
    return {
      result,
      grants: granted,
      acquiresPerGrant: (side.calls.acquires - acquires) / Math.max(1, granted),
      requestsPerGrant: (after - before - (side.received?.overhead ?? 0)) / Math.max(1, granted)
    }
  })

interface Uncontended {
  readonly opsPerSec: number
  readonly cpuUsPerOp: number
  readonly acquiresPerGrant: number
  readonly requestsPerGrant: number
  readonly failures: Failures
}

interface Contended {
  readonly perSec: number
  readonly share: number
  readonly p50WaitMs: number
  readonly maxWaitMs: number
  readonly acquiresPerGrant: number
  readonly requestsPerGrant: number
  readonly failures: Failures
}

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 300 : 2000
    const warmupMs = env.smoke ? 200 : 1000
    const contendedWindowMs = env.smoke ? 500 : 3000
    const title = `11. ZooKeeper next to Redis: lockstep Lock, uncontended (1 worker) and contended (${workers} workers in 2 backends, ` +
      `${holdMs} ms hold) (${env.rounds} x ${windowMs} / ${contendedWindowMs} ms, median)`
    const servers = yield* Effect.all([zooKeeper({}), zooKeeper({ forceSync: "no" })], { concurrency: "unbounded" })
    const [synced, unsynced] = servers
    if (typeof synced === "string" || typeof unsynced === "string") {
      const reason = typeof synced === "string" ? synced : String(unsynced)
      yield* Console.log(`\n${title}\n  NOT RUN: ${reason}`)
      return { notRun: reason }
    }
    const version = /^Zookeeper version: *([^,\n-]+)/m.exec(yield* fourLetterWord(synced.port, "srvr"))?.[1]?.trim() ?? "?"
    const zooKeeperSide = (id: string, name: string, server: ZooKeeperServer.ZooKeeperServer) =>
      Effect.map(received(server), (counter): Side => ({
        id,
        name,
        backend: ZooKeeperBackend.layerFrom(server.connectionString, { namespace: `/lockstep-bench-${process.pid}` }),
        calls: { acquires: 0 },
        received: counter
      }))

    const all: ReadonlyArray<Side> = [
      { id: "redis", name: "Redis (the bench's redis-server)", backend: RedisBackend.layerFrom(env.url), calls: { acquires: 0 } },
      yield* zooKeeperSide("zookeeper", `ZooKeeper ${version}, fsync per write (its default)`, synced),
      yield* zooKeeperSide("zookeeper-nosync", `ZooKeeper ${version}, forceSync=no`, unsynced)
    ]
    const sides = yield* Effect.forEach(all, (side) =>
      Effect.gen(function*() {
        const [single] = yield* lockers(side, `s11:${side.id}:uncontended`, 1)
        const contended = [
          ...(yield* lockers(side, `s11:${side.id}:contended`, workers / 2)),
          ...(yield* lockers(side, `s11:${side.id}:contended`, workers / 2))
        ]
        return { side, single: single!, contended }
      }))

    const uncontended = yield* interleave(env.rounds, sides, ({ side, single }) =>
      Effect.gen(function*() {
        yield* runLoop(single, { holdMs: 0, endAt: now() + warmupMs })
        const cpu = process.cpuUsage()
        // the window starts once the counter has been read
        const { acquiresPerGrant, requestsPerGrant, result } = yield* measured(
          side,
          Effect.suspend(() => runLoop(single, { holdMs: 0, endAt: now() + windowMs })),
          (result) => result.count
        )
        const cpuMs = cpuMsSince(cpu)
        return {
          opsPerSec: (result.count / windowMs) * 1000,
          cpuUsPerOp: (cpuMs * 1000) / Math.max(1, result.count),
          acquiresPerGrant,
          requestsPerGrant,
          failures: result.failures
        } satisfies Uncontended
      }))
    const contended = yield* interleave(env.rounds, sides, ({ contended, side }) =>
      Effect.gen(function*() {
        const { acquiresPerGrant, requestsPerGrant, result } = yield* measured(
          side,
          Effect.suspend(() => {
            const endAt = now() + contendedWindowMs
            return Effect.forEach(contended, (locker) => runLoop(locker, { holdMs, endAt, trackWaits: true, keepWaits: true }), {
              concurrency: "unbounded"
            })
          }),
          (results) => results.reduce((sum, r) => sum + r.count, 0)
        )
        const summary = summarize(result, contendedWindowMs)
        return {
          perSec: summary.perSec,
          share: summary.share,
          p50WaitMs: percentile(result.flatMap((r) => r.waitsMs ?? []), 50),
          maxWaitMs: summary.maxWaitMs,
          acquiresPerGrant,
          requestsPerGrant,
          failures: summary.failures
        } satisfies Contended
      }))

    const rows = sides.map(({ side }, i) => {
      const u: ReadonlyArray<Uncontended> = uncontended[i]!
      const c: ReadonlyArray<Contended> = contended[i]!
      return {
        side: side.id,
        name: side.name,
        opsPerSec: median(u.map((s) => s.opsPerSec)),
        cpuUsPerOp: median(u.map((s) => s.cpuUsPerOp)),
        acquiresPerCycle: median(u.map((s) => s.acquiresPerGrant)),
        requestsPerCycle: median(u.map((s) => s.requestsPerGrant)),
        grantsPerSec: median(c.map((s) => s.perSec)),
        share: median(c.map((s) => s.share)),
        p50WaitMs: median(c.map((s) => s.p50WaitMs)),
        maxWaitMs: median(c.map((s) => s.maxWaitMs)),
        acquiresPerGrant: median(c.map((s) => s.acquiresPerGrant)),
        requestsPerGrant: median(c.map((s) => s.requestsPerGrant)),
        failures: mergeFailures([...u.map((s) => s.failures), ...c.map((s) => s.failures)])
      }
    })
    const redis = rows.find((r) => r.side === "redis")
    yield* printTable(
      title,
      [
        "backend",
        "ops/s",
        "vs Redis",
        "client CPU us/op",
        "requests/op",
        "contended grants/s",
        "vs Redis",
        "p50 wait ms",
        "max wait ms",
        "share min/max",
        "acquire calls/grant",
        "requests/grant",
        "failures"
      ],
      rows.map((r) => [
        r.name,
        fmt(r.opsPerSec),
        ratio(r.opsPerSec, redis?.opsPerSec ?? NaN),
        fmt(r.cpuUsPerOp, 1),
        fmt(r.requestsPerCycle, 1),
        fmt(r.grantsPerSec),
        ratio(r.grantsPerSec, redis?.grantsPerSec ?? NaN),
        fmt(r.p50WaitMs, 2),
        fmt(r.maxWaitMs, 1),
        fmt(r.share, 2),
        fmt(r.acquiresPerGrant, 2),
        fmt(r.requestsPerGrant, 1),
        describeFailures(r.failures)
      ]),
      [
        "all in this process; client CPU is this process's user+system time per cycle (the servers' not counted)",
        `requests: what the ZooKeeper server received (srvr "Received", read before and after each window, less what a read of it ` +
          `adds: ${all.map((side) => side.received?.overhead).filter((n) => n !== undefined).join(" / ")}; the sessions' pings ` +
          "included), per grant; - for Redis",
        "the ZooKeeper servers: standalone, on loopback, data in the OS temp dir; the redis-server runs without persistence",
        "acquire calls/grant: LockBackend.acquire calls per critical section (1.00: every attempt granted at once; below 1: releases handed the lock over)"
      ]
    )
    return {
      windowMs,
      contendedWindowMs,
      workers,
      holdMs,
      rounds: env.rounds,
      zooKeeper: { version, srvrOverhead: all.flatMap((side) => (side.received === undefined ? [] : [side.received.overhead])) },
      rows
    }
  }).pipe(Effect.scoped)
