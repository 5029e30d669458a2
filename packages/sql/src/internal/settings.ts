/**
 * The backend's options as it uses them: checked, with their defaults, and the dialect and table
 * of the client it was given.
 */
import { Duration, Effect, Redacted } from "effect"
import type { SqlClient } from "@effect/sql/SqlClient"
import { InvalidLockOptions } from "@lockstep/core/LockError"
// the public options, imported (not copied) so that a new one cannot be silently ignored here
import type { Options, WakeUpListenUrl } from "../SqlBackend.js"
import * as Dialect from "./dialect.js"

const defaultTable = "lockstep_locks"

/** Where the locks are kept: the table, and the dialect of the database it is in. */
export interface Storage {
  readonly dialect: Dialect.Dialect
  readonly table: Dialect.Table
}

/** `Options` read: every duration decoded, every default applied. */
export interface Settings extends Storage {
  readonly commandTimeout: Duration.Duration
  readonly renewBatchSize: number
  readonly pollInterval: Duration.Duration
  readonly sweepInterval: Duration.Duration
  readonly createSchema: boolean
  /** `wakeUp.listenUrl`, where LISTEN has a connection of its own. */
  readonly listenUrl: WakeUpListenUrl["listenUrl"] | undefined
  /** PostgreSQL with LISTEN: releases notify; elsewhere waiters read their rows' versions. */
  readonly notifies: boolean
}

/** The client's dialect and the table, once both are known to be valid. */
export const storageOf = (
  sql: SqlClient,
  options: Pick<Options, "schema" | "table"> | undefined
): Effect.Effect<Storage, InvalidLockOptions> =>
  Effect.suspend(() => {
    const name = sql.onDialectOrElse<Dialect.DialectName | undefined, Dialect.DialectName, Dialect.DialectName, Dialect.DialectName>({
      orElse: () => undefined,
      pg: () => "pg",
      mysql: () => "mysql",
      sqlite: () => "sqlite"
    })
    if (name === undefined) {
      return Effect.fail(new InvalidLockOptions({ field: "client", reason: "the SQL client must be PostgreSQL, MySQL/MariaDB or SQLite" }))
    }
    const table: Dialect.Table = { schema: options?.schema, table: options?.table ?? defaultTable }
    for (const [field, value] of [["schema", table.schema], ["table", table.table]] as const) {
      const reason = value === undefined ? undefined : Dialect.invalidIdentifier(value)
      if (reason !== undefined) return Effect.fail(new InvalidLockOptions({ field, reason }))
    }
    return Effect.succeed({ dialect: Dialect.make(name, table), table })
  })

/** `options` for `sql`, or the first of them that cannot be used. */
export const settingsOf = (sql: SqlClient, options: Options | undefined): Effect.Effect<Settings, InvalidLockOptions> =>
  Effect.flatMap(storageOf(sql, options), ({ dialect, table }) => {
    const name = dialect.name
    const commandTimeout = Duration.decode(options?.commandTimeout ?? Duration.seconds(5))
    const renewBatchSize = Math.max(1, options?.renewBatchSize ?? 500)
    const pollInterval = Duration.decode(options?.pollInterval ?? (name === "sqlite" ? Duration.millis(10) : Duration.millis(25)))
    const sweepInterval = Duration.decode(options?.sweepInterval ?? Duration.minutes(1))
    const wakeUp = options?.wakeUp ?? "listen"
    if (typeof wakeUp === "object" && !/^postgres(ql)?:\/\//i.test(Redacted.value(wakeUp.listenUrl))) {
      return Effect.fail(new InvalidLockOptions({ field: "wakeUp", reason: "listenUrl must be a postgres:// or postgresql:// URL" }))
    }
    if (typeof wakeUp === "object" && name !== "pg") {
      return Effect.fail(
        new InvalidLockOptions({
          field: "wakeUp",
          reason: "listenUrl is for PostgreSQL: MySQL and SQLite have no LISTEN, and their waiters poll"
        })
      )
    }
    return Effect.succeed({
      dialect,
      table,
      commandTimeout,
      renewBatchSize,
      pollInterval,
      sweepInterval,
      createSchema: options?.createSchema !== false,
      listenUrl: typeof wakeUp === "object" ? wakeUp.listenUrl : undefined,
      notifies: name === "pg" && wakeUp !== "poll"
    })
  })
