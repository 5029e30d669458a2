/**
 * The SQL backend through a real PgBouncer (Debian's 1.18) in front of the machine's PostgreSQL,
 * in transaction, session and statement mode: which wake-up works in each, what a mode that
 * cannot work says at build, and how soon a waiter is let in after a release (printed: the figures
 * the README quotes). The conformance suite runs through transaction and session mode in
 * pgbouncer-*.test.ts.
 */
import { afterAll, assert, describe, it } from "@effect/vitest"
import { execFile } from "node:child_process"
import { Config, type Context, Effect, Exit, Fiber, Layer, Redacted, Scope } from "effect"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import { clientLayer, database, postgresServer } from "./fixtures/databases.js"
import { type PgBouncer, pgbouncer, pgbouncerAvailable, type PoolMode } from "./fixtures/pgbouncer.js"
import { freePort } from "./fixtures/servers.js"

const available = pgbouncerAvailable("PgBouncer suite")
const db = available ? await database("pg") : undefined
const name = db === undefined ? "" : new URL(db.url).pathname.slice(1)
const directUrl = db?.url ?? ""

// one PgBouncer per mode for the whole file, stopped before the file's database is dropped
const servers = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(servers, Exit.void)))
const started = (mode: PoolMode) =>
  db === undefined ? Promise.resolve(undefined) : Effect.runPromise(Scope.extend(pgbouncer(mode), servers))
const transaction = await started("transaction")
const session = await started("session")
const statement = await started("statement")

/** A backend with a client (a pool) of its own on `url`. */
const backendOn = (url: string, options?: SqlBackend.Options): Effect.Effect<Context.Context<LockBackend>, never, Scope.Scope> =>
  Layer.build(SqlBackend.layer(options).pipe(Layer.provide(clientLayer("pg", url)), Layer.orDie))

/** The error building a backend on `url` fails with. */
const buildError = (url: string, options?: SqlBackend.Options) =>
  Effect.flip(Effect.scoped(Layer.build(SqlBackend.layer(options).pipe(Layer.provide(clientLayer("pg", url))))))

/**
 * `rounds` hand-offs of a key from a holder on backend `a` to a waiter on backend `b`: the time
 * (ms) from the holder's release to the waiter's grant. The waiter's own retry is the lease's
 * remaining 30 seconds away: only a wake-up lets it in sooner.
 */
const handOffs = (a: Context.Context<LockBackend>, b: Context.Context<LockBackend>, rounds: number) =>
  Effect.gen(function*() {
    const times: Array<number> = []
    for (let i = 0; i < rounds; i++) {
      const key = `pgbouncer-hand-off-${crypto.randomUUID()}`
      const holder = yield* Scope.make()
      yield* Scope.extend(Effect.flatMap(Lock.make(key), (lock) => Lock.acquire(lock)), holder).pipe(Effect.provide(a))
      const waiter = yield* Effect.fork(
        Effect.scoped(Effect.flatMap(Lock.make(key), (lock) => Effect.map(Lock.acquire(lock, { timeout: "25 seconds" }), () => performance.now())))
          .pipe(Effect.provide(b))
      )
      // the waiter has found the key held and waits for a wake-up
      yield* Effect.sleep("300 millis")
      const released = performance.now()
      yield* Scope.close(holder, Exit.void)
      times.push((yield* Fiber.join(waiter)) - released)
    }
    return times
  }).pipe(Effect.orDie)

const summary = (label: string, times: ReadonlyArray<number>): string => {
  const sorted = [...times].sort((x, y) => x - y)
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!.toFixed(1)
  const line = `[${label}] release to grant, ${times.length} hand-offs: p50 ${at(0.5)} ms, max ${at(1)} ms`
  console.log(line)
  return line
}

/** Every hand-off well before the 30 s a waiter without a wake-up would wait (a loaded machine stalls at times). */
const assertWoken = (times: ReadonlyArray<number>) => {
  for (const ms of times) assert.isBelow(ms, 5_000, `a waiter was let in ${ms} ms after the release`)
}

