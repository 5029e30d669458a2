/**
 * The SQL backend: lockstep's locks on PostgreSQL, MySQL/MariaDB or SQLite through `@effect/sql`.
 *
 * Each key is one row of one table (default `lockstep_locks`), created on first use:
 *
 * | column | type | |
 * |---|---|---|
 * | `name` | text (MySQL: `VARBINARY(2816)`) | primary key: the lock's key |
 * | `state` | text (JSON) | holders, fair queue, fence, remembered holders, latch count |
 * | `expires_at` | double, indexed | when nothing in `state` matters any more (database clock, ms) |
 * | `version` | double | bumped by every change that may let a waiter in |
 *
 * and beside it `<table>_ended` (`name`, `holder`, `expires_at`): holders that ended recently,
 * remembered for a lease so that a late or repeated acquire of theirs grants nothing.
 *
 * Every operation is one transaction that locks the key's row, reads the database's clock, applies
 * the rules of `@lockstep/core/Rules` to the row's state and writes it back: expiry is judged on the
 * database server's clock, in the same transaction as the decision. Rows whose `expires_at` has
 * passed are deleted once a minute. Waiters wake on PostgreSQL's `LISTEN/NOTIFY`; on MySQL and
 * SQLite, which have no notifications (and on PostgreSQL with `wakeUp: "poll"`, e.g. through
 * PgBouncer in transaction mode), one query per backend reads the versions of the rows its
 * waiters wait on, every 25 ms (SQLite: 10 ms) while someone waits, and releases made by the same
 * backend wake its waiters at once.
 *
 * @since 0.1.0
 */
import type { Duration, Scope } from "effect"
import { Config, ConfigError, Effect, Layer, Redacted, Schedule } from "effect"
import { SqlClient } from "@effect/sql/SqlClient"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import type { DialectName } from "./internal/dialect.js"
import * as Endpoint from "./internal/endpoint.js"
import * as internal from "./internal/sqlBackend.js"

/**
 * How the backend uses its database.
 *
 * @example
 * ```ts
 * import type { SqlBackend } from "@lockstep/sql"
 *
 * const options: SqlBackend.Options = { schema: "locks", table: "held", commandTimeout: "2 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * The table's schema (PostgreSQL), database (MySQL) or attached database (SQLite). Default: the
   * connection's own. Up to 57 letters, digits and underscores.
   */
  readonly schema?: string | undefined
  /** The table (and `<table>_ended` beside it). Default `lockstep_locks`. Up to 57 letters, digits and underscores. */
  readonly table?: string | undefined
  /**
   * Create the table (and, on PostgreSQL, the schema) if it does not exist. Default `true`, which
   * needs the right to create in the schema even where the tables exist; with `false`, create them
   * beforehand with `SqlBackend.migrate`, and the backend needs only `SELECT`, `INSERT`, `UPDATE`
   * and `DELETE` on both tables (and, on PostgreSQL, `USAGE` on their schema): the layer uses each
   * once as it starts, and fails with `BackendError` (operation `"checkTables"`) naming a table it
   * may not use or that is missing.
   */
  readonly createSchema?: boolean | undefined
  /**
   * Every call that takes longer (a row lock held by a stalled transaction, a silent server) fails
   * with `BackendError`; its transaction is rolled back. Default 5 seconds.
   */
  readonly commandTimeout?: Duration.DurationInput | undefined
  /** Most leases renewed in one transaction. Default 500. */
  readonly renewBatchSize?: number | undefined
  /**
   * How often waiters' rows are read for changes where the backend polls (MySQL, SQLite, and
   * PostgreSQL with `wakeUp: "poll"`). Default 25 ms (SQLite 10 ms).
   */
  readonly pollInterval?: Duration.DurationInput | undefined
  /**
   * PostgreSQL: how a waiter hears of a release made by another process.
   *
   * - `"listen"` (default): `LISTEN` on a connection the client opens for it (`@effect/sql-pg`).
   *   Through PgBouncer this works in `pool_mode = session` only.
   * - `{ listenUrl }`: `LISTEN` on a connection of the backend's own to this URL (node-postgres's
   *   URL form, TLS parameters included), used for nothing else: PostgreSQL itself (or a PgBouncer
   *   database in session mode) while the client goes through PgBouncer in `pool_mode =
   *   transaction`. It must reach the same database as the client.
   * - `"poll"`: no `LISTEN`; one query per `pollInterval` reads the versions of the rows waited on,
   *   as on MySQL. Works through any pooler, and costs a query per interval while someone waits.
   *
   * With `LISTEN`, the layer sends itself a notification as it starts and waits up to 5 seconds for
   * it. A pooler in transaction or statement mode never passes it on: the layer then fails with
   * `BackendError` (operation `"listen"`) saying so and naming the settings above. MySQL and SQLite
   * always poll; `listenUrl` there is refused with `InvalidLockOptions`.
   */
  readonly wakeUp?: "listen" | "poll" | WakeUpListenUrl | undefined
  /** How often rows that no longer matter are deleted. Default 1 minute. */
  readonly sweepInterval?: Duration.DurationInput | undefined
}

