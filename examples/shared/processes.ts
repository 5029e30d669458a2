/**
 * Child processes for the examples that run several processes: each runs a TypeScript file of the
 * example the way this process runs (under tsx), prints JSON messages on stdout, one a line, and
 * is killed if it still runs when the scope closes. `readyThenAwaitGo` (in a child) and
 * `startTogether` (in the parent) line the children up, so
 * that they start their work at the same moment however long each took to start.
 */
import { spawn } from "node:child_process"
import { createInterface } from "node:readline"
import type { Scope } from "effect"
import { Console, Data, Deferred, Effect, Queue } from "effect"

/** The child ended before it printed the message asked for. */
export class ChildExited extends Data.TaggedError("ChildExited")<{ readonly pid: number; readonly code: number | null }> {}

export interface Child {
  readonly pid: number
  /** The next message the child printed; fails with `ChildExited` once it has ended. */
  readonly next: Effect.Effect<unknown, ChildExited>
  /** Writes a line to the child's stdin. */
  readonly send: (line: string) => Effect.Effect<void>
}

const exited = Symbol("exited")

/** Starts `file` with `env` added to this process's environment; stderr goes to this one's. */
export const spawnChild = (file: URL, env: Record<string, string>): Effect.Effect<Child, never, Scope.Scope> =>
  Effect.gen(function*() {
    const messages = yield* Queue.unbounded<unknown>()
    const child = yield* Effect.acquireRelease(
      Effect.sync(() =>
        spawn(process.execPath, [...process.execArgv, file.pathname], {
          env: { ...process.env, ...env },
          stdio: ["pipe", "pipe", "inherit"]
        })
      ),
      (child) => Effect.sync(() => child.exitCode === null && child.signalCode === null && child.kill("SIGKILL"))
    )
    createInterface({ input: child.stdout! }).on("line", (line) => {
      if (line.trim() !== "") Queue.unsafeOffer(messages, JSON.parse(line))
    })
    // "close" comes after the last line of stdout
    child.on("close", (code) => Queue.unsafeOffer(messages, { [exited]: code }))
    const pid = child.pid ?? -1
    return {
      pid,
      next: Effect.flatMap(Queue.take(messages), (message) =>
        typeof message === "object" && message !== null && exited in message
          ? Effect.zipRight(Queue.offer(messages, message), Effect.fail(new ChildExited({ pid, code: message[exited] as number | null })))
          : Effect.succeed(message)),
      send: (line) => Effect.sync(() => child.stdin!.write(`${line}\n`))
    }
  })

/**
 * Every message of every child (messages of type `A`) until all have ended, each printed as `line`
 * words it when it comes.
 */
export const collectAll = <A>(children: ReadonlyArray<Child>, line: (message: A) => string): Effect.Effect<Array<A>> =>
  Effect.map(
    Effect.forEach(
      children,
      (child) =>
        Effect.gen(function*() {
          const out: Array<A> = []
          while (true) {
            const message = yield* Effect.either(child.next)
            if (message._tag === "Left") return out
            yield* Console.log(line(message.right as A))
            out.push(message.right as A)
          }
        }),
      { concurrency: "unbounded" }
    ),
    (all) => all.flat()
  )

// ---------------------------------------------------------------------------------------------
// in a child

/** Prints one message for the parent. */
export const tell = (message: unknown): Effect.Effect<void> => Effect.sync(() => console.log(JSON.stringify(message)))

/** Tells the parent it is ready, then waits for its "go". */
export const readyThenAwaitGo: Effect.Effect<void> = Effect.zipRight(
  tell("ready"),
  Effect.gen(function*() {
    const go = yield* Deferred.make<void>()
    const lines = createInterface({ input: process.stdin })
    lines.on("line", (line) => line === "go" && Deferred.unsafeDone(go, Effect.void))
    yield* Deferred.await(go)
    lines.close()
  })
)

/** Waits until every child has said it is ready, then tells them all to go. */
export const startTogether = (children: ReadonlyArray<Child>): Effect.Effect<void, ChildExited> =>
  Effect.zipRight(
    Effect.forEach(children, (child) => child.next, { concurrency: "unbounded", discard: true }),
    Effect.forEach(children, (child) => child.send("go"), { discard: true })
  )
