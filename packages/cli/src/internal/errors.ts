/**
 * The exit codes of `lockstep` and the one failure its commands end with: a line for stderr and
 * the code to exit with.
 */
import { Data } from "effect"

/** The codes `lockstep` exits with on its own account (the README's "Exit codes"). */
export const ExitCodes = {
  /** Bad flags, a bad duration, an unknown backend scheme, `--` missing before the command. */
  usage: 64,
  /** The backend cannot be reached or failed while acquiring. */
  unavailable: 69,
  /** A failure of `lockstep` itself. */
  software: 70,
  /** The lock was not obtained (`--no-wait`, `--wait` ran out); `--conflict-exit-code` changes it. */
  conflict: 75,
  /** `latch await --timeout` ran out before the count reached 0. */
  timeout: 75,
  /** The lease was lost while the command ran: the command was stopped. */
  lost: 76,
  /** The command could not be executed (not executable). */
  cannotExecute: 126,
  /** The command was not found. */
  notFound: 127
} as const

/** A command's failure: `message` (one line) goes to stderr, `code` is the exit code. */
export class CliFailure extends Data.TaggedError("CliFailure")<{
  readonly code: number
  readonly message: string
}> {}

/** A usage failure (exit code 64). */
export const usage = (message: string): CliFailure => new CliFailure({ code: ExitCodes.usage, message })