/**
 * `wakeUp`'s direct `LISTEN` connection: a `postgres://` or `postgresql://` URL, a secret.
 *
 * @example
 * ```ts
 * import { Redacted } from "effect"
 * import type { SqlBackend } from "@lockstep/sql"
 *
 * // the pool goes through PgBouncer (transaction mode), LISTEN straight to PostgreSQL
 * const options: SqlBackend.Options = {
 *   wakeUp: { listenUrl: Redacted.make("postgres://app@db.internal:5432/app") }
 * }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface WakeUpListenUrl {
  readonly listenUrl: Redacted.Redacted
}

/** SQLite's "database is locked" (SQLITE_BUSY): another connection holds the lock for now. */
const isLocked = (cause: unknown): boolean =>
  typeof cause === "object" && cause !== null && "code" in cause && cause.code === "SQLITE_BUSY"

/**
 * The backend on the `SqlClient` in context (borrowed: never closed here). The dialect is the
 * client's: `@effect/sql-pg`, `@effect/sql-mysql2` (MySQL and MariaDB) or
 * `@effect/sql-sqlite-node`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { SqlBackend } from "@lockstep/sql"
 *
 * const backend = Effect.scoped(SqlBackend.make({ table: "locks" }))
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  options?: Options
): Effect.Effect<Service, BackendError | InvalidLockOptions, SqlClient | Scope.Scope> =>
  Effect.flatMap(SqlClient, (sql) => internal.make(sql, options))

/**
 * Creates the backend's table (and index) if absent, for those who run their own migrations
 * and build the backend with `createSchema: false`.
 *
 * @example
 * ```ts
 * import { SqlBackend } from "@lockstep/sql"
 *
 * const migration = SqlBackend.migrate({ table: "locks" })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const migrate = (
  options?: Pick<Options, "schema" | "table">
): Effect.Effect<void, BackendError | InvalidLockOptions, SqlClient> =>
  Effect.flatMap(SqlClient, (sql) => internal.migrate(sql, options))

/**
 * The backend as a layer over the `SqlClient` layer you already have. Once the layer is closed,
 * every call of a lock made under it fails with `BackendError` whose cause is
 * `LockError.BackendClosed`, also while the client itself stays open, and waiters stop waiting.
 *
 * @example
 * ```ts
 * import { Layer } from "effect"
 * import { PgClient } from "@effect/sql-pg"
 * import { SqlBackend } from "@lockstep/sql"
 *
 * const backend = SqlBackend.layer().pipe(Layer.provide(PgClient.layer({ database: "app" })))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options?: Options): Layer.Layer<LockBackend, BackendError | InvalidLockOptions, SqlClient> =>
  Layer.scoped(LockBackend, make(options))

/**
 * The backend and its own client, from a URL: `postgres://` or `postgresql://` (`@effect/sql-pg`),
 * `mysql://` or `mariadb://` (`@effect/sql-mysql2`), `sqlite:<path>` or `file:<path>`
 * (`@effect/sql-sqlite-node`). Only the driver the URL names is loaded; install it beside this
 * package. Default: the `DATABASE_URL` environment variable.
 *
 * A server it cannot reach or that refuses it fails the layer with `BackendError` (operation
 * `"connect"`) naming the endpoint and the driver's reason, e.g. `lock backend failed during
 * connect on PostgreSQL 10.0.0.5:5432/app: role "app" does not exist` (never the password). An
 * unset variable fails it with a `ConfigError` that names the variable.
 *
 * TLS to PostgreSQL: node-postgres's URL parameters, e.g.
 * `?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem` (node-postgres checks the certificate under
 * `sslmode=require` too; `&uselibpqcompat=true` gives `require` libpq's meaning, unchecked). A
 * certificate it cannot trust fails the layer the same way, e.g. `…: unable to verify the first
 * certificate`.
 *
 * @example
 * ```ts
 * import { Config } from "effect"
 * import { SqlBackend } from "@lockstep/sql"
 *
 * const fromEnv = SqlBackend.layerConfig()
 * const custom = SqlBackend.layerConfig(Config.redacted("LOCKS_DATABASE_URL"), { table: "locks" })
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  url: Config.Config<Redacted.Redacted> = Config.redacted("DATABASE_URL"),
  options?: Options
): Layer.Layer<LockBackend, BackendError | InvalidLockOptions | ConfigError.ConfigError> =>
  Layer.unwrapEffect(Effect.map(url, (value) => layerOn(value, options))).pipe(
    Layer.catchAll((error) => Layer.fail(ConfigError.isConfigError(error) ? namingSecrets(error) : error))
  )

/**
 * A secret's config error says `<redacted>` where it would show the value, and with it loses the
 * name of what is missing: the message names the path again, never the value.
 */
