/**
 * What the server launchers (Redis, ZooKeeper) share: spawning, waiting for, signalling, killing
 * and restarting their child processes, free loopback ports, temp dirs, and the `exit` hook that
 * cleans up after them if Node exits first.
 *
 * @since 0.1.0
 * @internal
 */
import type { ChildProcess } from "node:child_process"
import { spawn } from "node:child_process"
import { rmSync } from "node:fs"
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import { Deferred, Duration, Effect, Exit, Option, Ref, Schedule, Scope } from "effect"

/** The loopback address every server binds. */
export const HOST = "127.0.0.1"

const ERROR_TAIL_LINES = 25
const TERM_GRACE = Duration.seconds(2)
const KILL_WAIT = Duration.seconds(5)

const tailLines = (text: string, lines: number = ERROR_TAIL_LINES): string =>
  text.trimEnd().split("\n").slice(-lines).join("\n")

export const withLog = (message: string, log: string): string => {
  const tail = tailLines(log)
  return tail === "" ? `${message} (no output)` : `${message}; last output:\n${tail}`
}

/** Listens on `port` (0: any) on the loopback address and returns the open server and its port. */
export const listen = (
  port: number
): Effect.Effect<Option.Option<{ readonly server: net.Server; readonly port: number }>> =>
  Effect.async((resume) => {
    const server = net.createServer()
    let settled = false
    server.once("error", () => {
      if (!settled) {
        settled = true
        resume(Effect.succeed(Option.none()))
      }
    })
    server.listen({ port, host: HOST, exclusive: true }, () => {
      const address = server.address()
      if (settled) return
      settled = true
      if (address !== null && typeof address === "object") {
        resume(Effect.succeed(Option.some({ server, port: address.port })))
      } else {
        server.close()
        resume(Effect.succeed(Option.none()))
      }
    })
    return Effect.sync(() => {
      server.close()
    })
  })

export const close = (server: net.Server): Effect.Effect<void> =>
  Effect.async<void>((resume) => {
    server.close(() => resume(Effect.void))
  })

export interface ExitInfo {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly error?: Error
}

export const describeExit = (info: ExitInfo): string =>
  info.error !== undefined
    ? info.error.message
    : info.signal !== null
    ? `killed by ${info.signal}`
    : `exit code ${String(info.code)}`

export interface Proc {
  readonly child: ChildProcess
  readonly pid: number
  readonly exited: Deferred.Deferred<ExitInfo>
  /** The tail of stdout + stderr (servers log to one or the other). */
  readonly log: { text: string }
}

/** What is left to clean up if the Node process exits before the scopes close. */
interface Leftovers {
  readonly children: Set<ChildProcess>
  readonly dirs: Set<string>
}

/**
 * Children still alive are SIGKILLed, and temp dirs removed, if the Node process exits before
 * their scopes close. Kept on `globalThis` under `key` so that one `exit` hook serves every copy
 * of a launcher's module in a process (test runners may evaluate it once per test file).
 */
const leftovers = (key: string): Leftovers => {
  const symbol = Symbol.for(key)
  const holder = globalThis as { [symbol]?: Leftovers }
  const existing = holder[symbol]
  if (existing !== undefined) return existing
  const created: Leftovers = { children: new Set(), dirs: new Set() }
  holder[symbol] = created
  process.once("exit", () => {
    for (const child of created.children) {
      try {
        child.kill("SIGKILL")
      } catch {
        // nothing left to do while exiting
      }
    }
    for (const dir of created.dirs) {
      try {
        rmSync(dir, { recursive: true, force: true })
      } catch {
        // nothing left to do while exiting
      }
    }
  })
  return created
}

const signal = (proc: Proc, sig: NodeJS.Signals): Effect.Effect<boolean> =>
  Effect.sync(() => {
    try {
      return proc.child.kill(sig)
    } catch {
      return false
    }
  })

const isAlive = (proc: Proc): Effect.Effect<boolean> =>
  Effect.map(Deferred.isDone(proc.exited), (done) => !done)

