/**
 * Scenario 1: uncontended lock+unlock on one key, one worker, sequential. Throughput and client
 * CPU per cycle of each side, against two bare EVALSHA round trips per cycle.
 */
import { Effect } from "effect"
import type { Env } from "./shared.js"
import { cpuMsSince, describeFailures, fmt, interleave, median, mergeFailures, now, printTable, ratio, runLoop } from "./shared.js"
import { uncontendedSides } from "./sides.js"

const measured = uncontendedSides

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 500 : 2000
    const warmupMs = env.smoke ? 100 : 300
    const lockers = yield* Effect.forEach(measured, (side) => side.open(env.url, `s1:${side.id}`))
    // warm up the JIT and the connections
    for (const locker of lockers) yield* runLoop(locker, { holdMs: 0, endAt: now() + warmupMs })

    const samples = yield* interleave(env.rounds, measured.map((_, i) => i), (i) =>
      Effect.gen(function*() {
        const cpu = process.cpuUsage()
        const started = now()
        const result = yield* runLoop(lockers[i]!, { holdMs: 0, endAt: started + windowMs })
        const elapsed = now() - started
        return {
          opsPerSec: (result.count / elapsed) * 1000,
          cpuUsPerOp: (cpuMsSince(cpu) * 1000) / Math.max(1, result.count),
          failures: result.failures
        }
      }))

    const rows = measured.map((side, i) => ({
      side: side.id,
      name: side.name,
      opsPerSec: median(samples[i]!.map((s) => s.opsPerSec)),
      cpuUsPerOp: median(samples[i]!.map((s) => s.cpuUsPerOp)),
      failures: mergeFailures(samples[i]!.map((s) => s.failures))
    }))
    const baseline = rows[0]!.opsPerSec
    yield* printTable(
      `1. Uncontended lock+unlock, 1 worker, 1 key (${env.rounds} x ${windowMs} ms, median)`,
      ["side", "ops/s", "vs baseline", "client CPU us/op", "failures"],
      rows.map((r) => [r.name, fmt(r.opsPerSec), ratio(r.opsPerSec, baseline), fmt(r.cpuUsPerOp, 1), describeFailures(r.failures)]),
      ["baseline: two sequential EVALSHA of `return 1` through ioredis per cycle; CPU is this process's user+system time"]
    )
    return { windowMs, rounds: env.rounds, rows: rows.map((r) => ({ ...r, vsBaseline: r.opsPerSec / baseline })) }
  }).pipe(Effect.scoped)
