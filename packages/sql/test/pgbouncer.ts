/**
 * PgBouncer in front of the machine's PostgreSQL, for the tests: Debian's `pgbouncer` (1.18), a
 * process of the test's own on a free loopback port, its ini and auth file in a temporary
 * directory, killed and removed when the scope closes. Every database name maps to the same name
 * on the PostgreSQL at `LOCKSTEP_PG_URL` (default 127.0.0.1:5432), so a test file's own database is
 * reached through it by name.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { connect } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Schedule, Scope } from "effect"
import { clientLayer, type Database, database, postgresServer } from "./databases.js"
import { freePort } from "./servers.js"

/** `LOCKSTEP_REQUIRE_PGBOUNCER=1` (CI): a missing pgbouncer fails the run instead of skipping. */
export const pgbouncerRequired = process.env["LOCKSTEP_REQUIRE_PGBOUNCER"] === "1"

/** Debian's binary, or `PGBOUNCER_BIN`. */
export const pgbouncerBin = process.env["PGBOUNCER_BIN"] ?? "/usr/sbin/pgbouncer"

/** Whether the binary is there; where it is not, fails the file under `LOCKSTEP_REQUIRE_PGBOUNCER=1`. */
export const pgbouncerAvailable = (suite: string): boolean => {
  if (existsSync(pgbouncerBin)) return true
  if (pgbouncerRequired) {
    throw new Error(`${suite}: ${pgbouncerBin} not found and LOCKSTEP_REQUIRE_PGBOUNCER=1 requires it (apt-get install pgbouncer)`)
  }
  console.warn(`${suite} NOT RUN: ${pgbouncerBin} not found (apt-get install pgbouncer, or LOCKSTEP_REQUIRE_PGBOUNCER=1 to fail instead)`)
  return false
}

export type PoolMode = "transaction" | "session" | "statement"

export interface PgBouncer {
  readonly mode: PoolMode
  readonly port: number
  /** The URL of `database` through this PgBouncer (user `postgres`, no password). */
  readonly urlOf: (database: string) => string
  /** What the process printed so far. */
  readonly log: () => string
}

const isRoot = process.getuid?.() === 0

/** The uid and gid of `postgres`: PgBouncer refuses to run as root, and drops to it (`-u`). */
const postgresIds = (): [number, number] | undefined => {
  const ids = /^postgres:[^:]*:(\d+):(\d+):/m.exec(readFileSync("/etc/passwd", "utf8"))
  return ids === null ? undefined : [Number(ids[1]), Number(ids[2])]
}

/** Every child still running when Node exits (a run cut short) is killed with it. */
const children = new Set<ChildProcess>()
process.once("exit", () => {
  for (const child of children) child.kill("SIGKILL")
})

/** Resolves once something accepts a TCP connection on `port`. */
const accepts = (port: number): Effect.Effect<void, Error> =>
  Effect.async<void, Error>((resume) => {
    const socket = connect({ host: "127.0.0.1", port })
    socket.once("connect", () => {
      socket.destroy()
      resume(Effect.void)
    })
    socket.once("error", (error) => {
      socket.destroy()
      resume(Effect.fail(error))
    })
    return Effect.sync(() => socket.destroy())
  })

/**
 * PgBouncer in `mode` on a free loopback port, ready to accept connections, stopped (SIGTERM, then
 * SIGKILL) and its directory removed when the scope closes. Dies with its output where it does
 * not start within 10 seconds.
 */
