/**
 * Calls to the server per operation, counted by a client that wraps the real one: on PostgreSQL and
 * MySQL/MariaDB every transaction is two calls (BEGIN, the row locks and the reads in one; the
 * writes and COMMIT in the other), so an uncontended lock+unlock cycle is four. A commit whose reply
 * is lost was applied once: the re-sent operation finds it. A client that takes one statement per
 * call gets the transactions statement by statement, with the same answers.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Duration, Effect, Either, Layer } from "effect"
import { SqlClient } from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import { database, type Database, exclusiveRequest } from "./fixtures/databases.js"

/** What the wrapped client saw and what it is to do with the next calls. */
interface Calls {
  /** The SQL text of every call, in order. */
  readonly texts: Array<string>
  /** The next call whose text this matches runs on the server, and its caller gets an error instead of the reply. */
  loseReplyTo: RegExp | undefined
  /** Calls with several statements fail, as on a client that takes one per call. */
  oneStatementPerCall: boolean
}

const wrapConnection = (connection: Connection, calls: Calls): Connection =>
  new Proxy(connection, {
    get: (target, property, receiver) => {
      const value: unknown = Reflect.get(target, property, receiver)
      if (typeof property !== "string" || !property.startsWith("execute") || typeof value !== "function") return value
      // counted when run, not when made
      return (sql: string, ...rest: ReadonlyArray<unknown>) =>
        Effect.suspend(() => {
          calls.texts.push(sql)
          if (calls.oneStatementPerCall && sql.includes(";")) {
            return Effect.fail(new Error("this client takes one statement per call"))
          }
          const effect = (value as (...args: ReadonlyArray<unknown>) => Effect.Effect<unknown, unknown>).call(target, sql, ...rest)
          if (calls.loseReplyTo === undefined || !calls.loseReplyTo.test(sql)) return effect
          calls.loseReplyTo = undefined
          return Effect.zipRight(effect, Effect.fail(new Error("connection lost before the reply")))
        })
    }
  })

/** The client of `db`, with every connection it lends counted in `calls`. */
const countedClient = (db: Database, calls: Calls): Layer.Layer<SqlClient> =>
  Layer.effect(
    SqlClient,
    Effect.map(SqlClient, (sql) =>
      new Proxy(sql, {
        get: (target, property) =>
          property === "reserve"
            ? Effect.map(target.reserve, (connection) => wrapConnection(connection, calls))
            : Reflect.get(target, property, target)
      }))
  ).pipe(Layer.provide(db.client))

const newCalls = (): Calls => ({ texts: [], loseReplyTo: undefined, oneStatementPerCall: false })

/** The backend on `db` through the counting client, once its start-up sweep (a transaction of its own) is over. */
const countedBackend = (db: Database, calls: Calls) =>
  Effect.gen(function*() {
    const service = Context.get(yield* Layer.build(SqlBackend.layer().pipe(Layer.provide(countedClient(db, calls)), Layer.orDie)), LockBackend)
    const swept = () => {
      const at = calls.texts.findIndex((text) => /^DELETE FROM \S*lockstep_locks_ended/.test(text))
      return at >= 0 && calls.texts.slice(at + 1).includes("COMMIT")
    }
    const deadline = Date.now() + 10_000
    while (!swept() && Date.now() < deadline) yield* Effect.sleep(Duration.millis(5))
    assert.isTrue(swept(), "the start-up sweep ran")
    return service
  })

/** Calls made by `effect`. */
const counted = <A, E, R>(calls: Calls, effect: Effect.Effect<A, E, R>): Effect.Effect<readonly [A, number], E, R> =>
  Effect.suspend(() => {
    const before = calls.texts.length
    return Effect.map(effect, (a) => [a, calls.texts.length - before] as const)
  })

const acquireRequest = exclusiveRequest

