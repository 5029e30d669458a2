/**
 * What `SqlBackend.layerConfig` says when it cannot connect: the endpoint (never a password) and
 * the driver's own reason, for a dead port, a missing database, an unknown user and a wrong
 * password on PostgreSQL and MariaDB, an unopenable SQLite file and an unset `DATABASE_URL`. Each
 * prints the message it got.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Cause, Config, ConfigProvider, Context, Effect, Exit, Fiber, Layer, Option, Redacted, Scope } from "effect"
import * as SqlClient from "@effect/sql/SqlClient"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { SqlBackend } from "@lockstep/sql"
import { mysqlServer, postgresServer, required } from "./fixtures/databases.js"
import { freePort, type OwnServer, ownPostgresWith, ownServersAvailable } from "./fixtures/servers.js"

const suffix = `${process.pid}_${Math.random().toString(36).slice(2, 8)}`
const password = `Pw-${suffix}-secret`

/** The message `layerConfig` fails with on `url`. */
const connectMessage = (label: string, url: string) =>
  Effect.gen(function*() {
    const error = yield* Effect.flip(Effect.scoped(Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(url))))))
    console.log(`[${label}] ${error.message}`)
    return error
  })

/** `server` (a URL without a path) with another user, password or database. */
const variant = (server: string, change: { user?: string; password?: string; database?: string; port?: number }) => {
  const url = new URL(server)
  if (change.user !== undefined) url.username = change.user
  if (change.password !== undefined) url.password = change.password
  if (change.port !== undefined) url.port = String(change.port)
  url.pathname = `/${change.database ?? "lockstep"}`
  return url.toString()
}

/** How an endpoint is named: host and port of the URL (never its user or password), then the database. */
const endpointOf = (label: string, url: string) => {
  const parsed = new URL(url)
  return `${label} ${parsed.hostname}:${parsed.port}${parsed.pathname}`
}

/**
 * Whether a server answers at all: the suites are skipped (with a warning) where it does not. Its
 * database has no lock tables: a backend that connected fails its check of them, past `connect`.
 */
const reachable = async (kind: "PostgreSQL" | "MySQL", url: string): Promise<boolean> => {
  const exit = await Effect.runPromiseExit(
    Effect.scoped(Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(url)), { createSchema: false })))
  )
  const connected = Exit.match(exit, {
    onSuccess: () => true,
    onFailure: (cause) => Option.exists(Cause.failureOption(cause), (error) => error._tag === "BackendError" && error.operation !== "connect")
  })
  if (connected) return true
  if (required) throw new Error(`${kind} at ${url} cannot be reached`)
  console.warn(`${kind} connect suite NOT RUN: cannot connect to ${url}`)
  return false
}

const pgUp = await reachable("PostgreSQL", variant(postgresServer, { database: "postgres" }))
describe.runIf(pgUp)("connecting to PostgreSQL fails with the endpoint and the server's reason", () => {
  it.scopedLive("a port nothing listens on", () =>
    Effect.gen(function*() {
      const url = variant(postgresServer, { port: yield* freePort })
      const error = yield* connectMessage("pg dead port", url)
      assert.strictEqual(error._tag, "BackendError")
      assert.include(error.message, `during connect on ${endpointOf("PostgreSQL", url)}: `)
      assert.include(error.message, "ECONNREFUSED")
    }))

  it.scopedLive("a database that does not exist", () =>
    Effect.gen(function*() {
      const url = variant(postgresServer, { database: `lockstep_missing_${suffix}` })
      const error = yield* connectMessage("pg missing database", url)
      assert.strictEqual(
        error.message,
        `lock backend failed during connect on ${endpointOf("PostgreSQL", url)}: database "lockstep_missing_${suffix}" does not exist`
      )
    }))

  it.scopedLive("a role that does not exist", () =>
    Effect.gen(function*() {
      const url = variant(postgresServer, { user: `nobody_${suffix}`, database: "postgres" })
      const error = yield* connectMessage("pg unknown role", url)
      assert.strictEqual(
        error.message,
        `lock backend failed during connect on ${endpointOf("PostgreSQL", url)}: role "nobody_${suffix}" does not exist`
      )
    }))
})

// the machine's PostgreSQL trusts every loopback connection: a server of the test's own asks for a password
const servers = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(servers, Exit.void)))
const checking: OwnServer | undefined = ownServersAvailable
  ? await Effect.runPromise(Scope.extend(ownPostgresWith({ password }), servers))
  : undefined
if (checking === undefined) {
  if (required) throw new Error("the SQL connect tests need initdb/pg_ctl on this machine")
  console.warn("PostgreSQL wrong-password test NOT RUN: initdb/pg_ctl not installed")
}
describe.runIf(checking !== undefined)("connecting to a PostgreSQL server that checks passwords", () => {
  it.scopedLive("the right password connects; a wrong one fails with the server's reason and never shows a password", () =>
    Effect.gen(function*() {
      yield* Effect.scoped(Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(checking!.url)))))
      const wrong = `${password}-wrong`
      const url = variant(checking!.url, { password: wrong })
      const error = yield* connectMessage("pg wrong password", url)
      assert.strictEqual(
        error.message,
        `lock backend failed during connect on ${endpointOf("PostgreSQL", url)}: password authentication failed for user "postgres"`
      )
      assert.notInclude(error.message, password)
      assert.notInclude(JSON.stringify(error), password)
    }), 60_000)
})

