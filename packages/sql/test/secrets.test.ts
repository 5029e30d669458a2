/**
 * No password gets out of the SQL backend: on a PostgreSQL server of the test's own that checks
 * passwords and takes only TLS, and on the machine's MariaDB with a user of this file's own, each
 * failure path (a wrong password, a closed port, an untrusted certificate, a row lock held past
 * the command timeout) is provoked, and every error (its message, its causes, its JSON, its
 * printed form), every log line, every span (attributes, events, exit) and every metric name and
 * label is searched for the password of the URL or of the client's options.
 */
import { readFileSync } from "node:fs"
import { inspect } from "node:util"
import { afterAll, assert, describe, it } from "@effect/vitest"
import {
  Cause,
  Config,
  Context,
  Effect,
  Exit,
  HashMap,
  Layer,
  Logger,
  LogLevel,
  Metric,
  Redacted,
  Scope,
  Tracer
} from "effect"
import { SqlClient } from "@effect/sql/SqlClient"
import { PgClient } from "@effect/sql-pg"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import { clientLayer, database, required } from "./fixtures/databases.js"
import { freePort, type OwnServer, ownPostgresWith, ownServersAvailable } from "./fixtures/servers.js"

const password = `S3cr3t-${crypto.randomUUID()}`
const wrongPassword = `S3cr3t-${crypto.randomUUID()}`
const secrets = [password, wrongPassword]

/** Every printed form of `value` and of what it carries: its message, its causes, its JSON. */
const textsOf = (value: unknown, depth = 0): Array<string> => {
  if (depth > 8 || value === null || value === undefined) return []
  const texts = [String(value), inspect(value, { depth: 20, showHidden: true, getters: true })]
  try {
    texts.push(JSON.stringify(value) ?? "")
  } catch {
    // a structure with cycles: the printed forms above cover it
  }
  if (Cause.isCause(value)) {
    return [...texts, Cause.pretty(value, { renderErrorCause: true }), ...[...Cause.failures(value), ...Cause.defects(value)].flatMap((e) => textsOf(e, depth + 1))]
  }
  if (typeof value === "object") {
    const record = value as Record<string, unknown>
    if (typeof record["message"] === "string") texts.push(record["message"])
    if (typeof record["stack"] === "string") texts.push(record["stack"])
    if ("cause" in record) texts.push(...textsOf(record["cause"], depth + 1))
    if (value instanceof AggregateError) texts.push(...value.errors.flatMap((error) => textsOf(error, depth + 1)))
  }
  return texts
}

/** What a test saw: log lines and spans, recorded as they happen. */
interface Seen {
  readonly logs: Array<string>
  readonly spans: Array<Tracer.Span>
}

/** Logs of every level and spans, recorded into `seen` for the effect under it. */
const observed = (seen: Seen): Layer.Layer<never> =>
  Layer.mergeAll(
    Logger.replace(
      Logger.defaultLogger,
      Logger.make(({ annotations, cause, logLevel, message }) => {
        seen.logs.push(
          [logLevel.label, ...textsOf(message), ...textsOf(cause), ...HashMap.toEntries(annotations).flatMap((entry) => textsOf(entry))].join(" ")
        )
      })
    ),
    Logger.minimumLogLevel(LogLevel.All),
    Layer.unwrapEffect(
      Effect.map(Effect.tracer, (native) =>
        Layer.setTracer(Tracer.make({
          span: (...args) => {
            const span = native.span(...args)
            seen.spans.push(span)
            return span
          },
          context: (f, fiber) => native.context(f, fiber)
        })))
    )
  )

/** Everything recorded of a span: name, attributes, events, links and how it ended. */
const spanTexts = (span: Tracer.Span): Array<string> => [
  span.name,
  ...textsOf([...span.attributes.entries()]),
  ...("events" in span ? textsOf(span.events) : []),
  ...(span.status._tag === "Ended" ? textsOf(span.status.exit) : [])
]

/** Every metric's name, description and labels. */
const metricTexts: Effect.Effect<Array<string>> = Effect.map(Metric.snapshot, (pairs) =>
  pairs.flatMap((pair) => [pair.metricKey.name, String(pair.metricKey.description), ...textsOf(pair.metricKey.tags)]))

/**
 * Runs `body` (which must fail) under recording logs and spans; checks that its error, the logs,
 * the spans and the metrics hold no secret, and that there was something to check.
 */
