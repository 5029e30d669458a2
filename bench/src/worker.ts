/**
 * A worker process of scenarios 1, 3 and 10, driven over IPC by its parent: `open` a side's lock on a
 * key (its own connection), `run` the lock/hold/unlock loop in a given time window (and report the
 * process's CPU time it took), `close`, `exit`. Exits when the parent goes away.
 */
import { Effect, Exit, Queue, Scope } from "effect"
import type { Locker, LoopResult } from "./shared.js"
import { cpuMsSince, now, runLoop, sleep } from "./shared.js"
import type { OpenOptions } from "./sides.js"
import { sideById } from "./sides.js"

export type Command =
  | {
    readonly type: "open"
    readonly side: string
    readonly url: string
    readonly key: string
    readonly options?: OpenOptions | undefined
  }
  | {
    readonly type: "run"
    readonly startAtEpochMs: number
    readonly windowMs: number
    readonly holdMs: number
    readonly trackWaits: boolean
    readonly trackLatencies?: boolean | undefined
  }
  | { readonly type: "close" }
  | { readonly type: "exit" }

export type Reply =
  | { readonly type: "ready" }
  | { readonly type: "opened" }
  | { readonly type: "done"; readonly result: LoopResult; readonly cpuMs: number }
  | { readonly type: "closed" }
  | { readonly type: "error"; readonly message: string }

const send = (reply: Reply): void => {
  process.send?.(reply)
}

const main = Effect.gen(function*() {
  const inbox = yield* Queue.unbounded<Command>()
  process.on("message", (command) => {
    Queue.unsafeOffer(inbox, command as Command)
  })
  send({ type: "ready" })
  let scope: Scope.CloseableScope | undefined
  let locker: Locker | undefined
  while (true) {
    const command = yield* Queue.take(inbox)
    switch (command.type) {
      case "open": {
        const side = sideById(command.side)
        if (side === undefined) {
          send({ type: "error", message: `unknown side ${command.side}` })
          break
        }
        scope = yield* Scope.make()
        locker = yield* Scope.extend(side.open(command.url, command.key, command.options), scope)
        send({ type: "opened" })
        break
      }
      case "run": {
        if (locker === undefined) {
          send({ type: "error", message: "run before open" })
          break
        }
        // the window is given on the wall clock, shared by all workers; loops use the monotonic one
        const startAt = now() + (command.startAtEpochMs - Date.now())
        yield* Effect.promise(() => sleep(Math.max(0, startAt - now())))
        const cpu = process.cpuUsage()
        const result = yield* runLoop(locker, {
          holdMs: command.holdMs,
          endAt: startAt + command.windowMs,
          trackWaits: command.trackWaits,
          trackLatencies: command.trackLatencies
        })
        send({ type: "done", result, cpuMs: cpuMsSince(cpu) })
        break
      }
      case "close": {
        if (scope !== undefined) yield* Scope.close(scope, Exit.void)
        scope = undefined
        locker = undefined
        send({ type: "closed" })
        break
      }
      case "exit":
        return
    }
  }
})

// the parent is gone: nothing left to do
process.once("disconnect", () => process.exit(0))

Effect.runPromise(main).then(
  () => process.exit(0),
  (error: unknown) => {
    console.error("bench worker failed:", error)
    process.exit(1)
  }
)