for (const kind of ["pg", "mysql"] as const) {
  const db = await database(kind)
  describe.runIf(db !== undefined)(`calls to the server on ${kind}`, () => {
    if (db === undefined) return

    it.scopedLive("every transaction is two calls: a lock+unlock cycle is four", () =>
      Effect.gen(function*() {
        const calls = newCalls()
        const service = yield* countedBackend(db, calls)
        const key = `calls:${kind}:ops`
        const holder = `${service.clientId}:1`

        const [granted, acquireCalls] = yield* counted(calls, service.acquire(acquireRequest(key, holder)))
        assert.strictEqual(granted._tag, "Granted")
        assert.strictEqual(acquireCalls, 2, "acquire by a new holder (it reads the ended holders too)")
        const [reentered, reentryCalls] = yield* counted(calls, service.acquire(acquireRequest(key, holder, 2)))
        assert.strictEqual(reentered._tag, "Granted")
        assert.strictEqual(reentryCalls, 2, "re-entry")
        const [renewed, renewCalls] = yield* counted(calls, service.renew([{ key, holder, leaseMs: 10_000 }]))
        assert.deepStrictEqual(renewed.map((r) => Either.getOrElse(r, () => false)), [true])
        assert.strictEqual(renewCalls, 2, "renew")
        const [denied, deniedCalls] = yield* counted(calls, service.acquire(acquireRequest(key, `${service.clientId}:2`)))
        assert.strictEqual(denied._tag, "Denied")
        assert.strictEqual(deniedCalls, 2, "a denied acquire (nothing to write: COMMIT alone)")
        assert.strictEqual(yield* service.release({ key, holder, mode: "exclusive", count: 2, leaseMs: 10_000 }), 1)
        const [released, releaseCalls] = yield* counted(
          calls,
          service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 10_000 })
        )
        assert.strictEqual(released, 0)
        assert.strictEqual(releaseCalls, 2, "last release (it remembers the ended holder)")

        // the Lock API on top: one acquire and one release per cycle, nothing else
        const lock = yield* Effect.provideService(Lock.make(`calls:${kind}:lock`), LockBackend, service)
        yield* Lock.withLock(Effect.void, lock)
        const [, cycleCalls] = yield* counted(calls, Lock.withLock(Effect.void, lock))
        assert.strictEqual(cycleCalls, 4, "an uncontended lock+unlock cycle")
      }), 60_000)

    it.scopedLive("a commit whose reply is lost was applied once: the re-sent operation finds it", () =>
      Effect.gen(function*() {
        const calls = newCalls()
        const service = yield* countedBackend(db, calls)
        const key = `calls:${kind}:lost`
        const holder = `${service.clientId}:1`
        const request = acquireRequest(key, holder)

        calls.loseReplyTo = /COMMIT$/
        const lost = yield* Effect.either(service.acquire(request))
        assert.isTrue(Either.isLeft(lost) && lost.left._tag === "BackendError", "the caller saw the lost reply")
        const granted = yield* service.acquire(request)
        assert.strictEqual(granted._tag, "Granted")
        const fence = granted._tag === "Granted" ? granted.fence : -1
        assert.strictEqual(granted._tag === "Granted" ? granted.count : -1, 1, "the copy did not enter twice")
        const held = yield* service.inspect(key)
        assert.deepStrictEqual(held.holders.map((h) => [h.holder, h.exclusive, h.fence]), [[holder, 1, fence]])

        calls.loseReplyTo = /COMMIT$/
        const lostRelease = yield* Effect.either(service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 10_000 }))
        assert.isTrue(Either.isLeft(lostRelease), "the caller saw the lost reply")
        assert.strictEqual(yield* service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 10_000 }), 0)
        assert.strictEqual((yield* service.inspect(key)).holders.length, 0)

        // the ended holder is remembered: a late copy of its acquisition grants nothing
        const late = yield* Effect.either(service.acquire(request))
        assert.isTrue(Either.isLeft(late) && late.left._tag === "NotHeld", "a late copy of the acquisition")
        const next = yield* service.acquire(acquireRequest(key, `${service.clientId}:2`))
        assert.isTrue(next._tag === "Granted" && next.fence > fence, "the next grant has a larger fence")
      }), 60_000)

    // MySQL only: a PostgreSQL client sends several statements in a simple query, as the backend's
    // BEGIN has always done
    if (kind === "mysql") {
    it.scopedLive("a client that takes one statement per call gets the same answers, statement by statement", () =>
      Effect.gen(function*() {
        const calls = newCalls()
        calls.oneStatementPerCall = true
        const service = yield* countedBackend(db, calls)
        const key = `calls:${kind}:single`
        const holder = `${service.clientId}:1`
        const [granted, acquireCalls] = yield* counted(calls, service.acquire(acquireRequest(key, holder)))
        assert.strictEqual(granted._tag, "Granted")
        assert.isAbove(acquireCalls, 2)
        assert.isFalse(calls.texts.slice(-acquireCalls).some((text) => text.includes(";")), "one statement per call")
        const denied = yield* service.acquire(acquireRequest(key, `${service.clientId}:2`))
        assert.strictEqual(denied._tag, "Denied")
        assert.strictEqual(yield* service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 10_000 }), 0)
        const late = yield* Effect.either(service.acquire(acquireRequest(key, holder)))
        assert.isTrue(Either.isLeft(late) && late.left._tag === "NotHeld")
      }), 60_000)
    }
  })
}
