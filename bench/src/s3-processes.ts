/**
 * Scenario 3: as scenario 2, but the 8 workers are 8 OS processes (worker.ts), each with its own
 * connection and lock instance; their counts are summed. The
 * baseline is the same in-process FIFO mutex (8 fibers, 1 ms hold), measured here too.
 */
import type { ChildProcess } from "node:child_process"
import { Effect } from "effect"
import type { Env, LoopResult } from "./shared.js"
import { interleave, now, runLoop } from "./shared.js"
import type { WorkerError } from "./workers.js"
import { request, spawnWorker } from "./workers.js"
import type { RoundResult } from "./s2-contended.js"
import { contendingSides, holdMs, printRows, summarize, toRow, workers } from "./s2-contended.js"

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 500 : 3000
    const spawnStarted = now()
    const children = yield* Effect.forEach(Array.from({ length: workers }), () => spawnWorker, { concurrency: "unbounded" })
    const spawnMs = now() - spawnStarted

    const semaphore = yield* Effect.makeSemaphore(1)
    const fifoRound = Effect.gen(function*() {
      const endAt = now() + windowMs
      const results = yield* Effect.forEach(
        Array.from({ length: workers }),
        () => runLoop({ withLock: (body) => semaphore.withPermits(1)(body) }, { holdMs, endAt, trackWaits: true }),
        { concurrency: "unbounded" }
      )
      return summarize(results, windowMs)
    })

    const all = [{ id: "baseline-fifo-mutex", name: "baseline: in-process FIFO mutex" }, ...contendingSides]
    const samples = yield* interleave(env.rounds, all, (side, round): Effect.Effect<RoundResult, WorkerError> =>
      side.id === "baseline-fifo-mutex"
        ? fifoRound
        : Effect.gen(function*() {
          const key = `s3:${side.id}:${round}`
          const each = <A>(f: (child: ChildProcess) => Effect.Effect<A, WorkerError>) =>
            Effect.forEach(children, f, { concurrency: "unbounded" })
          yield* each((child) => request(child, { type: "open", side: side.id, url: env.url, key }))
          const startAtEpochMs = Date.now() + 50
          const replies = yield* each((child) => request(child, { type: "run", startAtEpochMs, windowMs, holdMs, trackWaits: true }))
          yield* each((child) => request(child, { type: "close" }))
          const results: Array<LoopResult> = replies.flatMap((r) => (r.type === "done" ? [r.result] : []))
          return summarize(results, windowMs)
        }))
    const rows = all.map((side, i) => toRow(side, samples[i]!))
    const baseline = rows[0]!.perSec
    yield* printRows(
      `3. Contended: ${workers} OS processes, 1 key, ${holdMs} ms hold (${env.rounds} x ${windowMs} ms, median)`,
      rows,
      baseline,
      [`baseline: the in-process FIFO mutex (8 fibers in this process); workers took ${Math.round(spawnMs)} ms to start`]
    )
    return { windowMs, workers, holdMs, rounds: env.rounds, fifoMutexPerSec: baseline, spawnMs, rows }
  }).pipe(Effect.scoped)
