/**
 * Scenario 9: lockstep's Lock on the SQL backend (PostgreSQL, MariaDB, SQLite) next to the Redis
 * backend, measured the same way in the same run, in this process:
 * - uncontended: one worker's lock+unlock cycles on one key (cycles/s, client CPU per cycle);
 * - contended: 8 workers on one key, in two backends of four each (as two processes: a release in
 *   one wakes the other's waiters through pub/sub, LISTEN/NOTIFY or the version poll), each
 *   critical section a 1 ms timer.
 * PostgreSQL and MariaDB are the machine's services (127.0.0.1:5432 as postgres, 127.0.0.1:3306 as
 * root), in a database of the run's own, dropped afterwards; SQLite is a file in a temporary
 * directory. A database that cannot be reached is reported, not measured.
 */
import { execFile } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Scope } from "effect"
import { Config, Effect, Layer, Redacted } from "effect"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import { SqlBackend } from "@lockstep/sql"
import { type RoundResult, summarize } from "./s2-contended.js"
import type { Env, Failures, Locker } from "./shared.js"
import { cpuMsSince, describeFailures, fmt, interleave, median, mergeFailures, now, printTable, ratio, runLoop } from "./shared.js"

const workers = 8
const holdMs = 1

interface Database {
  readonly id: string
  readonly name: string
  /** A backend with a client of its own. */
  readonly backend: Layer.Layer<LockBackend, unknown>
}

const command = (file: string, args: ReadonlyArray<string>): Effect.Effect<void, Error> =>
  Effect.async((resume) => {
    execFile(file, args, { timeout: 20_000 }, (error, _stdout, stderr) =>
      resume(error === null ? Effect.void : Effect.fail(new Error(`${file}: ${stderr.trim() || error.message}`))))
  })

/** A database of the run's own on a server, dropped with the scope. */
const serverDatabase = (
  id: string,
  name: string,
  admin: (statement: string) => Effect.Effect<void, Error>,
  url: (database: string) => string
): Effect.Effect<Database, Error, Scope.Scope> =>
  Effect.gen(function*() {
    const database = `lockstep_bench_${process.pid}`
    yield* Effect.acquireRelease(admin(`CREATE DATABASE ${database}`), () => Effect.ignore(admin(`DROP DATABASE ${database}`)))
    return { id, name, backend: SqlBackend.layerConfig(Config.succeed(Redacted.make(url(database)))) }
  })

const databases = (env: Env): ReadonlyArray<Effect.Effect<Database, Error, Scope.Scope>> => [
  Effect.succeed({ id: "redis", name: "Redis (the bench's redis-server)", backend: RedisBackend.layerFrom(env.url) }),
  serverDatabase(
    "pg",
    "PostgreSQL (LISTEN/NOTIFY)",
    (statement) => command("psql", ["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c", statement]),
    (database) => `postgres://postgres@127.0.0.1:5432/${database}`
  ),
  serverDatabase(
    "mysql",
    "MariaDB (version poll 25 ms)",
    (statement) => command("mysql", ["-h", "127.0.0.1", "-uroot", "-e", statement]),
    (database) => `mysql://root@127.0.0.1:3306/${database}`
  ),
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "lockstep-bench-"))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    ),
    (dir) => ({
      id: "sqlite",
      name: "SQLite (version poll 10 ms)",
      backend: SqlBackend.layerConfig(Config.succeed(Redacted.make(`sqlite:${join(dir, "locks.db")}`)))
    })
  )
]

/** `count` lockers on `key`, each its own Lock instance on one backend (built once, in the scope). */
const lockers = (database: Database, key: string, count: number): Effect.Effect<Array<Locker>, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const context = yield* Layer.build(database.backend)
    return yield* Effect.forEach(Array.from({ length: count }), () =>
      Effect.map(Effect.provide(Lock.make(key), context), (lock): Locker => ({
        withLock: <A, E>(body: Effect.Effect<A, E>) => Lock.withLock(body, lock)
      })))
  })

