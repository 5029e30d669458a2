/**
 * Worker processes (worker.ts) for the scenarios that run a side outside this process: started,
 * driven over IPC, and stopped with the scope.
 */
import type { ChildProcess } from "node:child_process"
import { fork } from "node:child_process"
import { fileURLToPath } from "node:url"
import type { Scope } from "effect"
import { Data, Effect } from "effect"
import type { Command, Reply } from "./worker.js"

export class WorkerError extends Data.TaggedError("WorkerError")<{ readonly message: string }> {}

// compiled by build.ts next to this file; run from the sources (through tsx), the worker is too
const compiled = import.meta.url.endsWith(".mjs")
const workerFile = fileURLToPath(new URL(compiled ? "./worker.mjs" : "./worker.ts", import.meta.url))
const workerArgs = compiled ? [] : ["--import", import.meta.resolve("tsx")]

/** Sends a command and waits for the worker's reply. */
export const request = (child: ChildProcess, command: Command): Effect.Effect<Reply, WorkerError> =>
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
export const spawnWorker: Effect.Effect<ChildProcess, WorkerError, Scope.Scope> = Effect.acquireRelease(
  Effect.async<ChildProcess, WorkerError>((resume) => {
    const child = fork(workerFile, [], { execArgv: workerArgs, stdio: ["ignore", "inherit", "inherit", "ipc"] })
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

