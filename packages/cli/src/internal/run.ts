/**
 * `lockstep run`: acquire, run the command with the lock held, release once it has exited.
 *
 * The command is a child process of the platform's `Command`, which starts it in a process group
 * of its own and signals that group: a lost lease stops the command and everything it started
 * (SIGTERM, then SIGKILL after `--kill-after`). The signals `lockstep` receives are forwarded to
 * the group, and the lock is released only once the child has exited. (Being in a group of its
 * own, the command is not in the terminal's foreground group: an interactive command that reads
 * the terminal is stopped by SIGTTIN; run such commands with stdin from a file or a pipe.)
 */
import { Command } from "@effect/platform"
import type { CommandExecutor } from "@effect/platform/CommandExecutor"
import type { PlatformError } from "@effect/platform/Error"
import { Console, Duration, Effect, Either, Option } from "effect"
import type { Scope } from "effect"
import { FairLock, Lock, ReadWriteLock, Semaphore } from "@lockstep/core"
import type { Lease } from "@lockstep/core/Lease"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { AcquireError, InvalidLockOptions, LockLost } from "@lockstep/core/LockError"
import * as Backend from "./backend.js"
import * as Durations from "./duration.js"
import { CliFailure, ExitCodes, usage } from "./errors.js"
import { exitCode as signalExitCode, Signals } from "./signals.js"

/** The kinds of hold `--kind` names. */
export const kinds = ["lock", "fair", "read", "write", "semaphore"] as const

/** What `--kind` names. */
export type Kind = (typeof kinds)[number]

/** The parsed arguments of `run`. */
export interface RunArgs extends Backend.Target {
  readonly key: string
  readonly command: ReadonlyArray<string>
  readonly wait: Option.Option<string>
  readonly noWait: boolean
  readonly conflictExitCode: Option.Option<number>
  readonly kind: Kind
  readonly permits: Option.Option<number>
  readonly limit: Option.Option<number>
  readonly lease: Option.Option<string>
  readonly watchdog: Option.Option<string>
  readonly killAfter: Option.Option<string>
}

const duration = (flag: string, value: Option.Option<string>) =>
  Option.match(value, {
    onNone: () => Effect.succeed(Option.none<Duration.Duration>()),
    onSome: (text) =>
      Either.match(Durations.parse(flag, text), {
        onLeft: (message) => Effect.fail(usage(message)),
        onRight: (d) => Effect.succeed(Option.some(d))
      })
  })

/** How long to wait: `undefined` forever, 0 not at all. */
type Wait = Duration.Duration | undefined

/** The checked settings of a run, before anything connects. */
const settings = (args: RunArgs) =>
  Effect.gen(function*() {
    const [command, ...commandArgs] = args.command
    // @effect/cli takes an unknown flag before `--` for an argument: the key would be "--bogus"
    if (args.key.startsWith("-")) return yield* Effect.fail(usage(`run: unknown option ${args.key}`))
    if (command === undefined) return yield* Effect.fail(usage("run: no command after `--`"))
    if (args.noWait && Option.isSome(args.wait)) return yield* Effect.fail(usage("run: --wait and --no-wait exclude each other"))
    if (Option.isSome(args.lease) && Option.isSome(args.watchdog)) {
      return yield* Effect.fail(usage("run: --lease and --watchdog exclude each other"))
    }
    if (args.kind !== "semaphore" && (Option.isSome(args.limit) || Option.isSome(args.permits))) {
      return yield* Effect.fail(usage("run: --limit and --permits are for --kind semaphore"))
    }
    if (args.kind === "semaphore" && Option.isNone(args.limit)) {
      return yield* Effect.fail(usage("run: --kind semaphore needs --limit N"))
    }
    const waitFor = yield* duration("--wait", args.wait)
    const wait: Wait = args.noWait ? Duration.zero : Option.getOrUndefined(waitFor)
    const lease = yield* duration("--lease", args.lease)
    const watchdog = yield* duration("--watchdog", args.watchdog)
    const killAfter = Option.getOrElse(yield* duration("--kill-after", args.killAfter), () => Duration.seconds(5))
    const conflict = Option.getOrElse(args.conflictExitCode, () => ExitCodes.conflict)
    if (!Number.isInteger(conflict) || conflict < 0 || conflict > 255) {
      return yield* Effect.fail(usage(`run: --conflict-exit-code must be 0 to 255, not ${conflict}`))
    }
    return {
      command,
      commandArgs,
      wait,
      killAfter,
      conflict,
      options: { lease: Option.getOrUndefined(lease), watchdog: Option.getOrUndefined(watchdog), name: "lockstep-cli" }
    }
  })

type Settings = Effect.Effect.Success<ReturnType<typeof settings>>