/** SIGCONT + SIGTERM, SIGKILL after the grace period; never fails. */
const terminate = (proc: Proc): Effect.Effect<void> =>
  Effect.gen(function*() {
    if (!(yield* isAlive(proc))) return
    yield* signal(proc, "SIGCONT")
    yield* signal(proc, "SIGTERM")
    const ended = yield* Deferred.await(proc.exited).pipe(Effect.timeout(TERM_GRACE), Effect.option)
    if (Option.isSome(ended)) return
    yield* signal(proc, "SIGKILL")
    yield* Deferred.await(proc.exited).pipe(Effect.timeout(KILL_WAIT), Effect.ignore)
  })

/** Where the launchers differ: their error type, their wording, and their own `exit` hook. */
export interface Config<E> {
  /** The `Symbol.for` key of the launcher's leftovers. */
  readonly leftoversKey: string
  /** How much of the output `Proc.log` keeps. */
  readonly logTailChars: number
  /** The server's name in messages, e.g. `redis-server`. */
  readonly name: string
  /** Appended when the binary is not found (ENOENT). */
  readonly notFoundHint: string
  readonly error: (props: { readonly message: string; readonly cause?: unknown }) => E
}

/** The process a server runs now, with the scope whose closing ends it. */
interface Running {
  readonly proc: Proc
  readonly scope: Scope.CloseableScope
}

/** The controls of a server that both launchers expose as they are. */
export type Controls<E> =
  & {
    readonly pid: Effect.Effect<Option.Option<number>>
    readonly isRunning: Effect.Effect<boolean>
    readonly logs: Effect.Effect<string>
  }
  & { readonly [K in "kill" | "restart" | "pause" | "resume"]: Effect.Effect<void, E> }

/** A server's one process at a time: started, killed and restarted in place, until closed. */
export interface Slot<E> {
  /** SIGKILLs the current process (if any) and forgets it. */
  readonly killCurrent: (port: number) => Effect.Effect<void, E>
  /**
   * Spawns `bin` as the current process (the previous one must be stopped) and waits for `ready`;
   * if that fails the process is SIGKILLed and forgotten.
   */
  readonly start: (
    port: number,
    bin: string,
    args: ReadonlyArray<string>,
    ready: (proc: Proc) => Effect.Effect<void, E>
  ) => Effect.Effect<void, E>
  /** Refuses later restarts and gracefully stops the current process (if any). */
  readonly close: Effect.Effect<void>
  /**
   * The server's controls on `port`, each run under `serialized`; `restart` stops the current
   * process and runs `start`, `cannot` words the failures.
   */
  readonly controls: (options: {
    readonly port: number
    readonly serialized: <A, E2, R>(effect: Effect.Effect<A, E2, R>) => Effect.Effect<A, E2, R>
    readonly cannot: (what: string, why: string) => E
    readonly start: Effect.Effect<void, E>
  }) => Controls<E>
}

export interface ServerProcess<E> {
  /** Spawns `bin`; fails (with the spawn error) if it cannot be started at all. */
  readonly spawnProcess: (bin: string, args: ReadonlyArray<string>) => Effect.Effect<Proc, E>
  /** SIGKILL, then wait (bounded) for the exit. */
  readonly forceKill: (proc: Proc, port: number) => Effect.Effect<void, E>
  /** A temp dir removed when the scope closes (or when the Node process exits first). */
  readonly tempDir: (prefix: string) => Effect.Effect<string, E, Scope.Scope>
  /**
   * Retries `probe` until it succeeds, failing early (with the log tail) if the process exits
   * first, and (with the log tail) after `timeout`.
   */
  readonly awaitReady: (options: {
    readonly proc: Proc
    readonly probe: Effect.Effect<unknown, E>
    readonly interval: Duration.Duration
    readonly timeout: Duration.Duration
    readonly exitedEarly: (info: ExitInfo) => string
    readonly timedOut: () => string
  }) => Effect.Effect<void, E>
  readonly makeSlot: Effect.Effect<Slot<E>>
}

