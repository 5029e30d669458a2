/**
 * The `lockstep` command line on `@effect/cli`: the commands, their flags and help, and the exit
 * code each run ends with.
 */
import { stripVTControlCharacters } from "node:util"
import { Args, Command, HelpDoc, Options, ValidationError } from "@effect/cli"
import type { CliApp } from "@effect/cli/CliApp"
import type { CommandExecutor } from "@effect/platform/CommandExecutor"
import { Config, Console, Effect, Ref } from "effect"
import * as Admin from "./admin.js"
import { schemes } from "./backend.js"
import { CliFailure, ExitCodes, usage } from "./errors.js"
import * as Run from "./run.js"
import type { Signals } from "./signals.js"

const help = (description: string, examples: ReadonlyArray<string>): HelpDoc.HelpDoc =>
  HelpDoc.blocks([HelpDoc.p(description), HelpDoc.h2("EXAMPLES"), ...examples.map((example) => HelpDoc.p(`  ${example}`))])

const backend = Options.text("backend").pipe(
  Options.withAlias("b"),
  Options.optional,
  Options.withDescription(`The backend URL (default: $LOCKSTEP_BACKEND): ${schemes}.`)
)
const prefix = Options.text("prefix").pipe(
  Options.optional,
  Options.withDescription(
    "Redis: the namespace of every key and channel, the client's keyPrefix (default: $LOCKSTEP_PREFIX), e.g. lockstep: for a user whose ACL allows ~lockstep:* &lockstep:*; on a Redis Cluster, hash-tag it ({lockstep}:). The other backends refuse it."
  )
)
const acceptEviction = Options.boolean("accept-eviction").pipe(
  Options.withDescription(
    "Redis: run on a server whose maxmemory-policy may evict lock keys (refused otherwise), logging every evicted key."
  )
)
/** The options every command takes: which backend, and how to use it. */
const target = { backend, prefix, acceptEviction }
const key = Args.text({ name: "KEY" }).pipe(Args.withDescription("The key of the lock (or latch)."))

const runCommand = (exit: Ref.Ref<number>) =>
  Command.make("run", {
    ...target,
    wait: Options.text("wait").pipe(
      Options.withAlias("w"),
      Options.optional,
      Options.withDescription("Wait at most this long for the lock (500ms, 10s, 2m; a bare number is seconds). Default: forever.")
    ),
    noWait: Options.boolean("no-wait").pipe(
      Options.withAlias("n"),
      Options.withDescription("Do not wait: a held lock ends lockstep at once with the conflict exit code.")
    ),
    conflictExitCode: Options.integer("conflict-exit-code").pipe(
      Options.withAlias("E"),
      Options.optional,
      Options.withDescription(`The exit code when the lock is not obtained (as flock -E). Default ${ExitCodes.conflict}.`)
    ),
    kind: Options.choice("kind", Run.kinds).pipe(
      Options.withDefault("lock"),
      Options.withDescription("lock (a mutex), fair (first come, first served), read, write, semaphore (--limit N).")
    ),
    limit: Options.integer("limit").pipe(Options.optional, Options.withDescription("The semaphore's number of permits.")),
    permits: Options.integer("permits").pipe(Options.optional, Options.withDescription("Permits to take (semaphore). Default 1.")),
    lease: Options.text("lease").pipe(
      Options.optional,
      Options.withDescription("A fixed lease, never renewed: the lock is lost (and the command stopped) when it runs out.")
    ),
    watchdog: Options.text("watchdog").pipe(
      Options.optional,
      Options.withDescription("The lease a watchdog keeps renewing every third of it while the command runs. Default 30s.")
    ),
    killAfter: Options.text("kill-after").pipe(
      Options.optional,
      Options.withDescription("After a lost lease: SIGTERM to the command's process group, SIGKILL this long after. Default 5s.")
    ),
    key,
    command: Args.text({ name: "COMMAND" }).pipe(Args.atLeast(1), Args.withDescription("The command and its arguments, after `--`."))
  }, (args) => Effect.flatMap(Run.run(args), (code) => Ref.set(exit, code))).pipe(
    Command.withDescription(help(
      "Acquire the lock, run the command with it held (stdin, stdout and stderr inherited), release it once the command has exited; exit with the command's exit code. The command sees LOCKSTEP_KEY, LOCKSTEP_FENCE and LOCKSTEP_HOLDER. SIGINT, SIGTERM and SIGHUP are forwarded to it. If the lease is lost, the command's process group gets SIGTERM, then SIGKILL after --kill-after, and lockstep exits 76.",
      [
        "lockstep run -b redis://localhost:6379 nightly-report -- ./report.sh --since yesterday",
        "lockstep run --no-wait -E 0 cleanup -- ./cleanup.sh     (skip it, exit 0, if another host runs it)",
        "lockstep run --wait 30s --backend postgres://app@db/app migrate -- npm run migrate",
        "lockstep run --kind semaphore --limit 4 encoders -- ffmpeg -i in.mov out.mp4"
      ]
    ))
  )

