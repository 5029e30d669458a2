/**
 * Databases for the SQL tests: a database of its own per test file on the machine's PostgreSQL and
 * MariaDB services (dropped afterwards), or a file in a temporary directory for SQLite.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { SqlClient } from "@effect/sql/SqlClient"
import { MysqlClient } from "@effect/sql-mysql2"
import { PgClient } from "@effect/sql-pg"
import { SqliteClient } from "@effect/sql-sqlite-node"
import { afterAll } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted } from "effect"
import { SqlBackend } from "@lockstep/sql"
import { FaultyBackend } from "@lockstep/testkit"
import type { LockBackend } from "@lockstep/core/LockBackend"

/** `LOCKSTEP_REQUIRE_SQL=1` (CI): a database that cannot be reached fails the run instead of skipping. */
export const required = process.env["LOCKSTEP_REQUIRE_SQL"] === "1"

export const postgresServer = process.env["LOCKSTEP_PG_URL"] ?? "postgres://postgres@127.0.0.1:5432"
export const mysqlServer = process.env["LOCKSTEP_MYSQL_URL"] ?? "mysql://root@127.0.0.1:3306"

export type Kind = "pg" | "mysql" | "sqlite"

/** The client layer for `url` (a server URL with a database path, or a SQLite file). */
export const clientLayer = (kind: Kind, url: string): Layer.Layer<SqlClient> =>
  (kind === "pg"
    ? PgClient.layer({ url: Redacted.make(url), connectTimeout: Duration.seconds(5) })
    : kind === "mysql"
    ? MysqlClient.layer({ url: Redacted.make(url) })
    : SqliteClient.layer({ filename: url })).pipe(Layer.orDie)

const admin = (kind: "pg" | "mysql", statement: string) =>
  Effect.runPromise(
    Effect.flatMap(SqlClient, (sql) => sql.unsafe(statement)).pipe(
      Effect.provide(clientLayer(kind, kind === "pg" ? `${postgresServer}/postgres` : mysqlServer)),
      Effect.timeout("10 seconds"),
      Effect.asVoid
    )
  )

export interface Database {
  readonly kind: Kind
  /** The URL of this file's own database. */
  readonly url: string
  readonly client: Layer.Layer<SqlClient>
}

/**
 * A database of this test file's own, dropped when the file's tests are done; `undefined` (with a
 * warning) when the server cannot be reached and the run does not require it.
 */
export const database = async (kind: Kind): Promise<Database | undefined> => {
  const name = `lockstep_test_${process.pid}_${Math.random().toString(36).slice(2, 10)}`
  if (kind === "sqlite") {
    const dir = mkdtempSync(join(tmpdir(), "lockstep-sqlite-"))
    afterAll(() => rmSync(dir, { recursive: true, force: true }))
    const url = join(dir, "locks.db")
    return { kind, url, client: clientLayer(kind, url) }
  }
  try {
    await admin(kind, `CREATE DATABASE ${name}`)
  } catch (cause) {
    if (required) throw cause
    console.warn(`${kind} suite NOT RUN: cannot create a database (${String(cause)})`)
    return undefined
  }
  afterAll(() => admin(kind, kind === "pg" ? `DROP DATABASE ${name} WITH (FORCE)` : `DROP DATABASE ${name}`))
  const url = kind === "pg" ? `${postgresServer}/${name}` : `${mysqlServer}/${name}`
  return { kind, url, client: clientLayer(kind, url) }
}

/** The backend on `db` with its own client; `options` as `SqlBackend.layer` takes them. */
export const backend = (db: Database, options?: SqlBackend.Options): Layer.Layer<LockBackend> =>
  SqlBackend.layer(options).pipe(Layer.provide(db.client), Layer.orDie)

/** The backend and a `wipe` that deletes every row of its tables: the database lost its data. */
export const losingData = (db: Database, options?: SqlBackend.Options): Layer.Layer<LockBackend | FaultyBackend.DataLoss> =>
  Layer.merge(
    SqlBackend.layer(options),
    Layer.effect(
      FaultyBackend.DataLoss,
      Effect.map(SqlClient, (sql) => ({
        wipe: Effect.orDie(Effect.forEach(["", "_ended"], (suffix) => sql.unsafe(`DELETE FROM ${options?.table ?? "lockstep_locks"}${suffix}`), {
          discard: true
        }))
      }))
    )
  ).pipe(Layer.provide(db.client), Layer.orDie)

/** An exclusive acquisition of `key` by `holder` (10 s lease), as the lock API sends it. */
export const exclusiveRequest = (key: string, holder: string, count = 1) => ({
  key,
  holder,
  mode: "exclusive" as const,
  permits: 1,
  limit: 1,
  leaseMs: 10_000,
  fair: false,
  waiterTtlMs: 1_000,
  count
})
