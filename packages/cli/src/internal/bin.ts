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

NodeRuntime.runMain(program, {
  disablePrettyLogger: true,
  disableErrorReporting: true,
  teardown: (exit, onExit) => onExit(Exit.isSuccess(exit) && typeof exit.value === "number" ? exit.value : code ?? 1)
})
