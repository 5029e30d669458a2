#!/usr/bin/env node
/**
 * The `lockstep` bin: the command line on Node's runtime, exiting with the code it ends with.
 */
import { NodeContext, NodeRuntime } from "@effect/platform-node"
import { Effect, Exit, Fiber, Logger, LogLevel } from "effect"
import { main } from "../Cli.js"

// The command line handles SIGINT and SIGTERM itself (`run` forwards them to its command and
// releases the lock once it has exited), so the runtime's interruption on those signals must not
// cut it short: it runs on a fiber of its own, which the main fiber awaits without interruption.
// The exit code is kept aside, since an interrupted main fiber ends without its value.
let code: number | undefined
const program = Effect.forkDaemon(Effect.interruptible(main(process.argv))).pipe(
  Effect.flatMap(Fiber.join),
  Effect.tap((exit) => Effect.sync(() => (code = exit))),
  Effect.uninterruptible,
  // stdout is the command's; lockstep says what matters in one line of its own (a lost lease, a
  // lock not obtained), so the libraries' logs are shown only for errors, on stderr
  Effect.provide(Logger.replace(Logger.defaultLogger, Logger.prettyLogger({ stderr: true }))),
  Logger.withMinimumLogLevel(LogLevel.Error),
  Effect.provide(NodeContext.layer)
)

// The process exits as soon as the command line has ended, with its code, 0 included (the
// runtime's own teardown leaves a 0 to the event loop, which ends only once nothing is pending).
// By then the lock is released and the backend closed, and nothing is left to wait for; a timer
// or a socket some library left behind must not hold the command's exit back. (The lease keeper
// of @lockstep/core sleeps to its next renewal on a timer it unrefs once no hold is left, but
// only on the live clock of its own copy of effect: where it runs on another copy, as in an
// install that gives each package its own, its sleep kept lockstep alive up to a lease longer;
// it now ends its loop then.) What lockstep wrote is flushed first: on a pipe or a socket Node
// may still hold it (an empty write's callback runs once everything before it is out).
// A reader that never reads does not keep lockstep from exiting for more than a few seconds.
const exitWith = (status: number) => {
  setTimeout(() => process.exit(status), 5_000).unref()
  process.stdout.write("", () => process.stderr.write("", () => process.exit(status)))
}

NodeRuntime.runMain(program, {
  disablePrettyLogger: true,
  disableErrorReporting: true,
  teardown: (exit) => exitWith(Exit.isSuccess(exit) && typeof exit.value === "number" ? exit.value : code ?? 1)
})
