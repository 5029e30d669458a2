/**
 * Scenario 1: uncontended lock+unlock on one key, one worker, sequential. Throughput and client
 * CPU per cycle of each side, against two bare EVALSHA round trips per cycle. Each side runs in a
 * worker process of its own, so that neither the JIT's work nor the garbage of one side is
 * counted against another.
 */
import { Effect } from "effect"
import type { Env } from "./shared.js"
import { describeFailures, fmt, interleave, median, mergeFailures, printTable, ratio } from "./shared.js"
import { uncontendedSides } from "./sides.js"
import { request, spawnWorker } from "./workers.js"

const measured = uncontendedSides

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 500 : 2000
    // V8 takes seconds of a loop to optimize it fully: each window follows an unmeasured one
    const warmupMs = env.smoke ? 300 : 1500
    const workers = yield* Effect.forEach(measured, (side) =>
      Effect.gen(function*() {
        const child = yield* spawnWorker
        yield* request(child, { type: "open", side: side.id, url: env.url, key: `s1:${side.id}` })
        return child
      }), { concurrency: "unbounded" })
    const loop = (i: number, ms: number) =>
      Effect.flatMap(
        request(workers[i]!, { type: "run", startAtEpochMs: Date.now(), windowMs: ms, holdMs: 0, trackWaits: false }),
        (reply) => reply.type === "done" ? Effect.succeed(reply) : Effect.dieMessage(`unexpected reply ${reply.type}`)
      )

    const samples = yield* interleave(env.rounds, measured.map((_, i) => i), (i) =>
      Effect.gen(function*() {
        yield* loop(i, warmupMs)
        const { cpuMs, result } = yield* loop(i, windowMs)
        return {
          opsPerSec: (result.count / windowMs) * 1000,
          cpuUsPerOp: (cpuMs * 1000) / Math.max(1, result.count),
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
      [
        "baseline: two sequential EVALSHA of `return 1` through ioredis per cycle",
        "each side in a worker process of its own; CPU is that process's user+system time"
      ]
    )
    return { windowMs, rounds: env.rounds, rows: rows.map((r) => ({ ...r, vsBaseline: r.opsPerSec / baseline })) }
  }).pipe(Effect.scoped)
