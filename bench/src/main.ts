/**
 * The lockstep benchmark suite. Starts its own redis-server on a free loopback port, runs every
 * scenario, prints a table per scenario and writes a JSON summary to bench/results/latest.json.
 *
 *   pnpm bench              # full run (median of 3 rounds per measurement)
 *   pnpm bench --smoke      # short run, 1 round (or BENCH_SMOKE=1)
 *   pnpm bench --only=1,4   # some scenarios only
 *
 * No thresholds: it prints numbers and ratios, and exits non-zero only when something broke.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import * as os from "node:os"
import { Cause, Console, Effect, Exit, Fiber } from "effect"
import * as RedisServer from "@lockstep/servers/RedisServer"
import * as s1 from "./s1-uncontended.js"
import * as s2 from "./s2-contended.js"
import * as s3 from "./s3-processes.js"
import * as s4 from "./s4-handoff.js"
import * as s5 from "./s5-many-leases.js"
import * as s6 from "./s6-fair-queue.js"
import * as s7 from "./s7-memory.js"
import * as s8 from "./s8-commands.js"
import * as s9 from "./s9-sql.js"
import * as s10 from "./s10-failover.js"
import * as s11 from "./s11-zookeeper.js"
import * as s12 from "./s12-burst.js"
import { renderFromFile, writeChart } from "./chart.js"
import type { Env } from "./shared.js"
import { connect, flushAll, fmt, gcAvailable, info, logLines, now, quietLogger, resetLogLines } from "./shared.js"

const args = process.argv.slice(2)
const smoke = args.includes("--smoke") || process.env["BENCH_SMOKE"] === "1"
const only = args.find((a) => a.startsWith("--only="))?.slice("--only=".length).split(",")
const option = (name: string) => args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3)
const chartFrom = option("chart-from")

const scenarios: ReadonlyArray<{ readonly id: string; readonly run: (env: Env) => Effect.Effect<unknown, unknown> }> = [
  { id: "1", run: s1.run },
  { id: "2", run: s2.run },
  { id: "3", run: s3.run },
  { id: "4", run: s4.run },
  { id: "5", run: s5.run },
  { id: "6", run: s6.run },
  { id: "7", run: s7.run },
  { id: "8", run: s8.run },
  { id: "9", run: s9.run },
  { id: "10", run: s10.run },
  { id: "11", run: s11.run },
  { id: "12", run: s12.run }
]

const resultsFile = new URL("../results/latest.json", import.meta.url)

const program = Effect.gen(function*() {
  const startedAt = new Date()
  const server = yield* RedisServer.make()
  // should the process die without running finalizers, the server goes with it
  const pid = yield* server.pid
  if (pid._tag === "Some") {
    const serverPid = pid.value
    process.once("exit", () => {
      try {
        process.kill(serverPid, "SIGKILL")
      } catch {
        // already gone
      }
    })
  }
  const admin = yield* connect(server.url)
  const redisVersion = (yield* info(admin, "server")).get("redis_version") ?? "?"
  const env: Env = { smoke, rounds: smoke ? 1 : 3, url: server.url, admin }

  yield* Console.log(
    `lockstep bench (${smoke ? "smoke" : "full"}): node ${process.version}, ${os.cpus().length} CPUs, ` +
      `redis-server ${redisVersion} at ${server.url}, ${env.rounds} round(s) per measurement, ` +
      `gc ${gcAvailable() ? "exposed" : "not exposed"}`
  )
  const results: Record<string, unknown> = {}
  const timings: Record<string, number> = {}
  const logged: Record<string, Record<string, number>> = {}
  for (const scenario of scenarios) {
    if (only !== undefined && !only.includes(scenario.id)) continue
    yield* flushAll(admin)
    resetLogLines()
    const t0 = now()
    results[`scenario${scenario.id}`] = yield* scenario.run(env)
    timings[`scenario${scenario.id}`] = Math.round(now() - t0)
    logged[`scenario${scenario.id}`] = { ...logLines.byLevel }
    const suppressed = logLines.suppressed > 0 ? `; ${fmt(logLines.suppressed)} more log lines not shown` : ""
    yield* Console.log(`  (scenario ${scenario.id}: ${fmt((now() - t0) / 1000, 1)} s${suppressed})`)
  }
  const summary = {
    mode: smoke ? "smoke" : "full",
    startedAt: startedAt.toISOString(),
    durationMs: Date.now() - startedAt.getTime(),
    machine: {
      node: process.version,
      cpus: os.cpus().length,
      cpuModel: os.cpus()[0]?.model,
      memoryGiB: Math.round(os.totalmem() / 2 ** 30),
      os: `${os.type()} ${os.release()} ${os.arch()}`,
      redis: redisVersion
    },
    rounds: env.rounds,
    timingsMs: timings,
    logLinesByLevel: logged,
    results
  }
  mkdirSync(new URL(".", resultsFile), { recursive: true })
  writeFileSync(resultsFile, JSON.stringify(summary, null, 2) + "\n")
  yield* Console.log(`\nwrote ${resultsFile.pathname} (${fmt(summary.durationMs / 1000, 1)} s in all)`)
  const charts = writeChart(summary, new URL(".", resultsFile))
  yield* Console.log(`wrote ${charts.join(" and ")}`)
}).pipe(Effect.scoped, Effect.provide(quietLogger))

/** The whole run; Ctrl-C / SIGTERM interrupt it, so that every finalizer (connections, workers, the server) runs. */
const runAll = () => {
  const fiber = Effect.runFork(program)
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => {
      Effect.runFork(Fiber.interrupt(fiber))
    })
  }
  return Effect.runPromise(Fiber.await(fiber))
}

if (chartFrom !== undefined) {
  console.log(`wrote ${renderFromFile(chartFrom, option("chart-out"))}`)
} else {
  runAll().then(
    (exit) => {
      if (Exit.isFailure(exit)) {
        console.error(Cause.isInterruptedOnly(exit.cause) ? "bench interrupted" : `bench failed:\n${Cause.pretty(exit.cause)}`)
        process.exit(1)
      }
      // peers may leave timers or sockets behind: do not wait for them
      process.exit(0)
    },
    (error: unknown) => {
      console.error("bench failed:", error)
      process.exit(1)
    }
  )
}