const mysqlUp = await reachable("MySQL", variant(mysqlServer, { database: "mysql" }))
describe.runIf(mysqlUp)("connecting to MariaDB fails with the endpoint and the server's reason", () => {
  it.scopedLive("a port nothing listens on", () =>
    Effect.gen(function*() {
      const url = variant(mysqlServer, { port: yield* freePort })
      const error = yield* connectMessage("mysql dead port", url)
      assert.strictEqual(error._tag, "BackendError")
      assert.include(error.message, `during connect on ${endpointOf("MySQL", url)}: `)
      assert.include(error.message, "ECONNREFUSED")
    }))

  it.scopedLive("a database that does not exist", () =>
    Effect.gen(function*() {
      const url = variant(mysqlServer, { database: `lockstep_missing_${suffix}` })
      const error = yield* connectMessage("mysql missing database", url)
      assert.strictEqual(
        error.message,
        `lock backend failed during connect on ${endpointOf("MySQL", url)}: Unknown database 'lockstep_missing_${suffix}'`
      )
    }))

  it.scopedLive("a user that does not exist", () =>
    Effect.gen(function*() {
      const url = variant(mysqlServer, { user: `nobody_${suffix}`, database: "mysql" })
      const error = yield* connectMessage("mysql unknown user", url)
      assert.include(error.message, `lock backend failed during connect on ${endpointOf("MySQL", url)}: Access denied for user 'nobody_${suffix}'@`)
    }))

  it.scopedLive("a wrong password: the server's reason, never the password", () =>
    Effect.gen(function*() {
      const url = variant(mysqlServer, { password, database: "mysql" })
      const error = yield* connectMessage("mysql wrong password", url)
      assert.include(error.message, `lock backend failed during connect on ${endpointOf("MySQL", url)}: Access denied for user '`)
      assert.include(error.message, "(using password: YES)")
      assert.notInclude(error.message, password)
      assert.notInclude(JSON.stringify(error), password)
    }))

  it.scopedLive("a mariadb: URL is named as the MariaDB it is", () =>
    Effect.gen(function*() {
      const url = variant(mysqlServer, { database: `lockstep_missing_${suffix}` }).replace(/^mysql:/, "mariadb:")
      const error = yield* connectMessage("mariadb missing database", url)
      assert.include(error.message, `during connect on ${endpointOf("MariaDB", url)}: Unknown database`)
    }))
})

describe("connecting to SQLite fails with the file and the driver's reason", () => {
  it.scopedLive("a file in a directory that does not exist", () =>
    Effect.gen(function*() {
      const file = join(tmpdir(), `lockstep-missing-${suffix}`, "locks.db")
      const error = yield* connectMessage("sqlite unopenable", `sqlite:${file}`)
      assert.strictEqual(
        error.message,
        `lock backend failed during connect on SQLite ${file}: Cannot open database because the directory does not exist`
      )
    }))

  it.scopedLive("a directory where the file should be", () =>
    Effect.gen(function*() {
      const error = yield* connectMessage("sqlite directory", `sqlite:${tmpdir()}`)
      assert.strictEqual(error._tag, "BackendError")
      assert.include(error.message, `lock backend failed during connect on SQLite ${tmpdir()}: `)
    }))
})

describe("opening a SQLite file that another connection holds locked", () => {
  // As when another process opens the file at the same moment: a connection holds the file's
  // exclusive lock, still in rollback-journal mode (switching to WAL, the client's first statement,
  // needs that lock). The driver waits for a lock synchronously, for its busy timeout of 5 s, and
  // this process's holder cannot let go meanwhile; then the switch fails with SQLITE_BUSY, and the
  // layer must try again rather than fail.
  it.scopedLive("the layer tries again until the lock is let go, then opens the file", () =>
    Effect.gen(function*() {
      const dir = mkdtempSync(join(tmpdir(), "lockstep-busy-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const file = join(dir, "locks.db")
      const holder = yield* Layer.build(SqliteClient.layer({ filename: file, disableWAL: true }))
      const sql = Context.get(holder, SqlClient.SqlClient)
      yield* sql.unsafe("CREATE TABLE held (x INTEGER)")
      yield* sql.unsafe("BEGIN EXCLUSIVE")
      const opening = yield* Effect.fork(Effect.scoped(Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(`sqlite:${file}`))))))
      yield* Effect.sleep("300 millis")
      assert.isTrue(Option.isNone(yield* Fiber.poll(opening)), "the layer ended (failed) while the file was locked")
      yield* sql.unsafe("COMMIT")
      yield* Fiber.join(opening)
    }), 30_000)
})

describe("an unset URL names the variable", () => {
  const empty = Layer.setConfigProvider(ConfigProvider.fromMap(new Map()))

  it.scopedLive("DATABASE_URL, the default", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Effect.scoped(Layer.build(SqlBackend.layerConfig().pipe(Layer.provide(empty)))))
      console.log(`[unset DATABASE_URL] ${error.message}`)
      assert.strictEqual(error._tag, "ConfigError")
      assert.include(error.message, "Expected DATABASE_URL to exist")
    }))

  it.scopedLive("a variable of the caller's, read as a secret", () =>
    Effect.gen(function*() {
      const layer = SqlBackend.layerConfig(Config.redacted("LOCKS_DATABASE_URL")).pipe(Layer.provide(empty))
      const error = yield* Effect.flip(Effect.scoped(Layer.build(layer)))
      console.log(`[unset LOCKS_DATABASE_URL] ${error.message}`)
      assert.include(error.message, "Expected LOCKS_DATABASE_URL to exist")
    }))

  it.scopedLive("a set secret that is not a URL never shows its value", () =>
    Effect.gen(function*() {
      const provider = Layer.setConfigProvider(ConfigProvider.fromMap(new Map([["DATABASE_URL", password]])))
      const error = yield* Effect.flip(Effect.scoped(Layer.build(SqlBackend.layerConfig().pipe(Layer.provide(provider)))))
      console.log(`[DATABASE_URL not a URL] ${error.message}`)
      assert.notInclude(error.message, password)
    }))
})