const statusCommand = (exit: Ref.Ref<number>) =>
  Command.make("status", {
    ...target,
    json: Options.boolean("json").pipe(Options.withDescription("Print the state as JSON.")),
    key
  }, (args) => Effect.flatMap(Admin.status(args), (code) => Ref.set(exit, code))).pipe(
    Command.withDescription(help(
      "What the backend knows of a key: the last fence, the holders (mode, fence, time left) and the fair lock's waiters.",
      ["lockstep status -b redis://localhost:6379 nightly-report", "lockstep status --json nightly-report | jq '.holders[].fence'"]
    ))
  )

const releaseCommand = (exit: Ref.Ref<number>) =>
  Command.make("release", {
    ...target,
    force: Options.boolean("force").pipe(Options.withDescription("Required: drop every holder of the key.")),
    key
  }, (args) => Effect.flatMap(Admin.release(args), (code) => Ref.set(exit, code))).pipe(
    Command.withDescription(help(
      "An operator's tool: drop every holder of a stuck key and print what was removed. A dropped holder learns of it at its next renewal (a lockstep run then stops its command).",
      ["lockstep release --force -b redis://localhost:6379 nightly-report"]
    ))
  )

const latchSet = (exit: Ref.Ref<number>) =>
  Command.make("set", { ...target, key, count: Args.integer({ name: "COUNT" }) }, (args) =>
    Effect.flatMap(Admin.latchSet(args), (code) => Ref.set(exit, code))).pipe(
      Command.withDescription(help("Set the latch's count (when it is 0); exits 1 if it is already counting.", [
        "lockstep latch set batch:7 3"
      ]))
    )

const latchCountDown = (exit: Ref.Ref<number>) =>
  Command.make("count-down", { ...target, key }, (args) =>
    Effect.flatMap(Admin.latchCountDown(args), (code) => Ref.set(exit, code))).pipe(
      Command.withDescription(help("Take one off the latch's count and print the count after.", [
        "./part.sh && lockstep latch count-down batch:7"
      ]))
    )

const latchAwait = (exit: Ref.Ref<number>) =>
  Command.make("await", {
    ...target,
    timeout: Options.text("timeout").pipe(
      Options.optional,
      Options.withDescription(`Give up after this long (exit ${ExitCodes.timeout}). Default: wait forever.`)
    ),
    key
  }, (args) => Effect.flatMap(Admin.latchAwait(args), (code) => Ref.set(exit, code))).pipe(
    Command.withDescription(help("Wait until the latch's count is 0.", [
      "lockstep latch await --timeout 10m batch:7 && ./merge.sh"
    ]))
  )

const latchCommand = (exit: Ref.Ref<number>) =>
  Command.make("latch").pipe(
    Command.withSubcommands([latchSet(exit), latchCountDown(exit), latchAwait(exit)]),
    Command.withDescription(help("A count-down latch for shell pipelines: set, count-down, await.", [
      "lockstep latch set batch:7 3; for p in a b c; do (./part.sh $p; lockstep latch count-down batch:7) & done",
      "lockstep latch await batch:7 && ./merge.sh"
    ]))
  )

