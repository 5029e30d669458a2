/**
 * The statements that differ between databases. Everything else (the rules, the transaction,
 * wake-ups) is shared. Every statement names the table through `table`, an identifier quoted
 * for the database.
 */
export type DialectName = "pg" | "mysql" | "sqlite"

export interface Statement {
  readonly sql: string
  readonly params: ReadonlyArray<unknown>
}

/** A row as the backend writes it. */
export interface RowWrite {
  readonly name: string
  readonly state: string
  readonly expiresAt: number
  readonly version: number
}

/** Ended holders of `name` to remember, each until a time. */
export interface EndedWrite {
  readonly name: string
  readonly ended: ReadonlyArray<readonly [string, number]>
}

export interface Dialect {
  readonly name: DialectName
  /**
   * Starts a transaction whose statements the server itself ends after `timeoutMs` where it can
   * (PostgreSQL), so that a call given up on does not keep waiting for a row lock there.
   */
  readonly begin: (timeoutMs: number) => ReadonlyArray<string>
  /** Creates the table and its index if absent. */
  readonly createSchema: ReadonlyArray<string>
  /**
   * Creates the rows of `names` that do not exist and locks them all until the transaction ends,
   * in the order given; the last statement returns `name, state, version, now` for each row, with
   * `now` read from the database's clock (milliseconds) once the locks are held.
   */
  readonly lockRows: (names: ReadonlyArray<string>) => ReadonlyArray<Statement>
  /** One row `now, state, version` for `name`, without a lock (state null when there is no row). */
  readonly readRow: (name: string) => Statement
  /**
   * Overwrites locked rows (`rows`), and remembers ended holders of one of them until the times
   * given (`ended`); `wake`: the payloads to notify on commit (PostgreSQL only). The statements to
   * run in order, each on its own (PostgreSQL: one for it all).
   */
  readonly write: (rows: ReadonlyArray<RowWrite>, wake: ReadonlyArray<string>, ended: EndedWrite | undefined) => ReadonlyArray<Statement>
  /** `holder, expires_at` of the ended holders `ids` of `name` that are remembered. */
  readonly readEnded: (name: string, ids: ReadonlyArray<string>) => Statement
  /** Deletes rows (and remembered holders) whose `expires_at` has passed on the database's clock. */
  readonly sweep: ReadonlyArray<Statement>
  /** `name, version` of the rows of `names` that exist. */
  readonly versions: (names: ReadonlyArray<string>) => Statement
  /**
   * Deletes the rows of `name` in both tables if they expired, as the sweep does: with `lockRows`,
   * `write` and `readEnded`, every right the backend uses at run time, for the check made at
   * start when it does not create the tables.
   */
  readonly forget: (name: string) => ReadonlyArray<Statement>
  /**
   * `statement` as SQL text with its parameters written in as literals, so that several statements
   * can go to the server in one call (the drivers take parameters for one statement only);
   * `undefined` for a value that has no literal (PostgreSQL text cannot hold NUL): the caller sends
   * the statements one by one, with parameters, instead.
   */
  readonly inline: (statement: Statement) => string | undefined
  /** Whether a failed transaction may simply be run again (a lost insert race, a deadlock). */
  readonly retryable: (cause: unknown) => boolean
  /** Why a statement failed, where the backend can say what to do about it: a right missing, a table missing. */
  readonly refusal: (cause: unknown) => "denied" | "missing" | undefined
}

export interface Table {
  /** Schema (PostgreSQL), database (MySQL) or attached database (SQLite); absent: the default. */
  readonly schema: string | undefined
  readonly table: string
}

const identifier = /^[A-Za-z_][A-Za-z0-9_]*$/

/** Why `name` cannot name a table or schema, if it cannot. */
export const invalidIdentifier = (name: string): string | undefined =>
  identifier.test(name) && name.length <= 57
    ? undefined
    : "must be 1 to 57 letters, digits or underscores, not starting with a digit"

const quoteWith = (quote: string) => (name: string) => `${quote}${name}${quote}`

const qualified = (table: Table, quote: (name: string) => string): string =>
  table.schema === undefined ? quote(table.table) : `${quote(table.schema)}.${quote(table.table)}`

/** The table of ended holders beside `table`. */
const endedTable = (table: Table): Table => ({ ...table, table: `${table.table}_ended` })

const endedParams = (name: string, ended: ReadonlyArray<readonly [string, number]>): ReadonlyArray<unknown> =>
  ended.flatMap(([holder, until]) => [name, holder, until])

