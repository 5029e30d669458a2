/**
 * Where a backend's database is, as its errors name it (`PostgreSQL 127.0.0.1:5432/app`,
 * `MySQL db.internal:3306/app`, `SQLite /var/lib/app/locks.db`: never a user or a password), and
 * what a driver's error says, dug out from under the `SqlError` that wraps it.
 */
import type { SqlClient } from "@effect/sql/SqlClient"
import { Redacted } from "effect"
import { endpointName } from "@lockstep/core/BackendKit"
import type { DialectName } from "./dialect.js"

const labels: Record<DialectName, string> = { pg: "PostgreSQL", mysql: "MySQL", sqlite: "SQLite" }
const defaultPorts: Partial<Record<DialectName, number>> = { pg: 5432, mysql: 3306 }

const decoded = (text: string): string => {
  try {
    return decodeURIComponent(text)
  } catch {
    return text
  }
}

/** `label host:port/database`, the parts the driver would use where the configuration is silent. */
const located = (
  label: string,
  kind: DialectName,
  host: string | undefined,
  port: number | string | undefined,
  database: string | undefined
): string => {
  const at = `${host === undefined || host === "" ? "localhost" : host}:${port === undefined || port === "" ? defaultPorts[kind] : port}`
  return endpointName(label, at, database)
}

/** What a parsed URL says, `undefined` for text `URL` cannot read. */
const parse = (text: string): URL | undefined => {
  try {
    return new URL(text)
  } catch {
    return undefined
  }
}

/**
 * The endpoint a connection URL names (of a scheme `SqlBackend.layerConfig` knows), and its
 * password (decoded), which no message may show.
 */
export const fromUrl = (kind: DialectName, text: string): { readonly endpoint: string; readonly password: string | undefined } => {
  if (kind === "sqlite") return { endpoint: `SQLite ${sqliteFile(text)}`, password: undefined }
  const label = /^mariadb:/i.test(text) ? "MariaDB" : labels[kind]
  const url = parse(text)
  if (url === undefined) return { endpoint: label, password: undefined }
  const user = decoded(url.username)
  // PostgreSQL: `?host=/run/postgresql` (a socket directory) and `?port=` override the authority
  const host = (kind === "pg" ? url.searchParams.get("host") : null) ?? url.hostname
  const port = (kind === "pg" ? url.searchParams.get("port") : null) ?? url.port
  const path = decoded(url.pathname.replace(/^\//, ""))
  // PostgreSQL's default database is the user's name
  const database = path !== "" ? path : kind === "pg" && user !== "" ? user : undefined
  return { endpoint: located(label, kind, host, port, database), password: url.password === "" ? undefined : decoded(url.password) }
}

/** The file of a `sqlite:<path>` or `file:<path>` URL. */
export const sqliteFile = (text: string): string => text.slice(text.indexOf(":") + 1).replace(/^\/\//, "")

/** The endpoint of a client made by `@effect/sql-pg`, `@effect/sql-mysql2` or `@effect/sql-sqlite-node`. */
export const ofClient = (sql: SqlClient, kind: DialectName): string => {
  const config = "config" in sql && typeof sql.config === "object" && sql.config !== null
    ? (sql.config as Record<string, unknown>)
    : {}
  const text = (key: string): string | undefined => (typeof config[key] === "string" ? config[key] : undefined)
  if (kind === "sqlite") return text("filename") === undefined ? labels.sqlite : `SQLite ${text("filename")}`
  const url = config["url"]
  if (Redacted.isRedacted(url)) return fromUrl(kind, String(Redacted.value(url))).endpoint
  const port = typeof config["port"] === "number" || typeof config["port"] === "string" ? config["port"] : undefined
  const database = text("database") ?? (kind === "pg" ? text("username") : undefined)
  return located(labels[kind], kind, text("host") ?? text("path"), port, database)
}

const unique = (items: ReadonlyArray<string>): Array<string> => [...new Set(items.filter((item) => item !== ""))]

/**
 * The driver's own message, on one line, without the SQL text: an error's `cause` when it has
 * something to say (a `SqlError` only says which step failed), every attempt of an
 * `AggregateError` (a host with several addresses), the error code where the message is empty.
 */
export const driverMessage = (cause: unknown, depth = 0): string => {
  if (typeof cause === "string") return cause
  if (!(cause instanceof Error)) return String(cause)
  if (depth < 4) {
    if (cause instanceof AggregateError && cause.errors.length > 0) {
      const all = unique(cause.errors.map((error) => driverMessage(error, depth + 1)))
      if (all.length > 0) return all.join("; ")
    }
    if (cause.cause instanceof Error) {
      const inner = driverMessage(cause.cause, depth + 1)
      if (inner !== "") return inner
    }
  }
  if (cause.message !== "") return cause.message
  const code = (cause as { readonly code?: unknown }).code
  return typeof code === "string" ? code : cause.name
}

/** `text` with every occurrence of `secret` masked (a secret too short to find safely is left to the drivers). */
export const masked = (text: string, secret: string | undefined): string =>
  secret === undefined || secret.length < 4 ? text : text.split(secret).join("***")
