/**
 * The SQL backend under a role with only the data rights on its tables: the tables made once by
 * their owner (`SqlBackend.migrate`), then the backend built with `createSchema: false` as a role
 * granted SELECT, INSERT, UPDATE and DELETE on them and nothing else, on PostgreSQL and MariaDB
 * (a database and roles of this file's own on the machine's services, dropped afterwards). The
 * whole conformance suite runs as that role; a role short of a right fails the layer with the
 * server's reason.
 */
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Config, Context, Effect, Fiber, Layer, Option, Redacted } from "effect"
import { SqlClient } from "@effect/sql/SqlClient"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import * as Conformance from "@lockstep/testkit/Conformance"
import { clientLayer, type Database, database, losingData } from "./fixtures/databases.js"

const suffix = `${process.pid}_${Math.random().toString(36).slice(2, 8)}`

/** Runs `statements` as the database's owner (the admin of the test server). */
const asOwner = (db: Database, ...statements: ReadonlyArray<string>): Promise<void> =>
  Effect.runPromise(
    Effect.flatMap(SqlClient, (sql) => Effect.forEach(statements, (statement) => sql.unsafe(statement), { discard: true })).pipe(
      Effect.provide(db.client),
      Effect.orDie
    )
  )

/** `db` as user `user` (password `password`). */
const as = (db: Database, user: string, password: string): Database => {
  const url = new URL(db.url)
  url.username = user
  url.password = password
  return { kind: db.kind, url: url.toString(), client: clientLayer(db.kind, url.toString()) }
}

/** The statements that make a login role and grant it `rights` (SQL after `GRANT`) on objects. */
interface Roles {
  readonly create: (role: string, password: string) => ReadonlyArray<string>
  readonly grant: (role: string, rights: string, on: string) => string
  readonly drop: (role: string) => ReadonlyArray<string>
  /** What the backend needs at run time: the statements README.md shows. */
  readonly leastPrivilege: (role: string, database: string) => ReadonlyArray<string>
}

const roles: Record<"pg" | "mysql", Roles> = {
  pg: {
    create: (role, password) => [`CREATE ROLE ${role} LOGIN PASSWORD '${password}'`],
    grant: (role, rights, on) => `GRANT ${rights} ON ${on} TO ${role}`,
    drop: (role) => [`DROP OWNED BY ${role}`, `DROP ROLE ${role}`],
    leastPrivilege: (role, database) => [
      `GRANT CONNECT ON DATABASE ${database} TO ${role}`,
      `GRANT USAGE ON SCHEMA public TO ${role}`,
      `GRANT SELECT, INSERT, UPDATE, DELETE ON lockstep_locks, lockstep_locks_ended TO ${role}`
    ]
  },
  mysql: {
    create: (role, password) => [`CREATE USER '${role}'@'%' IDENTIFIED BY '${password}'`],
    grant: (role, rights, on) => `GRANT ${rights} ON ${on} TO '${role}'@'%'`,
    drop: (role) => [`DROP USER IF EXISTS '${role}'@'%'`],
    leastPrivilege: (role, database) => [
      `GRANT SELECT, INSERT, UPDATE, DELETE ON ${database}.lockstep_locks TO '${role}'@'%'`,
      `GRANT SELECT, INSERT, UPDATE, DELETE ON ${database}.lockstep_locks_ended TO '${role}'@'%'`
    ]
  }
}

const restricted: SqlBackend.Options = { createSchema: false }

/** The layer's failure, printed. */
const layerFailure = (label: string, layer: Layer.Layer<LockBackend, unknown>) =>
  Effect.gen(function*() {
    const error = yield* Effect.flip(Effect.scoped(Layer.build(layer.pipe(Layer.mapError(String)))))
    console.log(`[${label}] ${error}`)
    return error
  })

const backendOn = (db: Database, options: SqlBackend.Options) =>
  SqlBackend.layer(options).pipe(Layer.provide(db.client))

/** The backend from `url` with `createSchema: false`, as an application would build it. */
const fromUrl = (url: string) => SqlBackend.layerConfig(Config.succeed(Redacted.make(url)), restricted)