/** A slot whose processes `spawnProcess` starts and `forceKill` kills (a launcher's own). */
const slotOf = <E>(
  spawnProcess: ServerProcess<E>["spawnProcess"],
  forceKill: ServerProcess<E>["forceKill"]
): Effect.Effect<Slot<E>> =>
  Effect.gen(function*() {
    const current = yield* Ref.make(Option.none<Running>())
    const closed = yield* Ref.make(false)

    /** Gracefully stops the current process (if any) and forgets it. */
    const stopCurrent = Effect.flatMap(Ref.getAndSet(current, Option.none()), (running) =>
      Option.match(running, {
        onNone: () => Effect.void,
        onSome: ({ scope }) => Scope.close(scope, Exit.void)
      }))

    const killCurrent = (port: number): Effect.Effect<void, E> =>
      Effect.flatMap(Ref.get(current), (option) =>
        Option.match(option, {
          onNone: () => Effect.void,
          onSome: ({ proc, scope }) =>
            forceKill(proc, port).pipe(
              Effect.zipRight(Scope.close(scope, Exit.void)),
              Effect.zipRight(Ref.set(current, Option.none()))
            )
        }))

    const start = (
      port: number,
      bin: string,
      args: ReadonlyArray<string>,
      ready: (proc: Proc) => Effect.Effect<void, E>
    ): Effect.Effect<void, E> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function*() {
          const scope = yield* Scope.make()
          const proc = yield* Effect.acquireRelease(spawnProcess(bin, args), terminate).pipe(
            Scope.extend(scope),
            Effect.tapError(() => Scope.close(scope, Exit.void))
          )
          yield* Ref.set(current, Option.some({ proc, scope }))
          yield* restore(ready(proc)).pipe(
            Effect.onError(() =>
              forceKill(proc, port).pipe(
                Effect.ignore,
                Effect.zipRight(Scope.close(scope, Exit.void)),
                Effect.zipRight(Ref.set(current, Option.none()))
              )
            )
          )
        })
      )

    const close = Effect.zipRight(Ref.set(closed, true), stopCurrent)

    /** The current process while it is alive. */
    const running: Effect.Effect<Option.Option<Proc>> = Effect.flatMap(Ref.get(current), (option) =>
      Option.match(option, {
        onNone: () => Effect.succeed(Option.none()),
        onSome: ({ proc }) => Effect.map(isAlive(proc), (alive) => (alive ? Option.some(proc) : Option.none()))
      }))

    const controls: Slot<E>["controls"] = ({ cannot, port, serialized, start }) => {
      const requireRunning = (what: string): Effect.Effect<Proc, E> =>
        Effect.flatMap(running, (option) =>
          Option.match(option, {
            onNone: () => Effect.fail(cannot(what, "it is not running")),
            onSome: Effect.succeed
          }))

      const signalling = (what: string, sig: NodeJS.Signals): Effect.Effect<void, E> =>
        serialized(Effect.flatMap(requireRunning(what), (proc) =>
          Effect.flatMap(signal(proc, sig), (sent) => sent ? Effect.void : Effect.fail(cannot(what, `${sig} failed`)))))

      return {
        pid: Effect.map(running, Option.map((proc) => proc.pid)),
        isRunning: Effect.map(running, Option.isSome),
        logs: Effect.map(Ref.get(current), Option.match({ onNone: () => "", onSome: ({ proc }) => proc.log.text })),
        kill: serialized(killCurrent(port)),
        restart: serialized(
          Effect.flatMap(Ref.get(closed), (isClosed) =>
            isClosed
              ? Effect.fail(cannot("restart", "its scope is closed"))
              : Effect.zipRight(stopCurrent, start))
        ),
        pause: signalling("pause", "SIGSTOP"),
        resume: signalling("resume", "SIGCONT")
      }
    }

    return { killCurrent, start, close, controls }
  })

