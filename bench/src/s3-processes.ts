/**
 * Scenario 3: as scenario 2, but the 8 workers are 8 OS processes (node --import tsx
 * s3-worker.ts), each with its own connection and lock instance; their counts are summed. The
 * baseline is the same in-process FIFO mutex (8 fibers, 1 ms hold), measured here too.
 */
import type { ChildProcess } from "node:child_process"
import { fork } from "node:child_process"
import { fileURLToPath } from "node:url"
import type { Scope } from "effect"
import { Data, Effect } from "effect"
import type { Env, LoopResult } from "./shared.js"
import { interleave, now, runLoop } from "./shared.js"
import type { Command, Reply } from "./s3-worker.js"
import type { RoundResult } from "./s2-contended.js"
import { contendingSides, holdMs, printRows, summarize, toRow, workers } from "./s2-contended.js"

class WorkerError extends Data.TaggedError("WorkerError")<{ readonly message: string }> {}

const workerFile = fileURLToPath(new URL("./s3-worker.ts", import.meta.url))
const tsxLoader = import.meta.resolve("tsx")

/** Sends a command and waits for the worker's reply. */
const request = (child: ChildProcess, command: Command): Effect.Effect<Reply, WorkerError> =>
  Effect.async<Reply, WorkerError>((resume) => {
    const cleanUp = () => {
      child.off("message", onMessage)
      child.off("exit", onExit)
    }
    const onMessage = (reply: unknown) => {
      cleanUp()
      const r = reply as Reply
      resume(r.type === "error" ? Effect.fail(new WorkerError({ message: r.message })) : Effect.succeed(r))
    }
    const onExit = (code: number | null) => {
      cleanUp()
      resume(Effect.fail(new WorkerError({ message: `worker exited (code ${code})` })))
    }
    child.on("message", onMessage)
    child.on("exit", onExit)
    child.send(command)
    return Effect.sync(cleanUp)
  })

/** A worker process, ready for commands; stopped with the scope. */
const spawnWorker: Effect.Effect<ChildProcess, WorkerError, Scope.Scope> = Effect.acquireRelease(
  Effect.async<ChildProcess, WorkerError>((resume) => {
    const child = fork(workerFile, [], { execArgv: ["--import", tsxLoader], stdio: ["ignore", "inherit", "inherit", "ipc"] })
    const onExit = (code: number | null) => resume(Effect.fail(new WorkerError({ message: `worker exited at start (code ${code})` })))
    child.once("exit", onExit)
    child.once("message", () => {
      child.off("exit", onExit)
      resume(Effect.succeed(child))
    })
  }),
  (child) =>
    Effect.async<void>((resume) => {
      if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
      const timer = setTimeout(() => child.kill("SIGKILL"), 3000)
      child.once("exit", () => {
        clearTimeout(timer)
        resume(Effect.void)
      })
      if (child.connected) child.send({ type: "exit" } satisfies Command)
      else child.kill("SIGTERM")
    })
)

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
          const replies = yield* each((child) => request(child, { type: "run", startAtEpochMs, windowMs, holdMs }))
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