/** A code carried by a driver's error (`pg`: SQLSTATE in `code`; mysql2: `errno`; better-sqlite3: `code`). */
const causeOf = (cause: unknown): Record<string, unknown> => {
  const inner = typeof cause === "object" && cause !== null && "cause" in cause ? cause.cause : cause
  return typeof inner === "object" && inner !== null ? (inner as Record<string, unknown>) : {}
}

const placeholders = (count: number, from: number, dollar: boolean): string =>
  Array.from({ length: count }, (_, i) => (dollar ? `$${from + i}` : "?")).join(", ")

const rowsValues = (rows: ReadonlyArray<RowWrite>, dollar: boolean): string =>
  rows.map((_, i) => `(${placeholders(4, i * 4 + 1, dollar)})`).join(", ")

const endedValues = (ended: ReadonlyArray<unknown>, from: number, dollar: boolean): string =>
  ended.map((_, i) => `(${placeholders(3, from + i * 3, dollar)})`).join(", ")

/** `write` as separate statements: `writeRows`, then `writeEnded`, each where there is something to write. */
const writeApart = (
  writeRows: (rows: ReadonlyArray<RowWrite>) => Statement,
  writeEnded: (write: EndedWrite) => Statement
): Dialect["write"] =>
(rows, _wake, ended) => [
  ...(rows.length > 0 ? [writeRows(rows)] : []),
  ...(ended !== undefined && ended.ended.length > 0 ? [writeEnded(ended)] : [])
]

const rowsParams = (rows: ReadonlyArray<RowWrite>): ReadonlyArray<unknown> =>
  rows.flatMap((row) => [row.name, row.state, row.expiresAt, row.version])

/** Deletes what expired from both tables. */
const sweepOf = (t: string, e: string, now: string): ReadonlyArray<Statement> => [
  { sql: `DELETE FROM ${t} WHERE expires_at < ${now}`, params: [] },
  { sql: `DELETE FROM ${e} WHERE expires_at < ${now}`, params: [] }
]

/** `forget` with `?` or `$1` for the name. */
const forgetOf = (t: string, e: string, now: string, param: string) => (name: string): ReadonlyArray<Statement> => [
  { sql: `DELETE FROM ${t} WHERE name = ${param} AND expires_at < ${now}`, params: [name] },
  { sql: `DELETE FROM ${e} WHERE name = ${param} AND expires_at < ${now}`, params: [name] }
]

/** The reads MySQL and SQLite write alike, with `?` placeholders. */
const questionMarkReads = (t: string, e: string, now: string): Pick<Dialect, "readRow" | "readEnded" | "versions"> => ({
  readRow: (name) => ({ sql: `SELECT ${now} AS now, s.state, s.version FROM (SELECT 1) AS one LEFT JOIN ${t} AS s ON s.name = ?`, params: [name] }),
  readEnded: (name, ids) => ({
    sql: `SELECT holder, expires_at FROM ${e} WHERE name = ? AND holder IN (${placeholders(ids.length, 1, false)})`,
    params: [name, ...ids]
  }),
  versions: (names) => ({ sql: `SELECT name, version FROM ${t} WHERE name IN (${placeholders(names.length, 1, false)})`, params: names })
})

/** A number as SQL text: finite only (no literal says NaN or Infinity in both databases). */
const numberLiteral = (value: number): string | undefined => (Number.isFinite(value) ? String(value) : undefined)

/**
 * `value` dollar-quoted (`$l$…$l$`), with the first tag that the text does not close early: its
 * content is taken as it is, with no escape to read, so its meaning depends on no setting
 * (`standard_conforming_strings`, `backslash_quote`). An escape string would not do: under a
 * client-only `client_encoding` (SJIS, BIG5, GBK, ...) a backslash can be read as the second byte
 * of a character, which unbalances the escapes; `$` is never such a byte, so a text that would be
 * misread there fails as an invalid byte sequence instead. A space before it keeps it apart from
 * whatever precedes the placeholder.
 */
const dollarQuoted = (value: string): string => {
  for (let i = 0; ; i++) {
    const tag = i === 0 ? "$l$" : `$l${i}$`
    // the first tag in the text followed by the closing tag must be that closing tag
    if ((value + tag).indexOf(tag) === value.length) return ` ${tag}${value}${tag}`
  }
}

