/**
 * Scenario 1: uncontended lock+unlock on one key, one worker, sequential. Throughput and client
 * CPU per cycle of each side, against two bare EVALSHA round trips per cycle. Each side runs in a
 * worker process of its own, so that neither the JIT's work nor the garbage of one side is
 * counted against another.
 */
import { Effect } from "effect"
import type { Env } from "./shared.js"
import { describeFailures, fmt, interleave, median, mergeFailures, printTable, ratio } from "./shared.js"
import type { SideId } from "./sides.js"
import { uncontendedSides } from "./sides.js"
import { request, spawnWorker } from "./workers.js"

const measured = uncontendedSides

/**
 * The layers of lockstep's uncontended cycle, each measured as a side of its own (client CPU per
 * cycle), from the bottom up; `calls` is the number of Redis calls per cycle (the budget of a
 * per-call layer is per call), `budgetUs` what the layer may cost above the one below it.
 */
const layers: ReadonlyArray<{
  readonly layer: string
  readonly side: SideId
  readonly budgetUs?: number | undefined
  readonly per?: "call" | "cycle" | undefined
  /** Whether the layer wraps each Redis call (its cost is also given per call). */
  readonly perCall: boolean
}> = [
  { layer: "lockstep's scripts, plain ioredis", side: "floor-lockstep-scripts", perCall: false },
  { layer: "+ Effect.promise (Effect's runtime)", side: "floor-lockstep-scripts-effect", perCall: true },
  { layer: "+ Redis call layer (backend calls alone)", side: "floor-lockstep-backend", budgetUs: 10, per: "call", perCall: true },
  { layer: "+ lock layer (Lock.withLock)", side: "lockstep-lock", budgetUs: 40, per: "cycle", perCall: false }
]

/** Redis calls per uncontended cycle: one acquire, one release. */
const callsPerCycle = 2

export interface LayerRow {
  readonly layer: string
  readonly side: SideId
  /** Client CPU per cycle of the side. */
  readonly cpuUsPerCycle: number
  /** What the layer adds to the one below it, per cycle (NaN for the bottom one). */
  readonly addedUsPerCycle: number
  /** The same per Redis call, for a layer that wraps each call (NaN for the others). */
  readonly addedUsPerCall: number
  readonly budget?: { readonly maxUs: number; readonly per: "call" | "cycle" } | undefined
  /** Whether the layer stays within its budget (undefined: no budget). */
  readonly met?: boolean | undefined
}

/** The cost of each layer above the one below it, from scenario 1's rows. */
export const layerCosts = (cpuUsPerCycle: (side: SideId) => number): Array<LayerRow> =>
  layers.map((layer, i) => {
    const cpu = cpuUsPerCycle(layer.side)
    const added = i === 0 ? NaN : cpu - cpuUsPerCycle(layers[i - 1]!.side)
    const row: LayerRow = {
      layer: layer.layer,
      side: layer.side,
      cpuUsPerCycle: cpu,
      addedUsPerCycle: added,
      addedUsPerCall: layer.perCall ? added / callsPerCycle : NaN
    }
    if (layer.budgetUs === undefined || layer.per === undefined) return row
    const spent = layer.per === "call" ? row.addedUsPerCall : row.addedUsPerCycle
    return { ...row, budget: { maxUs: layer.budgetUs, per: layer.per }, met: Number.isFinite(spent) ? spent <= layer.budgetUs : undefined }
  })

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
    const costs = layerCosts((id) => rows.find((r) => r.side === id)?.cpuUsPerOp ?? NaN)
    yield* printTable(
      "1. Cost per layer, client CPU us per lock+unlock cycle (median of the rows above)",
      ["layer", "us/cycle", "added us/cycle", "added us/call", "budget", "met"],
      costs.map((c) => [
        c.layer,
        fmt(c.cpuUsPerCycle, 1),
        fmt(c.addedUsPerCycle, 1),
        fmt(c.addedUsPerCall, 1),
        c.budget === undefined ? "-" : `<= ${c.budget.maxUs} us/${c.budget.per}`,
        c.met === undefined ? "-" : c.met ? "met" : "not met"
      ]),
      [
        `each layer's cost is its side's CPU minus the side below; ${callsPerCycle} Redis calls per cycle (acquire, release)`,
        "budgets: Redis call layer <= 10 us per call above Effect.promise; lock layer <= 40 us per cycle above its backend calls"
      ]
    )
    return {
      windowMs,
      rounds: env.rounds,
      rows: rows.map((r) => ({ ...r, vsBaseline: r.opsPerSec / baseline })),
      layers: costs
    }
  }).pipe(Effect.scoped)
