/**
 * `@lockstep/sql`: the SQL backend of lockstep, on `@effect/sql`.
 *
 * @since 0.1.0
 */

/**
 * The SQL backend: PostgreSQL, MySQL/MariaDB and SQLite through `@effect/sql`.
 *
 * @since 0.1.0
 */
export * as SqlBackend from "./SqlBackend.js"
