/**
 * The literals written into SQL text (so that a transaction goes to the server in two calls) mean
 * what the parameters meant, whatever the session's settings. The server reads SQL text in the
 * connection's client_encoding: in a client-only encoding (SJIS, BIG5, GBK, GB18030, UHC, JOHAB) a
 * byte 0x5C can be the second byte of a character, which once let a key unbalance the escapes of
 * an E'…' string and run as SQL; dollar-quoted strings have no escapes. And the two-call
 * transactions keep one holder at a time under contention.
 */
import { assert, describe, it } from "@effect/vitest"
import { SqlClient } from "@effect/sql/SqlClient"
import { Context, Effect, Either, Layer } from "effect"
import { LockBackend } from "@lockstep/core/LockBackend"
import { Lock } from "@lockstep/core"
import { PgClient } from "@effect/sql-pg"
import { Redacted } from "effect"
import { SqlBackend } from "@lockstep/sql"
import { backend, database, type Database, exclusiveRequest } from "./fixtures/databases.js"

/**
 * The backend on a one-connection client whose connection was given `settings` first (a session
 * SET on a pooled connection stays for whoever borrows it next), and that client.
 */
const onSession = (db: Database, settings: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const client = PgClient.layer({ url: Redacted.make(db.url), maxConnections: 1 }).pipe(Layer.orDie)
    const context = yield* Layer.build(client)
    const sql = Context.get(context, SqlClient)
    for (const setting of settings) yield* Effect.orDie(sql.unsafe(setting))
    const service = Context.get(
      yield* Layer.build(SqlBackend.layer().pipe(Layer.provide(Layer.succeedContext(context)), Layer.orDie)),
      LockBackend
    )
    return { sql, service }
  })

const request = exclusiveRequest

const db = await database("pg")
const db2 = await database("pg")

describe.runIf(db !== undefined && db2 !== undefined)("inlined PostgreSQL literals in a client-only encoding", () => {
  it.scopedLive("client_encoding = SJIS: a key ending in 'Á\\' is granted, as the parameter path stores it", () =>
    Effect.gen(function*() {
      const { service, sql } = yield* onSession(db!, ["SET client_encoding = 'SJIS'"])
      const key = "review:\u00c1\\"
      // the key is one Lock.make accepts
      yield* Effect.provideService(Lock.make(key), LockBackend, service)
      // the parameter path (as before the change) stores and reads it back exactly
      const back = yield* Effect.orDie(sql.unsafe<{ v: string }>("SELECT $1::text AS v", [key]))
      assert.strictEqual(back[0]!.v, key, "the parameter path round-trips the key")
      const acquired = yield* Effect.either(service.acquire(request(key, `${service.clientId}:1`)))
      assert.isTrue(Either.isRight(acquired), `acquire failed: ${Either.isLeft(acquired) ? String(acquired.left) : ""}`)
    }), 60_000)

  it.scopedLive("client_encoding = SJIS, backslash_quote = on: a key's text never runs as SQL", () =>
    Effect.gen(function*() {
      const { service, sql } = yield* onSession(db2!, ["SET client_encoding = 'SJIS'", "SET backslash_quote = on"])
      // no quote, no brace, no control character: a key Lock.make takes
      const key = "]::text[]) AS n; COMMIT; CREATE TABLE injected_by_key (); --\u00c1\\"
      yield* Effect.provideService(Lock.make(key), LockBackend, service)
      yield* Effect.either(service.acquire(request(key, `${service.clientId}:1`)))
      const tables = yield* Effect.orDie(sql.unsafe<{ n: string }>("SELECT count(*)::text AS n FROM pg_tables WHERE tablename = 'injected_by_key'"))
      assert.strictEqual(tables[0]!.n, "0", "the key's text ran as SQL: table injected_by_key exists")
    }), 60_000)
})

// Stress: backends of their own (own pools, own client ids) contend on one key through the two-call
// transactions; at most one is ever inside, and fences only increase.
for (const kind of ["pg", "mysql"] as const) {
  const stressDb = await database(kind)
  describe.runIf(stressDb !== undefined)(`two-call transactions under contention on ${kind}`, () => {
    it.scopedLive("8 backends x 4 fibers x 8 cycles on one key: never two inside, fences increase", () =>
      Effect.gen(function*() {
        const services = yield* Effect.forEach(Array.from({ length: 8 }), () =>
          Effect.map(Layer.build(backend(stressDb!, { wakeUp: "poll", pollInterval: "5 millis" })), (context) => Context.get(context, LockBackend)))
        let inside = 0
        let most = 0
        let lastFence = -1
        let fenceOrderBroken = 0
        let cycles = 0
        yield* Effect.forEach(services, (service) =>
          Effect.forEach(Array.from({ length: 4 }), () =>
            Effect.gen(function*() {
              const lock = yield* Effect.provideService(Lock.make(`stress:${kind}`), LockBackend, service)
              for (let i = 0; i < 8; i++) {
                yield* Lock.withLock((lease) =>
                  Effect.gen(function*() {
                    inside++
                    most = Math.max(most, inside)
                    if (lease.fence <= lastFence) fenceOrderBroken++
                    lastFence = lease.fence
                    yield* Effect.sleep("1 millis")
                    inside--
                    cycles++
                  }), lock)
              }
            }), { concurrency: "unbounded", discard: true }), { concurrency: "unbounded", discard: true })
        assert.strictEqual(cycles, 8 * 4 * 8)
        assert.strictEqual(most, 1, "two holders inside at once")
        assert.strictEqual(fenceOrderBroken, 0, "a fence did not increase")
      }), 180_000)
  })
}