export const make = <E>(config: Config<E>): ServerProcess<E> => {
  const spawnProcess = (bin: string, args: ReadonlyArray<string>): Effect.Effect<Proc, E> =>
    Effect.gen(function*() {
      const exited = yield* Deferred.make<ExitInfo>()
      const log = { text: "" }
      const append = (chunk: Buffer | string): void => {
        log.text = (log.text + chunk.toString()).slice(-config.logTailChars)
      }
      // Spawning and wiring every listener happen in one synchronous step, so that no event
      // (notably a spawn `error`, which would otherwise be unhandled) can slip in between.
      const child = yield* Effect.try({
        try: () => {
          const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] })
          child.stdout?.on("data", append)
          child.stderr?.on("data", append)
          child.stdout?.on("error", () => undefined)
          child.stderr?.on("error", () => undefined)
          child.on("error", (error) => {
            append(`\n[${bin}] ${error.message}\n`)
            if (child.pid === undefined) Deferred.unsafeDone(exited, Exit.succeed({ code: null, signal: null, error }))
          })
          child.on("exit", (code, sig) => {
            leftovers(config.leftoversKey).children.delete(child)
            Deferred.unsafeDone(exited, Exit.succeed({ code, signal: sig }))
          })
          if (child.pid !== undefined) leftovers(config.leftoversKey).children.add(child)
          return child
        },
        catch: (cause) => config.error({ message: `cannot start ${bin}: ${String(cause)}`, cause })
      })
      const pid = child.pid
      if (pid === undefined) {
        const info = yield* Deferred.await(exited)
        const hint = (info.error as NodeJS.ErrnoException | undefined)?.code === "ENOENT" ? config.notFoundHint : ""
        return yield* Effect.fail(config.error({
          message: `cannot start ${bin}: ${describeExit(info)}${hint}`,
          cause: info.error
        }))
      }
      return { child, pid, exited, log }
    })

  const forceKill = (proc: Proc, port: number): Effect.Effect<void, E> =>
    Effect.gen(function*() {
      if (!(yield* isAlive(proc))) return
      yield* signal(proc, "SIGKILL")
      yield* Deferred.await(proc.exited).pipe(
        Effect.timeoutFail({
          duration: KILL_WAIT,
          onTimeout: () =>
            config.error({
              message: `${config.name} (pid ${proc.pid}, port ${port}) did not exit within ${
                Duration.format(KILL_WAIT)
              } of SIGKILL`
            })
        })
      )
    })

  const tempDir = (prefix: string): Effect.Effect<string, E, Scope.Scope> =>
    Effect.acquireRelease(
      Effect.tryPromise({
        try: () => fs.mkdtemp(path.join(os.tmpdir(), prefix)),
        catch: (cause) => config.error({ message: `cannot create a temp dir: ${String(cause)}`, cause })
      }).pipe(Effect.tap((dir) => Effect.sync(() => leftovers(config.leftoversKey).dirs.add(dir)))),
      (dir) =>
        Effect.promise(() => fs.rm(dir, { recursive: true, force: true }).catch(() => undefined)).pipe(
          Effect.zipRight(Effect.sync(() => leftovers(config.leftoversKey).dirs.delete(dir)))
        )
    )

  const awaitReady: ServerProcess<E>["awaitReady"] = ({ exitedEarly, interval, probe, proc, timedOut, timeout }) =>
    Effect.raceFirst(
      Effect.asVoid(Effect.retry(probe, Schedule.spaced(interval))),
      Effect.flatMap(
        Deferred.await(proc.exited),
        (info) => Effect.fail(config.error({ message: withLog(exitedEarly(info), proc.log.text) }))
      )
    ).pipe(
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () => config.error({ message: withLog(timedOut(), proc.log.text) })
      })
    )

  const makeSlot: Effect.Effect<Slot<E>> = slotOf(spawnProcess, forceKill)

  return { spawnProcess, forceKill, tempDir, awaitReady, makeSlot }
}
