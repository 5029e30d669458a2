/**
 * The `lockstep` command line as an effect: `main` runs a command line to its exit code. The
 * `lockstep` bin runs it on Node; a program of your own can run it too (on a runtime that provides
 * the platform's services, such as `NodeContext.layer`).
 *
 * @since 0.1.0
 */
import type { CliApp } from "@effect/cli/CliApp"
import type { CommandExecutor } from "@effect/platform/CommandExecutor"
import { Effect, Layer } from "effect"
import * as internal from "./internal/cli.js"
import { ExitCodes } from "./internal/errors.js"
import * as signals from "./internal/signals.js"

/**
 * The codes `lockstep` exits with on its own account; otherwise it exits with its command's code
 * (128 + the signal's number for a command a signal ended).
 *
 * @example
 * ```ts
 * import { Cli } from "@lockstep/cli"
 *
 * console.log(Cli.ExitCode.conflict) // 75: the lock was held (--no-wait, or --wait ran out)
 * ```
 *
 * @since 0.1.0
 * @category constants
 */
export const ExitCode: {
  readonly usage: number
  readonly unavailable: number
  readonly software: number
  readonly conflict: number
  readonly timeout: number
  readonly lost: number
  readonly cannotExecute: number
  readonly notFound: number
} = ExitCodes

/**
 * Runs the command line `argv` (as `process.argv`: the first two entries are skipped) to the exit
 * code it ends with; every failure is one line on stderr and its code. While it runs, SIGINT,
 * SIGTERM and SIGHUP are handled by it (`run` forwards them to its command).
 *
 * @example
 * ```ts
 * import { NodeContext, NodeRuntime } from "@effect/platform-node"
 * import { Effect } from "effect"
 * import { Cli } from "@lockstep/cli"
 *
 * const program = Cli.main(["node", "lockstep", "status", "--backend", "redis://localhost:6379", "nightly"])
 * NodeRuntime.runMain(program.pipe(Effect.provide(NodeContext.layer)))
 * ```
 *
 * @since 0.1.0
 * @category running
 */
export const main = (
  argv: ReadonlyArray<string>
): Effect.Effect<number, never, CliApp.Environment | CommandExecutor> =>
  Effect.provide(internal.main(argv, "0.1.0"), Layer.fresh(signals.layer))