/** A PostgreSQL literal of `value`: a dollar-quoted string, a number, or a text array. */
export const postgresLiteral = (value: unknown): string | undefined => {
  if (typeof value === "string") {
    // NUL ends the text of a simple query, and text values cannot hold it anyway
    if (value.includes("\u0000")) return undefined
    return dollarQuoted(value)
  }
  if (typeof value === "number") return numberLiteral(value)
  if (Array.isArray(value)) {
    const items: Array<string> = []
    for (const item of value) {
      const literal = typeof item === "string" ? postgresLiteral(item) : undefined
      if (literal === undefined) return undefined
      items.push(literal)
    }
    return `ARRAY[${items.join(", ")}]::text[]`
  }
  return undefined
}

/**
 * A MySQL/MariaDB literal of `value`: text as its UTF-8 bytes in hex with the utf8mb4 introducer
 * (as the driver sends a text parameter; no escaping, so the server's `NO_BACKSLASH_ESCAPES` and
 * connection character set do not matter), or a number.
 */
export const mysqlLiteral = (value: unknown): string | undefined =>
  typeof value === "string"
    ? `_utf8mb4 X'${Buffer.from(value, "utf8").toString("hex")}'`
    : typeof value === "number"
    ? numberLiteral(value)
    : undefined

/**
 * `statement` with each placeholder `pattern` finds replaced by the literal of its parameter: the
 * pattern's group is the parameter's number (`$2`), or empty for the next one in order (`?`).
 */
const inlined = (
  statement: Statement,
  pattern: RegExp,
  literal: (value: unknown) => string | undefined
): string | undefined => {
  let next = 0
  let failed = false
  const sql = statement.sql.replace(pattern, (_, position: string) => {
    const index = position === "" ? next++ : Number(position) - 1
    const text = index < statement.params.length ? literal(statement.params[index]) : undefined
    if (text === undefined) failed = true
    return text ?? ""
  })
  return failed ? undefined : sql
}

const postgres = (table: Table): Dialect => {
  const quote = quoteWith("\"")
  const t = qualified(table, quote)
  const now = "(extract(epoch from clock_timestamp()) * 1000)::float8"
  const channel = channelOf(table)
  const e = qualified(endedTable(table), quote)
  return {
    name: "pg",
    // one simple query: no round trip of its own
    begin: (timeoutMs) => [
      "BEGIN",
      `SET LOCAL statement_timeout = ${Number.isFinite(timeoutMs) ? Math.max(1, Math.ceil(timeoutMs)) : 0}`
    ],
    createSchema: [
      ...(table.schema === undefined ? [] : [`CREATE SCHEMA IF NOT EXISTS ${quote(table.schema)}`]),
      `CREATE TABLE IF NOT EXISTS ${t} (name text PRIMARY KEY, state text NOT NULL, expires_at float8 NOT NULL, version float8 NOT NULL)`,
      `CREATE INDEX IF NOT EXISTS ${quote(`${table.table}_expires_at`)} ON ${t} (expires_at)`,
      `CREATE TABLE IF NOT EXISTS ${e} (name text NOT NULL, holder text NOT NULL, expires_at float8 NOT NULL, PRIMARY KEY (name, holder))`,
      `CREATE INDEX IF NOT EXISTS ${quote(`${table.table}_ended_expires_at`)} ON ${e} (expires_at)`
    ],
    // one statement creates, locks and reads: the upsert takes each row's lock (waiting for a
    // holder of it), and RETURNING reads the clock after that
    lockRows: (names) => [{
      sql: `INSERT INTO ${t} AS t (name, state, expires_at, version) SELECT n, '', 0, 0 FROM unnest($1::text[]) AS n ` +
        `ON CONFLICT (name) DO UPDATE SET version = t.version RETURNING name, state, version, ${now} AS now`,
      params: [names]
    }],
    readRow: (name) => ({ sql: `SELECT ${now} AS now, s.state, s.version FROM (SELECT 1) AS one LEFT JOIN ${t} AS s ON s.name = $1`, params: [name] }),
    // one statement for every write of a transaction (writes in WITH all run, in full)
    write: (rows, wake, ended) => {
      const writes: Array<string> = []
      const params: Array<unknown> = []
      if (rows.length > 0) {
        writes.push(
          `INSERT INTO ${t} AS t (name, state, expires_at, version) VALUES ${rowsValues(rows, true)} ` +
            "ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, expires_at = EXCLUDED.expires_at, version = EXCLUDED.version"
        )
        params.push(...rowsParams(rows))
      }
      if (ended !== undefined && ended.ended.length > 0) {
        writes.push(
          `INSERT INTO ${e} (name, holder, expires_at) VALUES ${endedValues(ended.ended, params.length + 1, true)} ` +
            "ON CONFLICT (name, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at"
        )
        params.push(...endedParams(ended.name, ended.ended))
      }
      // NOTIFY is delivered on commit, to every listening backend (this one included)
      const last = wake.length > 0 ? `SELECT pg_notify($${params.length + 1}, w) FROM unnest($${params.length + 2}::text[]) AS w` : writes.pop()
      if (last === undefined) return []
      if (wake.length > 0) params.push(channel, wake)
      const sql = writes.length === 0 ? last : `WITH ${writes.map((write, i) => `w${i} AS (${write})`).join(", ")} ${last}`
      return [{ sql, params }]
    },
    readEnded: (name, ids) => ({
      sql: `SELECT holder, expires_at FROM ${e} WHERE name = $1 AND holder = ANY($2::text[])`,
      params: [name, ids]
    }),
    sweep: sweepOf(t, e, now),
    forget: forgetOf(t, e, now, "$1"),
    versions: (names) => ({ sql: `SELECT name, version FROM ${t} WHERE name = ANY($1::text[])`, params: [names] }),
    // the statements' own text has no `$` but their placeholders (identifiers are checked)
    inline: (statement) => inlined(statement, /\$(\d+)/g, postgresLiteral),
    retryable: (cause) => {
      const code = causeOf(cause)["code"]
      // unique_violation (a row deleted and created again under us), deadlock, serialization
      return code === "23505" || code === "40P01" || code === "40001"
    },
    refusal: (cause) => {
      const code = causeOf(cause)["code"]
      // insufficient_privilege; undefined_table, invalid_schema_name
      return code === "42501" ? "denied" : code === "42P01" || code === "3F000" ? "missing" : undefined
    }
  }
}

