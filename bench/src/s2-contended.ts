/**
 * Scenario 2: 8 workers in this process (each with its own connection and lock instance) on one
 * key, each critical section a 1 ms timer. Critical sections per second of every side against
 * an in-process FIFO mutex (`Effect.makeSemaphore(1)`, 8 fibers, the same 1 ms hold), the spread
 * of grants between workers and the longest wait of any acquisition.
 */
import { Effect } from "effect"
import type { Env, Locker, LoopResult } from "./shared.js"
import { describeFailures, fmt, interleave, median, mergeFailures, now, printTable, ratio, runLoop } from "./shared.js"
import type { Side } from "./sides.js"
import { sides } from "./sides.js"

export const workers = 8
export const holdMs = 1

/** The redis sides of scenarios 2 and 3. */
export const contendingSides: ReadonlyArray<Side> = [
  sides.lockstepLock,
  sides.lockstepFairLock,
  sides.redlock,
  sides.redisSemaphore,
  sides.edl
]

export interface RoundResult {
  readonly perSec: number
  /** Fewest grants of a worker / most grants of a worker. */
  readonly share: number
  readonly maxWaitMs: number
  readonly perWorker: ReadonlyArray<number>
  readonly failures: LoopResult["failures"]
}

/** Sums the workers' loops of one round. */
export const summarize = (results: ReadonlyArray<LoopResult>, windowMs: number): RoundResult => {
  const counts = results.map((r) => r.count)
  const total = counts.reduce((a, b) => a + b, 0)
  return {
    perSec: (total / windowMs) * 1000,
    share: Math.max(...counts) > 0 ? Math.min(...counts) / Math.max(...counts) : 0,
    maxWaitMs: Math.max(...results.map((r) => r.maxWaitMs)),
    perWorker: counts,
    failures: mergeFailures(results.map((r) => r.failures))
  }
}

export interface Row {
  readonly side: string
  readonly name: string
  readonly perSec: number
  readonly share: number
  readonly maxWaitMs: number
  readonly perWorker: ReadonlyArray<ReadonlyArray<number>>
  readonly failures: LoopResult["failures"]
}

export const toRow = (side: { readonly id: string; readonly name: string }, rounds: ReadonlyArray<RoundResult>): Row => ({
  side: side.id,
  name: side.name,
  perSec: median(rounds.map((r) => r.perSec)),
  share: median(rounds.map((r) => r.share)),
  maxWaitMs: median(rounds.map((r) => r.maxWaitMs)),
  perWorker: rounds.map((r) => r.perWorker),
  failures: mergeFailures(rounds.map((r) => r.failures))
})

export const printRows = (title: string, rows: ReadonlyArray<Row>, baseline: number, notes: ReadonlyArray<string>) =>
  printTable(
    title,
    ["side", "sections/s", "vs FIFO mutex", "share min/max", "max wait ms", "failures"],
    rows.map((r) => [
      r.name,
      fmt(r.perSec),
      ratio(r.perSec, baseline),
      fmt(r.share, 2),
      fmt(r.maxWaitMs, 1),
      describeFailures(r.failures)
    ]),
    [
      `target for FairLock: share >= 0.80, max wait <= ${2 * workers * holdMs} ms (2 x workers x hold)`,
      ...notes
    ]
  )

const fifoMutex = { id: "baseline-fifo-mutex", name: "baseline: in-process FIFO mutex" }

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 500 : 3000
    const semaphore = yield* Effect.makeSemaphore(1)
    const fifo: Locker = { withLock: (body) => semaphore.withPermits(1)(body) }
    const all: ReadonlyArray<{ readonly id: string; readonly name: string; readonly lockers: ReadonlyArray<Locker> }> = [
      { ...fifoMutex, lockers: Array.from({ length: workers }, () => fifo) },
      ...(yield* Effect.forEach(contendingSides, (side) =>
        Effect.map(
          Effect.forEach(Array.from({ length: workers }), () => side.open(env.url, `s2:${side.id}`)),
          (lockers) => ({ id: side.id, name: side.name, lockers })
        )))
    ]
    const samples = yield* interleave(env.rounds, all, (side) =>
      Effect.gen(function*() {
        const endAt = now() + windowMs
        const results = yield* Effect.forEach(
          side.lockers,
          (locker) => runLoop(locker, { holdMs, endAt, trackWaits: true }),
          { concurrency: "unbounded" }
        )
        return summarize(results, windowMs)
      }))
    const rows = all.map((side, i) => toRow(side, samples[i]!))
    const baseline = rows[0]!.perSec
    yield* printRows(
      `2. Contended: ${workers} workers in one process, 1 key, ${holdMs} ms hold (${env.rounds} x ${windowMs} ms, median)`,
      rows,
      baseline,
      []
    )
    return { windowMs, workers, holdMs, rounds: env.rounds, fifoMutexPerSec: baseline, rows }
  }).pipe(Effect.scoped)