const root = (exit: Ref.Ref<number>) =>
  Command.make("lockstep").pipe(
    Command.withSubcommands([runCommand(exit), statusCommand(exit), releaseCommand(exit), latchCommand(exit)]),
    Command.withDescription(help(
      "Distributed locks on the command line: run a command under a lock held on Redis (a single server, through Sentinel, or a Redis Cluster), PostgreSQL, MySQL or MariaDB, SQLite (with better-sqlite3 installed beside lockstep) or ZooKeeper.",
      [
        "lockstep run --backend redis://localhost:6379 nightly -- ./nightly.sh",
        "lockstep run -b redis://lockstep:secret@locks:6379 --prefix lockstep: nightly -- ./nightly.sh",
        "LOCKSTEP_BACKEND=postgres://app@db/app lockstep status nightly",
        "lockstep run -b mysql://app@db/app nightly -- ./nightly.sh",
        "lockstep run -b sqlite:/var/lib/app/locks.db nightly -- ./nightly.sh",
        "lockstep run -b zk://zk1:2181,zk2:2181/app nightly -- ./nightly.sh"
      ]
    ))
  )

/** `run` needs `--` before its command: what follows it is never read as lockstep's flags. */
const missingSeparator = (args: ReadonlyArray<string>): boolean =>
  args[0] === "run" && !args.includes("--") && !args.some((arg) => arg === "--help" || arg === "-h")

/**
 * @effect/cli writes its help and its usage errors in colour: only to a terminal, and not with
 * NO_COLOR set (https://no-color.org). Elsewhere (a pipe, a file) the escapes are taken out of
 * what lockstep writes to the stream, stdout and stderr each by its own.
 */
const colourOnlyOnTerminals = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.gen(function*() {
    const noColor = (yield* Effect.orElseSucceed(Config.string("NO_COLOR"), () => "")) !== ""
    const colour = (stream: { readonly isTTY?: boolean | undefined }) => !noColor && stream.isTTY === true
    const out = colour(process.stdout)
    const err = colour(process.stderr)
    if (out && err) return yield* effect
    const plain = (args: ReadonlyArray<unknown>) =>
      args.map((arg) => (typeof arg === "string" ? stripVTControlCharacters(arg) : arg))
    return yield* Console.consoleWith((console) =>
      Console.withConsole(effect, {
        ...console,
        log: (...args) => (out ? console.log(...args) : console.log(...plain(args))),
        error: (...args) => (err ? console.error(...args) : console.error(...plain(args)))
      })
    )
  })

/** Runs the command line `argv` (as `process.argv`: the first two are node and the script) to its exit code. */
export const main = (
  argv: ReadonlyArray<string>,
  version: string
): Effect.Effect<number, never, CliApp.Environment | CommandExecutor | Signals> =>
  Effect.gen(function*() {
    const exit = yield* Ref.make(0)
    if (missingSeparator(argv.slice(2))) {
      return yield* Effect.fail(usage("run: missing `--` before the command (lockstep run [options] KEY -- COMMAND [ARGS...])"))
    }
    yield* Command.run(root(exit), { name: "lockstep", version })(argv)
    return yield* Ref.get(exit)
  }).pipe(
    colourOnlyOnTerminals,
    Effect.catchAll((error) =>
      ValidationError.isValidationError(error)
        // @effect/cli printed what was wrong
        ? Effect.succeed(ExitCodes.usage)
        : Effect.as(Console.error(`lockstep: ${error.message}`), error.code)
    ),
    Effect.catchAllDefect((defect) =>
      Effect.as(
        Console.error(`lockstep: internal error: ${defect instanceof Error ? defect.message : String(defect)}`),
        ExitCodes.software
      )
    )
  )

export { CliFailure }