const mysql = (table: Table): Dialect => {
  const quote = quoteWith("`")
  const t = qualified(table, quote)
  const now = "CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000 AS DOUBLE)"
  const e = qualified(endedTable(table), quote)
  return {
    name: "mysql",
    // a session variable would cost a statement per transaction: a stalled statement ends at the
    // server's innodb_lock_wait_timeout, while the call has failed at the command timeout already
    begin: () => ["BEGIN"],
    createSchema: [
      // binary: keys compare byte for byte, as on every other backend (2816 bytes: with a holder id
      // of up to 256, InnoDB's longest key, 3072)
      `CREATE TABLE IF NOT EXISTS ${t} (name VARBINARY(2816) NOT NULL PRIMARY KEY, state MEDIUMTEXT NOT NULL, ` +
      `expires_at DOUBLE NOT NULL, version DOUBLE NOT NULL, KEY ${quote(`${table.table}_expires_at`)} (expires_at)) ENGINE=InnoDB`,
      `CREATE TABLE IF NOT EXISTS ${e} (name VARBINARY(2816) NOT NULL, holder VARBINARY(256) NOT NULL, ` +
      `expires_at DOUBLE NOT NULL, PRIMARY KEY (name, holder), KEY ${quote(`${table.table}_ended_expires_at`)} (expires_at)) ENGINE=InnoDB`
    ],
    // the upsert takes each row's exclusive lock at once (an INSERT IGNORE would take a shared one,
    // and two transactions upgrading theirs would deadlock); the locking read then sees the rows
    lockRows: (names) => [
      {
        sql: `INSERT INTO ${t} (name, state, expires_at, version) VALUES ${names.map(() => "(?, '', 0, 0)").join(", ")} ` +
          "ON DUPLICATE KEY UPDATE version = version",
        params: names
      },
      {
        sql: `SELECT name, state, version, ${now} AS now FROM ${t} WHERE name IN (${placeholders(names.length, 1, false)}) FOR UPDATE`,
        params: names
      }
    ],
    // readEnded reads under the key's row lock, which every writer of those rows holds: the first
    // plain read of the transaction, so its snapshot is taken after the lock
    ...questionMarkReads(t, e, now),
    write: writeApart(
      (rows) => ({
        sql: `INSERT INTO ${t} (name, state, expires_at, version) VALUES ${rowsValues(rows, false)} ` +
          "ON DUPLICATE KEY UPDATE state = VALUES(state), expires_at = VALUES(expires_at), version = VALUES(version)",
        params: rowsParams(rows)
      }),
      ({ ended, name }) => ({
        sql: `INSERT INTO ${e} (name, holder, expires_at) VALUES ${endedValues(ended, 1, false)} ` +
          "ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)",
        params: endedParams(name, ended)
      })
    ),
    sweep: sweepOf(t, e, now),
    forget: forgetOf(t, e, now, "?"),
    // the statements' own text has no `?` but their placeholders (identifiers are checked)
    inline: (statement) => inlined(statement, /\?()/g, mysqlLiteral),
    retryable: (cause) => {
      const errno = causeOf(cause)["errno"]
      // ER_DUP_ENTRY, ER_LOCK_DEADLOCK
      return errno === 1062 || errno === 1213
    },
    refusal: (cause) => {
      const errno = causeOf(cause)["errno"]
      // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR; ER_NO_SUCH_TABLE
      return errno === 1142 || errno === 1143 || errno === 1044 ? "denied" : errno === 1146 ? "missing" : undefined
    }
  }
}

