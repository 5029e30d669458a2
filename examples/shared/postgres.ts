/**
 * The examples' PostgreSQL: the machine's own (`LOCKSTEP_PG_URL`, a server URL without a
 * database, default `postgres://postgres@127.0.0.1:5432`, as the repository's tests use), in a
 * database of the run's own, created for it and dropped afterwards.
 */
import { PgClient } from "@effect/sql-pg"
import { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql/SqlError"
import { Console, Effect, Layer, Redacted } from "effect"

export const pgUrl = (process.env["LOCKSTEP_PG_URL"] ?? "postgres://postgres@127.0.0.1:5432").replace(/\/$/, "")

/** Runs `statement` on the server's `postgres` database (to create and drop databases). */
const onServer = (statement: string): Effect.Effect<void, SqlError> =>
  Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(statement)).pipe(
    Effect.asVoid,
    Effect.provide(PgClient.layer({ url: Redacted.make(`${pgUrl}/postgres`) }))
  )

/**
 * A `PgClient` (and `SqlClient`) on a new database `lockstep_example_<example>_<random>`, dropped
 * when the layer closes (after the client has closed).
 */
export const temporaryDatabase = (example: string): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, SqlError> =>
  Layer.unwrapScoped(Effect.gen(function*() {
    const name = `lockstep_example_${example.replace(/\W/g, "_")}_${crypto.randomUUID().slice(0, 8)}`
    yield* Effect.acquireRelease(
      onServer(`CREATE DATABASE ${name}`),
      () =>
        onServer(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).pipe(
          Effect.zipRight(Console.log(`(dropped the run's database ${name})`)),
          Effect.orDie
        )
    )
    return PgClient.layer({ url: Redacted.make(`${pgUrl}/${name}`) })
  }))