const withoutSecrets = <E>(
  label: string,
  body: Effect.Effect<unknown, E, Scope.Scope>,
  expect: { readonly spans: boolean; readonly logs?: boolean }
) =>
  Effect.gen(function*() {
    const seen: Seen = { logs: [], spans: [] }
    const exit = yield* Effect.exit(Effect.scoped(body).pipe(Effect.provide(observed(seen))))
    assert.isTrue(Exit.isFailure(exit), `${label}: the failure path was provoked`)
    const error = Exit.isFailure(exit) ? Cause.squash(exit.cause) : undefined
    console.log(`[${label}] ${error instanceof Error ? error.message : String(error)}`)
    const places: Array<readonly [string, ReadonlyArray<string>]> = [
      ["the error", [...textsOf(error), ...(Exit.isFailure(exit) ? textsOf(exit.cause) : [])]],
      ["a log line", seen.logs],
      ["a span", seen.spans.flatMap(spanTexts)],
      ["a metric", yield* metricTexts]
    ]
    for (const [place, texts] of places) {
      for (const secret of secrets) {
        const found = texts.find((text) => text.includes(secret))
        assert.isUndefined(found, `${label}: ${place} shows a password`)
      }
    }
    if (expect.spans) assert.isAbove(seen.spans.length, 0, `${label}: spans were recorded`)
    if (expect.logs === true) assert.isAbove(seen.logs.length, 0, `${label}: log lines were recorded`)
    return { error, seen }
  })

/** A backend started on `url` (`SqlBackend.layerConfig`). */
const startOn = (url: string, options?: SqlBackend.Options) => Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(url)), options))

/**
 * A lock released and then taken on `backend` while another transaction holds its row: the release
 * fails at the command timeout (and is logged), then the acquire fails there too.
 */
const stalled = (admin: SqlClient, backend: Layer.Layer<LockBackend, unknown>, placeholder: string) =>
  Effect.gen(function*() {
    const key = `stalled-${crypto.randomUUID()}`
    const lock = yield* Effect.provide(Lock.make(key, { name: "stalled" }), yield* Layer.build(backend))
    const held = yield* Scope.make()
    yield* Scope.extend(Lock.acquire(lock), held)
    const connection = yield* admin.reserve
    yield* connection.executeUnprepared("BEGIN", [], undefined)
    yield* connection.execute(`SELECT state FROM lockstep_locks WHERE name = ${placeholder} FOR UPDATE`, [key], undefined)
    yield* Effect.addFinalizer(() => Effect.ignore(connection.executeUnprepared("ROLLBACK", [], undefined)))
    yield* Scope.close(held, Exit.void)
    return yield* Effect.scoped(Lock.acquire(lock, { timeout: "3 seconds" }))
  })

/** `url` with another password, port or host, and query parameters. */
const variant = (url: string, change: { password?: string; port?: number; params?: Record<string, string> }) => {
  const next = new URL(url)
  if (change.password !== undefined) next.password = change.password
  if (change.port !== undefined) next.port = String(change.port)
  for (const [key, value] of Object.entries(change.params ?? {})) next.searchParams.set(key, value)
  return next.toString()
}

describe("the checks find a password where there is one", () => {
  it.scopedLive("a log line, a span attribute and an error carrying it are each caught", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<Effect.Effect<never, unknown>> = [
          Effect.zipRight(Effect.logDebug(`connecting with ${password}`), Effect.fail("failed")),
          Effect.fail("failed").pipe(Effect.withSpan("connect", { attributes: { url: `postgres://u:${password}@h/db` } })),
          Effect.fail(new Error("failed", { cause: new Error(`auth ${password}`) }))
      ]
      for (const leaking of cases) {
        const exit = yield* Effect.exit(withoutSecrets("leaking on purpose", leaking, { spans: false }))
        assert.isTrue(Exit.isFailure(exit) && Cause.isDie(exit.cause), "the leak is found")
      }
    }))
})

// PostgreSQL: a server of the test's own that checks passwords and takes only TLS
const servers = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(servers, Exit.void)))
const pg: OwnServer | undefined = ownServersAvailable
  ? await Effect.runPromise(Scope.extend(ownPostgresWith({ password, ssl: true }), servers))
  : undefined
if (pg === undefined) {
  if (required) throw new Error("the SQL secrets tests need initdb/pg_ctl on this machine")
  console.warn("PostgreSQL secrets suite NOT RUN: initdb/pg_ctl not installed")
}