/** `SHOW CONFIG`'s pool_mode on the admin console, by psql (the console speaks only the simple protocol). */
const poolModeOf = (bouncer: PgBouncer) =>
  Effect.async<string>((resume) => {
    execFile(
      "psql",
      ["-h", "127.0.0.1", "-p", String(bouncer.port), "-U", new URL(postgresServer).username || "postgres", "-At", "-c", "SHOW CONFIG", "pgbouncer"],
      { timeout: 10_000 },
      (error, stdout) => {
        const row = stdout.split("\n").find((line) => line.startsWith("pool_mode|"))
        resume(error === null && row !== undefined ? Effect.succeed(row.split("|")[1]!) : Effect.die(error ?? new Error(stdout)))
      }
    )
  })

describe.runIf(transaction !== undefined)("through PgBouncer in transaction mode", () => {
  const bouncer = transaction
  if (bouncer === undefined) return
  const url = bouncer.urlOf(name)

  it.effect("the launcher's PgBouncer pools by transaction", () =>
    Effect.map(poolModeOf(bouncer), (mode) => assert.strictEqual(mode, "transaction")))

  it.scopedLive("the default wake-up (LISTEN on the client) fails at build, saying why and what to set", () =>
    Effect.gen(function*() {
      const started = performance.now()
      const error = yield* buildError(url)
      console.log(`[transaction mode, default wakeUp] after ${Math.round(performance.now() - started)} ms: ${error.message}`)
      assert.strictEqual(error._tag, "BackendError")
      assert.strictEqual(
        error.message,
        `lock backend failed during listen on PostgreSQL 127.0.0.1:${bouncer.port}/${name}: no notification came back to LISTEN ` +
          "within 5s: a connection pooler in transaction or statement mode (PgBouncer pool_mode = transaction) does not pass " +
          "notifications on. Set the SQL backend's wakeUp option to { listenUrl } (a direct PostgreSQL URL for LISTEN) or to " +
          "\"poll\", or use pool_mode = session"
      )
    }), 30_000)

  it.scopedLive("wakeUp: \"poll\": a waiter is let in soon after another process's release (layerConfig, as a user configures it)", () =>
    Effect.gen(function*() {
      const fromConfig = (options: SqlBackend.Options) =>
        Layer.build(SqlBackend.layerConfig(Config.succeed(Redacted.make(url)), options).pipe(Layer.orDie))
      const a = yield* fromConfig({ wakeUp: "poll" })
      const b = yield* fromConfig({ wakeUp: "poll" })
      const times = yield* handOffs(a, b, 20)
      summary("transaction mode, wakeUp poll (25 ms)", times)
      assertWoken(times)
    }), 120_000)

  it.scopedLive("wakeUp: { listenUrl }: LISTEN straight to PostgreSQL wakes a waiter (no polling: pollInterval 1 hour)", () =>
    Effect.gen(function*() {
      const options: SqlBackend.Options = { wakeUp: { listenUrl: Redacted.make(directUrl) }, pollInterval: "1 hour" }
      const a = yield* backendOn(url, options)
      const b = yield* backendOn(url, options)
      const times = yield* handOffs(a, b, 20)
      summary("transaction mode, wakeUp listenUrl (direct LISTEN)", times)
      assertWoken(times)
    }), 120_000)

  it.scopedLive("a listenUrl that reaches another database fails at build, saying it must reach the client's", () =>
    Effect.gen(function*() {
      const other = `${postgresServer}/postgres`
      const error = yield* buildError(url, { wakeUp: { listenUrl: Redacted.make(other) } })
      console.log(`[listenUrl on another database] ${error.message}`)
      const direct = new URL(other)
      assert.strictEqual(
        error.message,
        `lock backend failed during listen on PostgreSQL 127.0.0.1:${bouncer.port}/${name}: no notification came back to LISTEN on ` +
          `PostgreSQL ${direct.hostname}:${direct.port || 5432}/postgres (wakeUp.listenUrl) within 5s: it must reach the client's ` +
          "database, directly or through PgBouncer in pool_mode = session"
      )
    }), 30_000)

  it.scopedLive("a listenUrl nothing answers on fails at build naming it, never its password", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const secret = `Pw-${crypto.randomUUID()}`
      const listenUrl = `postgres://postgres:${secret}@127.0.0.1:${port}/${name}`
      const error = yield* buildError(url, { wakeUp: { listenUrl: Redacted.make(listenUrl) } })
      console.log(`[listenUrl refused] ${error.message}`)
      assert.strictEqual(error._tag, "BackendError")
      assert.include(
        error.message,
        `lock backend failed during listen on PostgreSQL 127.0.0.1:${bouncer.port}/${name}: cannot open the LISTEN connection ` +
          `(wakeUp.listenUrl) to PostgreSQL 127.0.0.1:${port}/${name}: `
      )
      assert.include(error.message, "ECONNREFUSED")
      assert.notInclude(JSON.stringify(error), secret)
      assert.notInclude(error.message, secret)
    }), 30_000)
})

