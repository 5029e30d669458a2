/**
 * Faults of a real database server under the SQL backend, on a PostgreSQL and a MariaDB server of
 * the tests' own (a temporary data directory, a free port): a connection killed in the middle of a
 * transaction, the server restarted while a lock is held, and a row lock held by a stalled
 * transaction past the command timeout. Each prints what it observed.
 */
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Cause, Context, Duration, Effect, Exit, Fiber, Layer, Option, Scope } from "effect"
import { SqlClient } from "@effect/sql/SqlClient"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import { clientLayer, required } from "./fixtures/databases.js"
import { type OwnServer, ownMariadb, ownPostgres, ownServersAvailable } from "./fixtures/servers.js"

if (!ownServersAvailable) {
  if (required) throw new Error("the SQL fault tests need initdb/pg_ctl and mariadbd on this machine")
  console.warn("SQL faults suite NOT RUN: initdb/pg_ctl or mariadbd not installed")
}

// one server of each kind for the whole file, stopped and removed after its tests
const servers = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(servers, Exit.void)))
const started = async (start: Effect.Effect<OwnServer, never, Scope.Scope>) =>
  ownServersAvailable ? await Effect.runPromise(Scope.extend(start, servers)) : undefined

/** A backend with a client (a pool) of its own on `server`. */
const backendOn = (
  server: OwnServer,
  options?: SqlBackend.Options
): Effect.Effect<Context.Context<LockBackend>, never, Scope.Scope> =>
  Layer.build(SqlBackend.layer(options).pipe(Layer.provide(clientLayer(server.kind, server.url)), Layer.orDie))

/** A plain client on `server`, for statements of the test's own. */
const adminOn = (server: OwnServer): Effect.Effect<SqlClient, never, Scope.Scope> =>
  Effect.map(Layer.build(clientLayer(server.kind, server.url)), Context.get(SqlClient))

/** A transaction of the test's own that holds the row lock of `key` until `end`. */
const holdRowLock = (server: OwnServer, sql: SqlClient, key: string) =>
  Effect.gen(function*() {
    const connection = yield* sql.reserve
    yield* connection.executeUnprepared("BEGIN", [], undefined)
    const rows = yield* connection.execute(
      `SELECT state FROM lockstep_locks WHERE name = ${server.kind === "pg" ? "$1" : "?"} FOR UPDATE`,
      [key],
      undefined
    )
    assert.strictEqual(rows.length, 1, "the row exists")
    return { end: Effect.orDie(connection.executeUnprepared("COMMIT", [], undefined)) }
  }).pipe(Effect.orDie)

/** Server-side ids of the connections whose statement waits for a row lock. */
const waitingForRowLock = (server: OwnServer, sql: SqlClient): Effect.Effect<ReadonlyArray<number>> =>
  Effect.map(
    sql.unsafe<{ readonly id: number | string }>(
      server.kind === "pg"
        ? "SELECT pid AS id FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        : "SELECT ID AS id FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE 'INSERT INTO%' " +
          "AND ID <> CONNECTION_ID()"
    ),
    (rows) => rows.map((row) => Number(row.id))
  ).pipe(Effect.orDie)

const killConnection = (server: OwnServer, sql: SqlClient, id: number): Effect.Effect<void> =>
  Effect.asVoid(sql.unsafe(server.kind === "pg" ? `SELECT pg_terminate_backend(${id})` : `KILL ${id}`)).pipe(Effect.orDie)

const eventually = <A>(check: Effect.Effect<Option.Option<A>>, seconds = 10): Effect.Effect<A> =>
  Effect.gen(function*() {
    const deadline = Date.now() + seconds * 1_000
    while (Date.now() < deadline) {
      const found = yield* check
      if (Option.isSome(found)) return found.value
      yield* Effect.sleep("20 millis")
    }
    return yield* Effect.die(new Error("condition not reached"))
  })

const failureTag = (exit: Exit.Exit<unknown, { readonly _tag: string }>): string =>
  Exit.match(exit, {
    onSuccess: () => "success",
    onFailure: (cause) => Option.match(Cause.failureOption(cause), { onNone: () => Cause.pretty(cause), onSome: (e) => e._tag })
  })

const detailOf = (exit: Exit.Exit<unknown, unknown>): string =>
  Exit.isFailure(exit) ? Option.match(Cause.failureOption(exit.cause), { onNone: () => "", onSome: (e) => String(e) }) : ""

