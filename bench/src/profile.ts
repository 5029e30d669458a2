/**
 * Runs one side of scenario 1 in this process for a while, against a redis-server given by URL,
 * and prints its client CPU per cycle: for profiling a side on its own, e.g.
 *
 *   npx tsx bench/build.ts
 *   node --cpu-prof bench/.build/profile.mjs redis://127.0.0.1:6390 floor-lockstep-backend 10000
 *   node --cpu-prof bench/.build/profile.mjs postgres://postgres@127.0.0.1:5432/locks sql-lock 10000
 *
 * Arguments: the URL, the side's id (see sides.ts; `sql-lock`: lockstep's Lock on the SQL backend,
 * the URL as `SqlBackend.layerConfig` takes it), the measured window in ms (after a warm-up window
 * of 2 s).
 */
import { Config, Effect, Layer, Redacted } from "effect"
import { Lock } from "@lockstep/core"
import { SqlBackend } from "@lockstep/sql"
import { cpuMsSince, now, runLoop } from "./shared.js"
import type { Side } from "./sides.js"
import { sideById } from "./sides.js"

/** Scenario 9's uncontended side: lockstep's Lock on a SQL backend with a client of its own. */
const sqlLock: Pick<Side, "open"> = {
  open: (url, key) =>
    Effect.gen(function*() {
      const context = yield* Effect.orDie(Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(url)))))
      const lock = yield* Effect.orDie(Effect.provide(Lock.make(key), context))
      return { withLock: <A, E>(body: Effect.Effect<A, E>) => Lock.withLock(body, lock) }
    })
}

const [url = "redis://127.0.0.1:6379", id = "floor-lockstep-backend", windowArg = "10000"] = process.argv.slice(2)
const side = id === "sql-lock" ? sqlLock : sideById(id)
if (side === undefined) throw new Error(`unknown side ${id}`)
const windowMs = Number(windowArg)

const program = Effect.gen(function*() {
  const locker = yield* side.open(url, `profile:${id}`)
  const warmup = yield* runLoop(locker, { holdMs: 0, endAt: now() + 2000 })
  const cpu = process.cpuUsage()
  const result = yield* runLoop(locker, { holdMs: 0, endAt: now() + windowMs })
  const cpuMs = cpuMsSince(cpu)
  console.log(JSON.stringify({
    side: id,
    cycles: result.count,
    warmupCycles: warmup.count,
    opsPerSec: Math.round((result.count / windowMs) * 1000),
    cpuUsPerOp: Number(((cpuMs * 1000) / Math.max(1, result.count)).toFixed(1)),
    failures: result.failures
  }))
}).pipe(Effect.scoped)

Effect.runPromise(program).then(() => process.exit(0), (error: unknown) => {
  console.error(error)
  process.exit(1)
})
