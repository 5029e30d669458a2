/**
 * The backend's tables: created if absent (or, with `createSchema: false`, checked for every right
 * the backend uses), and swept of the rows that no longer matter. A refusal for want of a right or
 * of a table says what to do about it.
 */
import { Effect, Schedule } from "effect"
import type { Duration, Scope } from "effect"
import { BackendError } from "@lockstep/core/LockError"
import type { SqlClient } from "@effect/sql/SqlClient"
import { type Calls, execute } from "./calls.js"
import type * as Dialect from "./dialect.js"
import { driverMessage } from "./endpoint.js"
import type { Storage } from "./settings.js"

/** What the backend starts its tables with. */
export interface TablesContext extends Storage {
  readonly sql: SqlClient
  readonly calls: Calls
  readonly endpoint: string
  /** Names the row the check of the rights uses. */
  readonly clientId: string
}

/**
 * Creates the tables if absent (`create`), or checks that the backend may use them as they are:
 * every right it uses at run time, used once on a row of its own that it leaves as it found it
 * (absent), so that a role short of one fails here, not at its first lock.
 */
export const prepare = (context: TablesContext, create: boolean): Effect.Effect<void, BackendError> =>
  create
    ? createSchema(context.sql, context.dialect, context.endpoint).pipe(Effect.mapError((error) => explained(error, context, "create")))
    : check(context).pipe(Effect.mapError((error) => explained(error, context, "use")))

const check = ({ calls, clientId, dialect }: TablesContext): Effect.Effect<void, BackendError> => {
  const probe = `lockstep-check:${clientId}`
  return calls.inTransaction("checkTables", (connection) =>
    Effect.forEach(
      [
        ...dialect.lockRows([probe]),
        ...dialect.write([{ name: probe, state: "", expiresAt: 0, version: 0 }], [], { name: probe, ended: [["check", 0]] }),
        dialect.readEnded(probe, ["check"]),
        ...dialect.forget(probe)
      ],
      (statement) => execute(connection, statement),
      { discard: true }
    ))
}

/** Deletes the rows whose time has passed, every `interval`, for as long as the scope lasts. */
export const sweepEvery = (calls: Calls, dialect: Dialect.Dialect, interval: Duration.Duration): Effect.Effect<void, never, Scope.Scope> => {
  const sweep = calls.inTransaction("sweep", (connection) => Effect.forEach(dialect.sweep, (statement) => execute(connection, statement)))
  return Effect.asVoid(Effect.forkScoped(Effect.ignore(sweep).pipe(Effect.repeat(Schedule.spaced(interval)), Effect.interruptible)))
}

/**
 * Creates the tables if absent. Two processes doing it at once can make one `CREATE … IF NOT
 * EXISTS` fail (PostgreSQL's catalog unique violation); run again, it finds the table there.
 */
export const createSchema = (sql: SqlClient, dialect: Dialect.Dialect, endpoint: string): Effect.Effect<void, BackendError> =>
  Effect.forEach(dialect.createSchema, (statement) =>
    Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.execute(statement, [], undefined))).pipe(
      Effect.retry({ times: 1, while: (cause) => dialect.refusal(cause) === undefined })
    ), { discard: true }).pipe(
      Effect.mapError((cause) => new BackendError({ operation: "createSchema", cause, endpoint, detail: driverMessage(cause) }))
    )

/**
 * `error` with what to do about it, where the database refused for want of a right or of a table:
 * the server's reason names the table or schema, not what the backend needs.
 */
const explained = (error: BackendError, { dialect, table }: Storage, doing: "create" | "use"): BackendError => {
  const refusal = dialect.refusal(error.cause)
  if (refusal === undefined) return error
  const tables = `${table.table} and ${table.table}_ended`
  const hint = doing === "create"
    ? refusal === "denied"
      ? "a role that may not create them needs the tables made beforehand with SqlBackend.migrate, and createSchema: false"
      : undefined
    : refusal === "denied"
    ? `the backend needs SELECT, INSERT, UPDATE and DELETE on ${tables}${dialect.name === "pg" ? ", and USAGE on their schema" : ""}`
    : `make ${tables} with SqlBackend.migrate, or build the backend with createSchema: true`
  return hint === undefined ? error : new BackendError({
    operation: error.operation,
    cause: error.cause,
    endpoint: error.endpoint,
    detail: `${error.detail ?? driverMessage(error.cause)} (${hint})`
  })
}