const namingSecrets = (error: ConfigError.ConfigError): ConfigError.ConfigError =>
  ConfigError.reduceWithContext(error, undefined, {
    andCase: (_, left, right) => ConfigError.And(left, right),
    orCase: (_, left, right) => ConfigError.Or(left, right),
    missingDataCase: (_, path, message) =>
      ConfigError.MissingData(
        path,
        message === secretMessage
          ? `Expected ${path.join(".")} to exist: the URL of the lock database (postgres://, mysql://, mariadb:// or sqlite:<file>)`
          : message
      ),
    invalidDataCase: (_, path, message) =>
      ConfigError.InvalidData(path, message === secretMessage ? `${path.join(".")} is invalid (a secret: its value is not shown)` : message),
    sourceUnavailableCase: (_, path, message, cause) =>
      ConfigError.SourceUnavailable(path, message === secretMessage ? `${path.join(".")} could not be read` : message, cause),
    unsupportedCase: (_, path, message) =>
      ConfigError.Unsupported(path, message === secretMessage ? `${path.join(".")} cannot be read here` : message)
  })

const secretMessage = "<redacted>"

const dialectOf = (scheme: string): DialectName | undefined => {
  switch (scheme) {
    case "postgres":
    case "postgresql":
      return "pg"
    case "mysql":
    case "mariadb":
      return "mysql"
    case "sqlite":
    case "file":
      return "sqlite"
    default:
      return undefined
  }
}

/**
 * The backend on a client of its own for `url`, from the driver package its scheme names, loaded
 * on demand. Every error names the endpoint (never the password) and says what the driver said.
 */
const layerOn = (url: Redacted.Redacted, options: Options | undefined): Layer.Layer<LockBackend, BackendError | InvalidLockOptions> => {
  const text = Redacted.value(url)
  const scheme = text.slice(0, Math.max(0, text.indexOf(":"))).toLowerCase()
  const kind = dialectOf(scheme)
  if (kind === undefined) {
    return Layer.fail(
      new InvalidLockOptions({ field: "url", reason: `unknown scheme "${scheme}": use postgres:, mysql:, mariadb: or sqlite:` })
    )
  }
  const { endpoint, password } = Endpoint.fromUrl(kind, text)
  const connectFailure = (cause: unknown, detail = Endpoint.driverMessage(cause)) =>
    new BackendError({ operation: "connect", cause, endpoint, detail: Endpoint.masked(detail, password) })
  const driver = <A>(name: string, load: () => Promise<A>) =>
    Effect.tryPromise({
      try: load,
      catch: (cause) => connectFailure(cause, `cannot load ${name}: install it beside @lockstep/sql`)
    })
  const client: Layer.Layer<SqlClient, BackendError> = kind === "pg"
    ? Layer.unwrapEffect(
      Effect.map(driver("@effect/sql-pg", () => import("@effect/sql-pg")), ({ PgClient }) => PgClient.layer({ url }))
    ).pipe(Layer.mapError((error) => (error._tag === "BackendError" ? error : connectFailure(error))))
    : kind === "mysql"
    ? Layer.unwrapEffect(
      Effect.map(driver("@effect/sql-mysql2", () => import("@effect/sql-mysql2")), ({ MysqlClient }) =>
        MysqlClient.layer({ url: Redacted.make(text.replace(/^mariadb:/i, "mysql:")) }))
    ).pipe(Layer.mapError((error) => (error._tag === "BackendError" ? error : connectFailure(error))))
    : Layer.unwrapEffect(
      Effect.map(driver("@effect/sql-sqlite-node", () => import("@effect/sql-sqlite-node")), ({ SqliteClient }) =>
        // better-sqlite3 throws from its constructor on a file it cannot open
        Layer.scopedContext(
          Layer.build(SqliteClient.layer({ filename: Endpoint.sqliteFile(text) })).pipe(
            Effect.mapError(connectFailure),
            Effect.catchAllDefect((defect) => Effect.fail(connectFailure(defect))),
            // the client's first statement (journal_mode = WAL) finds the file locked while another
            // process opens it at the same moment: try again for up to 2 seconds
            Effect.retry({ while: (error) => isLocked(error.cause), schedule: Schedule.spaced("25 millis"), times: 80 })
          )
        ))
    )
  return Layer.scoped(LockBackend, Effect.flatMap(SqlClient, (sql) => internal.make(sql, options, endpoint))).pipe(
    Layer.provide(client)
  )
}