describe.runIf(session !== undefined)("through PgBouncer in session mode", () => {
  const bouncer = session
  if (bouncer === undefined) return
  const url = bouncer.urlOf(name)

  it.effect("the launcher's PgBouncer pools by session", () =>
    Effect.map(poolModeOf(bouncer), (mode) => assert.strictEqual(mode, "session")))

  it.scopedLive("the default wake-up (LISTEN on the client's own connection) lets a waiter in soon after a release", () =>
    Effect.gen(function*() {
      const a = yield* backendOn(url)
      const b = yield* backendOn(url)
      const times = yield* handOffs(a, b, 20)
      summary("session mode, default wakeUp (LISTEN)", times)
      assertWoken(times)
    }), 120_000)
})

describe.runIf(statement !== undefined)("through PgBouncer in statement mode", () => {
  const bouncer = statement
  if (bouncer === undefined) return
  const url = bouncer.urlOf(name)

  it.effect("the launcher's PgBouncer pools by statement", () =>
    Effect.map(poolModeOf(bouncer), (mode) => assert.strictEqual(mode, "statement")))

  for (const options of [{}, { wakeUp: "poll" }, { wakeUp: "poll", createSchema: false }] satisfies ReadonlyArray<SqlBackend.Options>) {
    it.scopedLive(`no transaction can run: building fails at once, saying which modes work (${JSON.stringify(options)})`, () =>
      Effect.gen(function*() {
        const error = yield* buildError(url, options)
        console.log(`[statement mode ${JSON.stringify(options)}] ${error.message}`)
        assert.strictEqual(
          error.message,
          `lock backend failed during connect on PostgreSQL 127.0.0.1:${bouncer.port}/${name}: transaction blocks not allowed in ` +
            "statement pooling mode (every lock operation is a transaction: connect through PgBouncer in pool_mode = transaction, " +
            "with the SQL backend's wakeUp option set, or in pool_mode = session)"
        )
      }), 30_000)
  }
})

describe.runIf(db !== undefined)("the same hand-off straight to PostgreSQL, for comparison", () => {
  if (db === undefined) return
  it.scopedLive("LISTEN on the client", () =>
    Effect.gen(function*() {
      const a = yield* backendOn(db.url)
      const b = yield* backendOn(db.url)
      const times = yield* handOffs(a, b, 20)
      summary("direct, default wakeUp (LISTEN)", times)
      assertWoken(times)
    }), 120_000)
})

describe("wakeUp's listenUrl is checked before any I/O", () => {
  it.scopedLive("on SQLite, which has no LISTEN, it is refused", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Effect.scoped(Layer.build(SqlBackend.layerConfig(
        Config.succeed(Redacted.make("sqlite::memory:")),
        { wakeUp: { listenUrl: Redacted.make("postgres://postgres@127.0.0.1:5432/locks") } }
      ))))
      assert.strictEqual(error._tag, "InvalidLockOptions")
      assert.include(error.message, "listenUrl is for PostgreSQL")
    }))

  it.scopedLive("a URL that is not postgres:// is refused", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(Effect.scoped(Layer.build(SqlBackend.layerConfig(
        Config.succeed(Redacted.make("sqlite::memory:")),
        { wakeUp: { listenUrl: Redacted.make("mysql://root@127.0.0.1:3306/locks") } }
      ))))
      assert.strictEqual(error._tag, "InvalidLockOptions")
      assert.include(error.message, "listenUrl must be a postgres:// or postgresql:// URL")
    }))
})