const sqlite = (table: Table): Dialect => {
  const quote = quoteWith("\"")
  const t = qualified(table, quote)
  const now = "(unixepoch('subsec') * 1000.0)"
  const e = qualified(endedTable(table), quote)
  const index = (name: string, on: string) =>
    `CREATE INDEX IF NOT EXISTS ${table.schema === undefined ? "" : `${quote(table.schema)}.`}${quote(name)} ON ${quote(on)} (expires_at)`
  return {
    name: "sqlite",
    // IMMEDIATE: take the write lock first, so that two processes never both read and then fail
    // to upgrade (SQLITE_BUSY without waiting)
    begin: () => ["BEGIN IMMEDIATE"],
    createSchema: [
      `CREATE TABLE IF NOT EXISTS ${t} (name TEXT PRIMARY KEY NOT NULL, state TEXT NOT NULL, expires_at REAL NOT NULL, version REAL NOT NULL)`,
      index(`${table.table}_expires_at`, table.table),
      `CREATE TABLE IF NOT EXISTS ${e} (name TEXT NOT NULL, holder TEXT NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY (name, holder))`,
      index(`${table.table}_ended_expires_at`, `${table.table}_ended`)
    ],
    lockRows: (names) => [{
      sql: `INSERT INTO ${t} (name, state, expires_at, version) VALUES ${names.map(() => "(?, '', 0, 0)").join(", ")} ` +
        `ON CONFLICT (name) DO UPDATE SET version = version RETURNING name, state, version, ${now} AS now`,
      params: names
    }],
    ...questionMarkReads(t, e, now),
    write: writeApart(
      (rows) => ({
        sql: `INSERT INTO ${t} (name, state, expires_at, version) VALUES ${rowsValues(rows, false)} ` +
          "ON CONFLICT (name) DO UPDATE SET state = excluded.state, expires_at = excluded.expires_at, version = excluded.version",
        params: rowsParams(rows)
      }),
      ({ ended, name }) => ({
        sql: `INSERT INTO ${e} (name, holder, expires_at) VALUES ${endedValues(ended, 1, false)} ` +
          "ON CONFLICT (name, holder) DO UPDATE SET expires_at = excluded.expires_at",
        params: endedParams(name, ended)
      })
    ),
    sweep: sweepOf(t, e, now),
    forget: forgetOf(t, e, now, "?"),
    // in process: one call per statement costs no round trip
    inline: () => undefined,
    // BEGIN IMMEDIATE found the write lock taken (it is taken without waiting: see `begin` in calls.ts),
    // after which nothing conflicts
    retryable: (cause) => String(causeOf(cause)["code"] ?? "").startsWith("SQLITE_BUSY"),
    // better-sqlite3 says "no such table" with the generic SQLITE_ERROR
    refusal: (cause) => {
      const inner = causeOf(cause)
      return typeof inner["message"] === "string" && inner["message"].startsWith("no such table") ? "missing" : undefined
    }
  }
}

/** The PostgreSQL channel a table's wake-ups are notified on. */
export const channelOf = (table: Table): string =>
  `lockstep_${table.schema === undefined ? "" : `${table.schema}_`}${table.table}`.slice(0, 63)

export const make = (name: DialectName, table: Table): Dialect =>
  name === "pg" ? postgres(table) : name === "mysql" ? mysql(table) : sqlite(table)