interface Uncontended {
  readonly opsPerSec: number
  readonly cpuUsPerOp: number
  readonly failures: Failures
}

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 300 : 2000
    const warmupMs = env.smoke ? 200 : 1000
    const contendedWindowMs = env.smoke ? 500 : 3000
    const opened = yield* Effect.forEach(databases(env), (open) => Effect.either(open))
    const notRun = opened.flatMap((o) => (o._tag === "Left" ? [o.left.message] : []))
    const sides = yield* Effect.forEach(opened.flatMap((o) => (o._tag === "Right" ? [o.right] : [])), (database) =>
      Effect.gen(function*() {
        const [single] = yield* lockers(database, `s9:${database.id}:uncontended`, 1)
        const contended = [
          ...(yield* lockers(database, `s9:${database.id}:contended`, workers / 2)),
          ...(yield* lockers(database, `s9:${database.id}:contended`, workers / 2))
        ]
        return { database, single: single!, contended }
      }))

    const uncontended = yield* interleave(env.rounds, sides, (side) =>
      Effect.gen(function*() {
        yield* runLoop(side.single, { holdMs: 0, endAt: now() + warmupMs })
        const cpu = process.cpuUsage()
        const result = yield* runLoop(side.single, { holdMs: 0, endAt: now() + windowMs })
        const cpuMs = cpuMsSince(cpu)
        return {
          opsPerSec: (result.count / windowMs) * 1000,
          cpuUsPerOp: (cpuMs * 1000) / Math.max(1, result.count),
          failures: result.failures
        } satisfies Uncontended
      }))
    const contended = yield* interleave(env.rounds, sides, (side) =>
      Effect.gen(function*() {
        const endAt = now() + contendedWindowMs
        const results = yield* Effect.forEach(side.contended, (locker) => runLoop(locker, { holdMs, endAt, trackWaits: true }), {
          concurrency: "unbounded"
        })
        return summarize(results, contendedWindowMs)
      }))

    const rows = sides.map((side, i) => {
      const u: ReadonlyArray<Uncontended> = uncontended[i]!
      const c: ReadonlyArray<RoundResult> = contended[i]!
      return {
        side: side.database.id,
        name: side.database.name,
        opsPerSec: median(u.map((s) => s.opsPerSec)),
        cpuUsPerOp: median(u.map((s) => s.cpuUsPerOp)),
        sectionsPerSec: median(c.map((s) => s.perSec)),
        share: median(c.map((s) => s.share)),
        maxWaitMs: median(c.map((s) => s.maxWaitMs)),
        failures: mergeFailures([...u.map((s) => s.failures), ...c.map((s) => s.failures)])
      }
    })
    const redis = rows.find((r) => r.side === "redis")
    yield* printTable(
      `9. SQL backends next to Redis: lockstep Lock, uncontended (1 worker) and contended (${workers} workers in 2 backends, ` +
        `${holdMs} ms hold) (${env.rounds} x ${windowMs} / ${contendedWindowMs} ms, median)`,
      ["backend", "ops/s", "vs Redis", "client CPU us/op", "contended sections/s", "vs Redis", "share min/max", "max wait ms", "failures"],
      rows.map((r) => [
        r.name,
        fmt(r.opsPerSec),
        ratio(r.opsPerSec, redis?.opsPerSec ?? NaN),
        fmt(r.cpuUsPerOp, 1),
        fmt(r.sectionsPerSec),
        ratio(r.sectionsPerSec, redis?.sectionsPerSec ?? NaN),
        fmt(r.share, 2),
        fmt(r.maxWaitMs, 1),
        describeFailures(r.failures)
      ]),
      [
        "all in this process; client CPU is this process's user+system time per cycle (the database servers' not counted)",
        ...notRun.map((reason) => `NOT RUN: ${reason}`)
      ]
    )
    return { windowMs, contendedWindowMs, workers, holdMs, rounds: env.rounds, rows, notRun }
  }).pipe(Effect.scoped)