for (const kind of ["pg", "mysql"] as const) {
  const db = await database(kind)
  const name = db === undefined ? "" : new URL(db.url).pathname.slice(1)
  const app = `lockstep_app_${suffix}`
  const bare = `lockstep_bare_${suffix}`
  const partial = `lockstep_partial_${suffix}`
  const reader = `lockstep_reader_${suffix}`
  const everyRole = [app, bare, partial, reader]
  const password = `Pw-${suffix}`
  const sql = roles[kind]
  if (db !== undefined) {
    // the owner makes the tables once; the roles get what each test says
    await Effect.runPromise(SqlBackend.migrate().pipe(Effect.provide(db.client), Effect.orDie))
    await asOwner(
      db,
      ...(kind === "pg" ? ["REVOKE CREATE ON SCHEMA public FROM PUBLIC", `REVOKE ALL ON DATABASE ${name} FROM PUBLIC`] : []),
      ...everyRole.flatMap((role) => sql.create(role, password)),
      ...sql.leastPrivilege(app, name),
      ...(kind === "pg" ? [`GRANT CONNECT ON DATABASE ${name} TO ${bare}, ${partial}, ${reader}`] : []),
      sql.grant(partial, "SELECT, INSERT, UPDATE, DELETE", kind === "pg" ? "lockstep_locks" : `${name}.lockstep_locks`),
      sql.grant(reader, "SELECT", kind === "pg" ? "lockstep_locks" : `${name}.lockstep_locks`),
      sql.grant(reader, "SELECT", kind === "pg" ? "lockstep_locks_ended" : `${name}.lockstep_locks_ended`)
    )
    afterAll(() => asOwner(db, ...everyRole.flatMap(sql.drop)))
  }

  describe.runIf(db !== undefined)(`SQL backend on ${kind} as a role with only SELECT, INSERT, UPDATE and DELETE`, () => {
    if (db === undefined) return
    const appDb = as(db, app, password)

    Conformance.suite({
      name: `sql ${kind}, least privilege`,
      layer: SqlBackend.layer(restricted).pipe(Layer.provide(appDb.client), Layer.orDie),
      clock: "live",
      dataLoss: losingData(appDb, restricted),
      // every statement runs in each of them; the full 200 run in conformance.test.ts
      modelRuns: 50
    })

    it.scopedLive("a release on one backend wakes a waiter of another at once (PostgreSQL: LISTEN/NOTIFY)", () =>
      Effect.gen(function*() {
        const key = `wake-${crypto.randomUUID()}`
        const mine = yield* Effect.provide(Lock.make(key), yield* Layer.build(SqlBackend.layer(restricted).pipe(Layer.provide(appDb.client))))
        const theirs = yield* Effect.provide(Lock.make(key), yield* Layer.build(SqlBackend.layer(restricted).pipe(Layer.provide(appDb.client))))
        const hold = yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(mine)
          const waiter = yield* Effect.fork(Effect.scoped(Effect.map(Lock.acquire(theirs, { timeout: "10 seconds" }), () => performance.now())))
          yield* Effect.sleep("300 millis")
          assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "the waiter waits while the lock is held")
          return { waiter, releasedAt: performance.now() }
        }))
        const grantedAt = yield* Fiber.join(hold.waiter)
        console.log(`[${kind} least privilege] waiter of another backend let in ${(grantedAt - hold.releasedAt).toFixed(0)} ms after the release`)
        assert.isBelow(grantedAt - hold.releasedAt, 1_000)
      }).pipe(Effect.orDie), 30_000)

    it.scopedLive("forceRelease as that role frees a held key, and another holder gets in", () =>
      Effect.gen(function*() {
        const key = `force-${crypto.randomUUID()}`
        const mine = yield* Layer.build(SqlBackend.layer(restricted).pipe(Layer.provide(appDb.client)))
        const theirs = yield* Layer.build(SqlBackend.layer(restricted).pipe(Layer.provide(appDb.client)))
        const held = yield* Effect.provide(Lock.make(key), mine)
        const other = yield* Effect.provide(Lock.make(key), theirs)
        yield* Lock.acquire(held)
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(other))), "held: the other is kept out")
        assert.isTrue(yield* Context.get(theirs, LockBackend).forceRelease({ key, id: crypto.randomUUID() }))
        assert.isFalse(yield* Lock.isLocked(other))
        assert.isTrue(Option.isSome(yield* Effect.scoped(Lock.tryAcquire(other))), "freed: the other gets in")
      }).pipe(Effect.orDie), 30_000)

    it.scopedLive("the sweeper deletes expired rows of both tables as that role", () =>
      Effect.gen(function*() {
        const key = `sweep-${crypto.randomUUID()}`
        const owner = Context.get(yield* Layer.build(db.client), SqlClient)
        const p = kind === "pg" ? ["$1", "$2"] : ["?", "?"]
        yield* owner.unsafe(`INSERT INTO lockstep_locks (name, state, expires_at, version) VALUES (${p[0]}, '', 1, 1)`, [key])
        yield* owner.unsafe(`INSERT INTO lockstep_locks_ended (name, holder, expires_at) VALUES (${p[0]}, ${p[1]}, 1)`, [key, "gone"])
        const count = Effect.map(
          Effect.zipWith(
            owner.unsafe<{ readonly n: number | string }>(`SELECT COUNT(*) AS n FROM lockstep_locks WHERE name = ${p[0]}`, [key]),
            owner.unsafe<{ readonly n: number | string }>(`SELECT COUNT(*) AS n FROM lockstep_locks_ended WHERE name = ${p[0]}`, [key]),
            (a, b) => Number(a[0]?.n) + Number(b[0]?.n)
          ),
          (n) => n
        )
        assert.strictEqual(yield* count, 2)
        yield* Layer.build(SqlBackend.layer({ ...restricted, sweepInterval: "100 millis" }).pipe(Layer.provide(appDb.client)))
        const deadline = Date.now() + 5_000
        while ((yield* count) > 0 && Date.now() < deadline) yield* Effect.sleep("50 millis")
        assert.strictEqual(yield* count, 0, "the expired rows are gone")
      }).pipe(Effect.orDie), 30_000)

    it.scopedLive("the default createSchema: true fails the layer: the role may not create, and the message says so", () =>
      Effect.gen(function*() {
        const error = yield* layerFailure(`${kind} createSchema as app`, backendOn(appDb, {}))
        assert.include(error, "BackendError")
        assert.include(error, kind === "pg" ? "permission denied for schema public" : "CREATE command denied")
        assert.include(error, "SqlBackend.migrate")
        assert.include(error, "createSchema: false")
      }))

    it.scopedLive("a role without any right fails the layer at once, with the server's reason", () =>
      Effect.gen(function*() {
        const error = yield* layerFailure(`${kind} no rights`, fromUrl(as(db, bare, password).url))
        assert.include(error, "BackendError")
        assert.include(
          error,
          kind === "pg"
            ? "during checkTables on PostgreSQL 127.0.0.1:"
            : `during connect on MySQL ${new URL(db.url).host}/${name}: Access denied for user '${bare}'`
        )
        if (kind === "pg") assert.include(error, "permission denied for table lockstep_locks (")
      }))

    it.scopedLive("a role with rights on lockstep_locks but not on lockstep_locks_ended fails the layer at once, naming it", () =>
      Effect.gen(function*() {
        const error = yield* layerFailure(`${kind} no rights on _ended`, fromUrl(as(db, partial, password).url))
        assert.include(error, "BackendError")
        assert.include(error, "during checkTables")
        assert.include(error, kind === "pg" ? "permission denied for table lockstep_locks_ended" : `command denied to user '${partial}'`)
        assert.include(error, "lockstep_locks_ended")
      }))

    it.scopedLive("a role that may only read fails the layer at once, naming what it may not do", () =>
      Effect.gen(function*() {
        const error = yield* layerFailure(`${kind} read only`, fromUrl(as(db, reader, password).url))
        assert.include(error, "BackendError")
        assert.include(error, "during checkTables")
        assert.include(error, kind === "pg" ? "permission denied for table lockstep_locks" : `INSERT, UPDATE command denied to user '${reader}'`)
        assert.include(error, "the backend needs SELECT, INSERT, UPDATE and DELETE on lockstep_locks and lockstep_locks_ended")
      }))

    if (kind === "pg") {
      it.scopedLive("tables in a schema of their own: USAGE on it is needed, and its lack is named", () =>
        Effect.gen(function*() {
          const schema = `locks_${suffix}`
          const options = { ...restricted, schema }
          yield* SqlBackend.migrate(options).pipe(Effect.provide(db.client))
          const owner = Context.get(yield* Layer.build(db.client), SqlClient)
          yield* owner.unsafe(`GRANT SELECT, INSERT, UPDATE, DELETE ON ${schema}.lockstep_locks, ${schema}.lockstep_locks_ended TO ${app}`)
          const error = yield* layerFailure("pg no USAGE on schema", backendOn(appDb, options))
          assert.include(error, `permission denied for schema ${schema}`)
          assert.include(error, "USAGE on their schema")
          yield* owner.unsafe(`GRANT USAGE ON SCHEMA ${schema} TO ${app}`)
          const lock = yield* Effect.provide(Lock.make("in-schema"), yield* Layer.build(backendOn(appDb, options)))
          assert.isAbove(yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)), 0)
        }).pipe(Effect.orDie), 30_000)
    }

    it.scopedLive("a table that was never made fails the layer at once, pointing at SqlBackend.migrate", () =>
      Effect.gen(function*() {
        // as the owner: a role without rights on a table is not told whether it exists (MariaDB)
        const error = yield* layerFailure(`${kind} no table`, backendOn(db, { ...restricted, table: "never_made" }))
        assert.include(error, "BackendError")
        assert.include(error, "never_made")
        assert.include(error, "SqlBackend.migrate")
      }))
  })
}

const sqlite = await database("sqlite")
describe.runIf(sqlite !== undefined)("SQL backend on sqlite with createSchema: false", () => {
  if (sqlite === undefined) return
  it.scopedLive("tables never made fail the layer pointing at SqlBackend.migrate; once made, it starts and locks", () =>
    Effect.gen(function*() {
      const options = { ...restricted, table: "made_later" }
      const error = yield* layerFailure("sqlite no table", backendOn(sqlite, options))
      assert.include(error, "BackendError")
      assert.include(error, "during checkTables on SQLite")
      assert.include(error, "no such table: made_later (make made_later and made_later_ended with SqlBackend.migrate")
      yield* SqlBackend.migrate(options).pipe(Effect.provide(sqlite.client))
      const lock = yield* Effect.provide(Lock.make("made"), yield* Layer.build(backendOn(sqlite, options)))
      assert.isAbove(yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)), 0)
    }).pipe(Effect.orDie))
})