export const pgbouncer = (mode: PoolMode, settings: Record<string, string | number> = {}): Effect.Effect<PgBouncer, never, Scope.Scope> =>
  Effect.gen(function*() {
    const upstream = new URL(postgresServer)
    const dir = yield* Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), "lockstep-pgbouncer-"))),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const port = yield* freePort
    const users = join(dir, "users.txt")
    writeFileSync(users, `"${decodeURIComponent(upstream.username || "postgres")}" ""\n`)
    const config: Record<string, string | number> = {
      listen_addr: "127.0.0.1",
      listen_port: port,
      // no socket file: two of these side by side would fight over /tmp/.s.PGSQL.<port>
      unix_socket_dir: "",
      auth_type: "trust",
      auth_file: users,
      // the admin console (database `pgbouncer`: SHOW CONFIG, SHOW POOLS) for the tests' checks
      admin_users: decodeURIComponent(upstream.username || "postgres"),
      pool_mode: mode,
      max_client_conn: 500,
      default_pool_size: 20,
      // the suites' own databases come and go; no pool waits for a server that is gone
      server_login_retry: 1,
      ...settings
    }
    const ini = [
      "[databases]",
      `* = host=${upstream.hostname} port=${upstream.port || 5432}`,
      "[pgbouncer]",
      ...Object.entries(config).map(([key, value]) => `${key} = ${value}`)
    ].join("\n")
    const file = join(dir, "pgbouncer.ini")
    writeFileSync(file, `${ini}\n`)
    const ids = isRoot ? postgresIds() : undefined
    if (ids !== undefined) for (const path of [dir, file, users]) chownSync(path, ...ids)
    const args = isRoot ? ["-u", ids === undefined ? "nobody" : "postgres", file] : [file]

    let output = ""
    const exited = yield* Deferred.make<string>()
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        const child = spawn(pgbouncerBin, args, { stdio: ["ignore", "pipe", "pipe"] })
        const append = (chunk: Buffer) => {
          output = (output + chunk.toString()).slice(-20_000)
        }
        child.stdout.on("data", append)
        child.stderr.on("data", append)
        child.on("error", (error) => Deferred.unsafeDone(exited, Exit.succeed(error.message)))
        child.on("exit", (code, signal) => {
          children.delete(child)
          Deferred.unsafeDone(exited, Exit.succeed(signal === null ? `exit code ${code}` : `killed by ${signal}`))
        })
        children.add(child)
        return child
      }),
      (child) =>
        Effect.gen(function*() {
          if (yield* Deferred.isDone(exited)) return
          child.kill("SIGTERM")
          const ended = yield* Effect.timeout(Deferred.await(exited), Duration.seconds(3)).pipe(Effect.option)
          if (ended._tag === "None") {
            child.kill("SIGKILL")
            yield* Effect.timeout(Deferred.await(exited), Duration.seconds(5)).pipe(Effect.ignore)
          }
        })
    )
    yield* Effect.raceFirst(
      Effect.retry(accepts(port), Schedule.spaced("50 millis")),
      Effect.flatMap(Deferred.await(exited), (how) => Effect.die(new Error(`pgbouncer exited (${how}):\n${output}`)))
    ).pipe(
      Effect.timeoutFail({ duration: Duration.seconds(10), onTimeout: () => new Error(`pgbouncer did not start:\n${output}`) }),
      Effect.orDie
    )
    const credentials = upstream.username === "" ? "postgres" : upstream.username
    return {
      mode,
      port,
      urlOf: (database) => `postgres://${credentials}@127.0.0.1:${port}/${database}`,
      log: () => output
    }
  })

/**
 * This test file's own database (on the machine's PostgreSQL, dropped afterwards) reached through a
 * PgBouncer of its own in `mode` (stopped first); `undefined` where pgbouncer or PostgreSQL is
 * missing and the run does not require them.
 */
export const databaseThrough = async (mode: PoolMode, suite: string): Promise<{ readonly direct: Database; readonly pooled: Database } | undefined> => {
  if (!pgbouncerAvailable(suite)) return undefined
  const direct = await database("pg")
  if (direct === undefined) return undefined
  const scope = Effect.runSync(Scope.make())
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const bouncer = await Effect.runPromise(Scope.extend(pgbouncer(mode), scope))
  const url = bouncer.urlOf(new URL(direct.url).pathname.slice(1))
  return { direct, pooled: { kind: "pg", url, client: clientLayer("pg", url) } }
}