for (const kind of ["pg", "mysql"] as const) {
  const db = await started(kind === "pg" ? ownPostgres : ownMariadb)
  describe.runIf(db !== undefined)(`SQL backend faults on a ${kind} server of its own`, () => {
    if (db === undefined) return
    it.scopedLive("a connection killed while its transaction waits: typed BackendError, nothing held, the pool recovers", () =>
      Effect.gen(function*() {
        const admin = yield* adminOn(db)
        const backend = yield* backendOn(db)
        const lock = yield* Effect.provide(Lock.make("killed"), backend)
        const first = yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence))

        const blocker = yield* holdRowLock(db, admin, "killed")
        const attempt = yield* Effect.fork(Effect.exit(Effect.scoped(Effect.map(Lock.acquire(lock), (l) => l.fence))))
        const [waiting] = yield* eventually(
          Effect.map(waitingForRowLock(db, admin), (ids) => (ids.length === 1 ? Option.some(ids) : Option.none()))
        )
        const killedAt = performance.now()
        yield* killConnection(db, admin, waiting!)
        // the stalled transaction ends too: the failed attempt's clean-up release must get through
        yield* blocker.end
        const exit = yield* Fiber.join(attempt)
        const failedAfter = performance.now() - killedAt

        const heldAfter = yield* Lock.isLocked(lock)
        const next = yield* Effect.scoped(Effect.map(Lock.acquire(lock, { timeout: "5 seconds" }), (l) => l.fence))
        console.log(
          `[${kind} killed connection] the waiting acquire ended ${failureTag(exit)} (${detailOf(exit)}) ` +
            `${failedAfter.toFixed(0)} ms after the ` +
            `kill; held afterwards: ${heldAfter}; next acquire granted, fence ${first} -> ${next}`
        )
        assert.strictEqual(failureTag(exit), "BackendError")
        assert.isFalse(heldAfter)
        assert.isAbove(next, first)
      }))

    it.scopedLive("the server restarted while a lock is held: the lease survives, nobody else gets in", () =>
      Effect.gen(function*() {
        const holderBackend = yield* backendOn(db)
        const otherBackend = yield* backendOn(db)
        const watchdog = Duration.seconds(6)
        const mine = yield* Effect.provide(Lock.make("restarted", { watchdog }), holderBackend)
        const theirs = yield* Effect.provide(Lock.make("restarted", { watchdog }), otherBackend)

        const lease = yield* Lock.acquire(mine)
        const lost = yield* Effect.fork(lease.lost)
        const startedAt = performance.now()
        yield* db.restart
        const restartMs = performance.now() - startedAt
        // two renewal periods after the restart
        yield* Effect.sleep(Duration.times(watchdog, 2 / 3))
        const intruder = yield* Effect.scoped(
          Effect.map(Lock.tryAcquire(theirs), Option.isSome)
        ).pipe(Effect.either)
        const lostMeanwhile = Option.isSome(yield* Fiber.poll(lost))
        const remaining = yield* lease.expiresIn
        yield* Fiber.interrupt(lost)
        console.log(
          `[${kind} restart] restart took ${restartMs.toFixed(0)} ms; ${(2 / 3 * Duration.toMillis(watchdog)).toFixed(0)} ms ` +
            `later: lease lost: ${lostMeanwhile}, lease left ${Duration.toMillis(remaining).toFixed(0)} ms, ` +
            `another holder's tryAcquire ${intruder._tag === "Right" ? (intruder.right ? "GRANTED" : "refused") : `failed ${intruder.left._tag}`}`
        )
        assert.isFalse(lostMeanwhile)
        assert.deepStrictEqual(intruder._tag === "Right" ? intruder.right : undefined, false)
        assert.isAbove(Duration.toMillis(remaining), Duration.toMillis(watchdog) / 3)
      }), 60_000)

    it.scopedLive("a row lock held past the command timeout: each call fails in time with BackendError, then works", () =>
      Effect.gen(function*() {
        const admin = yield* adminOn(db)
        const backend = yield* backendOn(db, { commandTimeout: "400 millis" })
        const lock = yield* Effect.provide(Lock.make("stalled"), backend)
        yield* Effect.scoped(Lock.acquire(lock))

        const blocker = yield* holdRowLock(db, admin, "stalled")
        const outcomes: Array<{ readonly tag: string; readonly ms: number }> = []
        // more calls than the client's pool has connections
        for (let i = 0; i < 12; i++) {
          const startedAt = performance.now()
          const exit = yield* Effect.exit(Effect.scoped(Lock.acquire(lock)))
          outcomes.push({ tag: failureTag(exit), ms: performance.now() - startedAt })
        }
        const waitersLeft = (yield* waitingForRowLock(db, admin)).length
        yield* blocker.end
        const startedAt = performance.now()
        yield* Effect.scoped(Lock.acquire(lock, { timeout: "5 seconds" }))
        const recoveredMs = performance.now() - startedAt
        const slowest = Math.max(...outcomes.map((o) => o.ms))
        console.log(
          `[${kind} row lock held] 12 calls: ${[...new Set(outcomes.map((o) => o.tag))].join(", ")}, ` +
            `${Math.min(...outcomes.map((o) => o.ms)).toFixed(0)}-${slowest.toFixed(0)} ms each; statements still waiting ` +
            `on the server afterwards: ${waitersLeft}; after the stalled transaction ended, acquire granted in ` +
            `${recoveredMs.toFixed(0)} ms`
        )
        assert.deepStrictEqual([...new Set(outcomes.map((o) => o.tag))], ["BackendError"])
        assert.isBelow(slowest, 1_500)
        if (kind === "pg") assert.strictEqual(waitersLeft, 0, "statement_timeout ended the waiting statements")
      }), 60_000)
  })
}