/** The hold `args` ask for: `None` when not obtained within the wait. */
const acquire = (
  args: RunArgs,
  s: Settings
): Effect.Effect<Option.Option<Lease>, AcquireError | InvalidLockOptions, LockBackend | Scope.Scope> =>
  Effect.gen(function*() {
    if (args.kind === "semaphore") {
      const semaphore = yield* Semaphore.make(args.key, { ...s.options, limit: Option.getOrElse(args.limit, () => 1) })
      const permits = Option.getOrUndefined(args.permits)
      return yield* s.wait === undefined
        ? Effect.map(Semaphore.acquire(semaphore, { permits }), Option.some)
        : Semaphore.tryAcquire(semaphore, { permits, wait: Duration.isZero(s.wait) ? undefined : s.wait })
    }
    const lock = args.kind === "lock"
      ? yield* Lock.make(args.key, s.options)
      : args.kind === "fair"
      ? yield* FairLock.make(args.key, s.options)
      : (yield* ReadWriteLock.make(args.key, s.options))[args.kind]
    return yield* s.wait === undefined
      ? Effect.map(Lock.acquire(lock), Option.some)
      : Lock.tryAcquire(lock, { wait: Duration.isZero(s.wait) ? undefined : s.wait })
  })

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)}s`

/** The line for a lock not obtained: who holds the key, as far as the backend tells. */
const conflictLine = (key: string) =>
  Effect.flatMap(LockBackend, (backend) => backend.inspect(key)).pipe(
    Effect.map((state) => {
      const holders = state.holders.map((h) =>
        `${h.holder} (${h.exclusive > 0 ? "exclusive" : `shared, ${h.permits} permit${h.permits === 1 ? "" : "s"}`}, fence ${h.fence}, ${seconds(h.ttlMs)} left)`
      )
      return holders.length === 0
        ? `"${key}" is held (its holders are not known)`
        : `"${key}" is held by ${holders.join(", ")}`
    }),
    Effect.orElseSucceed(() => `"${key}" is held`)
  )

/** The child's exit code, 128 + the signal's number when a signal ended it. */
const exitStatus = (process: { readonly exitCode: Effect.Effect<number, PlatformError> }): Effect.Effect<number> =>
  process.exitCode.pipe(
    Effect.catchAll((error) => {
      const signal = /signal: (SIG[A-Z0-9]+)/.exec(`${error.message} ${"description" in error ? String(error.description) : ""}`)
      return Effect.succeed(signal === null ? ExitCodes.software : signalExitCode(signal[1]!))
    })
  )

const spawnFailure = (command: string) => (error: PlatformError): CliFailure => {
  const text = `${error.message} ${"description" in error ? String(error.description) : ""}`
  if (/ENOENT/.test(text)) return new CliFailure({ code: ExitCodes.notFound, message: `run: ${command}: command not found` })
  if (/EACCES/.test(text)) return new CliFailure({ code: ExitCodes.cannotExecute, message: `run: ${command}: permission denied` })
  return new CliFailure({ code: ExitCodes.cannotExecute, message: `run: ${command}: cannot be run (${text.trim()})` })
}

type Outcome =
  | { readonly _tag: "Exited"; readonly code: number }
  | { readonly _tag: "Lost"; readonly error: LockLost }

/** Runs the command under `lease`; the lease is released by the caller's scope, after the child has exited. */
const runUnder = (
  s: Settings,
  lease: Lease
): Effect.Effect<number, CliFailure, CommandExecutor | Signals | Scope.Scope> =>
  Effect.gen(function*() {
    const signals = yield* Signals
    const command = Command.make(s.command, ...s.commandArgs).pipe(
      Command.stdin("inherit"),
      Command.stdout("inherit"),
      Command.stderr("inherit"),
      Command.env({ LOCKSTEP_KEY: lease.key, LOCKSTEP_FENCE: String(lease.fence), LOCKSTEP_HOLDER: lease.holder })
    )
    // the process's finalizer (SIGTERM to its group and a wait for its exit, if it still runs)
    // runs before the lease's release: the lock is never released while the command runs
    const child = yield* Command.start(command).pipe(Effect.mapError(spawnFailure(s.command)))
    yield* signals.next.pipe(
      Effect.flatMap((signal) => Effect.fork(Effect.ignore(child.kill(signal)))),
      Effect.forever,
      Effect.forkScoped
    )
    const outcome = yield* Effect.raceFirst(
      Effect.map(exitStatus(child), (code): Outcome => ({ _tag: "Exited", code })),
      Effect.map(Effect.flip(lease.lost), (error): Outcome => ({ _tag: "Lost", error }))
    )
    if (outcome._tag === "Exited") return outcome.code
    yield* Console.error(
      `lockstep: ${outcome.error.message}: stopping the command (SIGTERM, SIGKILL after ${Duration.format(s.killAfter)})`
    )
    yield* child.kill("SIGTERM").pipe(
      Effect.timeout(s.killAfter),
      Effect.catchAll(() => child.kill("SIGKILL")),
      Effect.ignore
    )
    return ExitCodes.lost
  })

/** `lockstep run`: the exit code to end with. */
export const run = (args: RunArgs): Effect.Effect<number, CliFailure, CommandExecutor | Signals> =>
  Effect.gen(function*() {
    const s = yield* settings(args)
    const signals = yield* Signals
    return yield* Backend.provide(
      args,
      Effect.scoped(Effect.gen(function*() {
        const got = yield* Effect.raceFirst(
          Effect.map(acquire(args, s), Either.right),
          Effect.map(signals.next, Either.left)
        ).pipe(
          Effect.mapError((error) =>
            error._tag === "BackendError" || error._tag === "InvalidLockOptions"
              ? Backend.failure(error)
              : new CliFailure({ code: ExitCodes.software, message: error.message })
          )
        )
        if (Either.isLeft(got)) return signalExitCode(got.left)
        if (Option.isNone(got.right)) {
          yield* Console.error(`lockstep: ${yield* conflictLine(args.key)}`)
          return s.conflict
        }
        return yield* runUnder(s, got.right.value)
      }))
    )
  })