describe.runIf(pg !== undefined)("no password in anything the backend reports, on PostgreSQL", () => {
  if (pg === undefined) return
  const tls = { sslmode: "verify-full", sslrootcert: pg.caFile! }
  const url = variant(pg.url, { params: tls })

  it.scopedLive("the URL connects (the other cases fail for their own reason only)", () =>
    Effect.gen(function*() {
      yield* startOn(url)
    }))

  it.scopedLive("a wrong password", () =>
    Effect.gen(function*() {
      const { error } = yield* withoutSecrets("pg wrong password", startOn(variant(url, { password: wrongPassword })), { spans: false })
      assert.include(String(error), "password authentication failed")
    }))

  it.scopedLive("a wrong password in a PgClient's options, under SqlBackend.layer", () =>
    Effect.gen(function*() {
      const port = Number(new URL(pg.url).port)
      const client = PgClient.layer({
        host: "127.0.0.1",
        port,
        database: "lockstep",
        username: "postgres",
        password: Redacted.make(wrongPassword),
        ssl: { ca: readFileSync(pg.caFile!, "utf8") }
      })
      yield* withoutSecrets("pg wrong password in options", Layer.build(SqlBackend.layer().pipe(Layer.provide(client))), { spans: false })
    }))

  it.scopedLive("a closed port", () =>
    Effect.gen(function*() {
      const { error } = yield* withoutSecrets("pg closed port", startOn(variant(url, { port: yield* freePort })), { spans: false })
      assert.include(String(error), "ECONNREFUSED")
    }))

  it.scopedLive("an untrusted certificate", () =>
    Effect.gen(function*() {
      const { error } = yield* withoutSecrets("pg untrusted certificate", startOn(variant(pg.url, { params: { sslmode: "verify-full" } })), { spans: false })
      assert.include(String(error), "certificate")
    }))

  it.scopedLive("no TLS where the server asks for it", () =>
    Effect.gen(function*() {
      const { error } = yield* withoutSecrets("pg plaintext", startOn(pg.url), { spans: false })
      assert.include(String(error), "no encryption")
    }))

  it.scopedLive("a row lock held past the command timeout", () =>
    Effect.gen(function*() {
      const admin = Context.get(yield* Layer.build(clientLayer("pg", url)), SqlClient)
      const backend = SqlBackend.layerConfig(Config.succeed(Redacted.make(url)), { commandTimeout: "300 millis" })
      const { error } = yield* withoutSecrets("pg command timeout", stalled(admin, backend, "$1"), { spans: true, logs: true })
      assert.strictEqual((error as { readonly _tag?: string } | undefined)?._tag, "BackendError")
    }), 30_000)
})

// MariaDB: the machine's server checks passwords; a user of this file's own
const mysql = await database("mysql")
const user = `lockstep_secret_${process.pid}_${Math.random().toString(36).slice(2, 8)}`
if (mysql !== undefined) {
  const name = new URL(mysql.url).pathname.slice(1)
  const asAdmin = (...statements: ReadonlyArray<string>) =>
    Effect.runPromise(
      Effect.flatMap(SqlClient, (sql) => Effect.forEach(statements, (statement) => sql.unsafe(statement), { discard: true })).pipe(
        Effect.provide(mysql.client),
        Effect.orDie
      )
    )
  await Effect.runPromise(SqlBackend.migrate().pipe(Effect.provide(mysql.client), Effect.orDie))
  await asAdmin(`CREATE USER '${user}'@'%' IDENTIFIED BY '${password}'`, `GRANT SELECT, INSERT, UPDATE, DELETE ON ${name}.* TO '${user}'@'%'`)
  afterAll(() => asAdmin(`DROP USER IF EXISTS '${user}'@'%'`))
}

describe.runIf(mysql !== undefined)("no password in anything the backend reports, on MariaDB", () => {
  if (mysql === undefined) return
  const url = (() => {
    const next = new URL(mysql.url)
    next.username = user
    next.password = password
    return next.toString()
  })()

  it.scopedLive("the URL connects (the other cases fail for their own reason only)", () =>
    Effect.gen(function*() {
      yield* startOn(url, { createSchema: false })
    }))

  it.scopedLive("a wrong password", () =>
    Effect.gen(function*() {
      const { error } = yield* withoutSecrets("mysql wrong password", startOn(variant(url, { password: wrongPassword }), { createSchema: false }), { spans: false })
      assert.include(String(error), "Access denied")
    }))

  it.scopedLive("a closed port", () =>
    Effect.gen(function*() {
      const { error } = yield* withoutSecrets("mysql closed port", startOn(variant(url, { port: yield* freePort }), { createSchema: false }), { spans: false })
      assert.include(String(error), "ECONNREFUSED")
    }))

  it.scopedLive("a row lock held past the command timeout", () =>
    Effect.gen(function*() {
      const admin = Context.get(yield* Layer.build(mysql.client), SqlClient)
      const backend = SqlBackend.layerConfig(Config.succeed(Redacted.make(url)), { commandTimeout: "300 millis", createSchema: false })
      const { error } = yield* withoutSecrets("mysql command timeout", stalled(admin, backend, "?"), { spans: true, logs: true })
      assert.strictEqual((error as { readonly _tag?: string } | undefined)?._tag, "BackendError")
    }), 30_000)
})
