/**
 * A handle used after its SQL backend's layer closed, where the SQL backend differs from the others
 * (the conformance suite's "closed backend" test checks what every backend does): the client is
 * borrowed and still open, or the backend's own (`layerConfig`), and every message names the
 * database's endpoint. Each prints the message it got.
 */
import { assert, describe, it } from "@effect/vitest"
import { Config, Context, Duration, Effect, Exit, Fiber, Layer, Option, Redacted, Scope } from "effect"
import { Lock, LockError } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import * as Conformance from "@lockstep/testkit/Conformance"
import { database, type Database } from "./fixtures/databases.js"

/** How the backend names `db` in its errors. */
const endpointOf = (db: Database): string => {
  if (db.kind === "sqlite") return `SQLite ${db.url}`
  const url = new URL(db.url)
  return `${db.kind === "pg" ? "PostgreSQL" : "MySQL"} ${url.hostname}:${url.port}${url.pathname}`
}

const closedMessage = (db: Database, operation: string) =>
  `lock backend failed during ${operation} on ${endpointOf(db)}: the SQL backend is closed (the layer or scope that made it has ended)`

/** The error `exit` failed with, or a description of how it ended otherwise. */
const failureOf = (exit: Exit.Exit<unknown, unknown>): unknown =>
  Exit.match(exit, {
    onSuccess: (value) => `succeeded with ${JSON.stringify(value)}`,
    onFailure: (cause) => cause._tag === "Fail" ? cause.error : `ended with ${cause._tag}`
  })

/** Every operation fails with the closed error, whose message names this database's endpoint. */
const checkEveryOperation = (db: Database, service: LockBackend["Type"], key: string) =>
  Effect.gen(function*() {
    for (const { error, operation } of yield* Conformance.callEveryOperation(service, key)) {
      const message = error instanceof LockError.BackendError ? error.message : String(error instanceof Error ? error.message : error)
      console.log(`[${db.kind} closed: ${operation}] ${message}`)
      assert.isTrue(error instanceof LockError.BackendError && LockError.isBackendClosed(error), `${operation}: ${message}`)
      assert.strictEqual(message, closedMessage(db, operation))
    }
  })

for (const kind of ["pg", "mysql", "sqlite"] as const) {
  const db = await database(kind)
  describe.runIf(db !== undefined)(`a handle used after its SQL backend closed, on ${kind}`, () => {
    if (db === undefined) return

    it.scopedLive("on a borrowed client that stays open: every operation fails typed", () =>
      Effect.gen(function*() {
        const client = yield* Layer.build(db.client)
        const backendScope = yield* Scope.make()
        const context = yield* Layer.buildWithScope(SqlBackend.layer(), backendScope).pipe(Effect.provide(client), Effect.orDie)
        yield* Scope.close(backendScope, Exit.void)
        yield* checkEveryOperation(db, Context.get(context, LockBackend), `closed:${kind}:ops`)
      }), 60_000)

    it.scopedLive("on a borrowed client that stays open: a waiter blocked at the close fails at once", () =>
      Effect.gen(function*() {
        const client = yield* Layer.build(db.client)
        const backendScope = yield* Scope.make()
        const context = yield* Layer.buildWithScope(SqlBackend.layer(), backendScope).pipe(Effect.provide(client), Effect.orDie)
        const lock = yield* Lock.make(`closed:${kind}:borrowed`).pipe(Effect.provide(context))
        const holder = yield* Effect.fork(Lock.withLock(Effect.never, lock))
        while (!(yield* Lock.isLocked(lock))) yield* Effect.sleep("10 millis")
        const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
        yield* Effect.sleep("200 millis")

        const closedAt = performance.now()
        const closing = yield* Effect.disconnect(Scope.close(backendScope, Exit.void)).pipe(Effect.timeout("3 seconds"), Effect.option)
        assert.isTrue(Option.isSome(closing), "closing the layer did not end within 3 s")
        const waited = yield* Fiber.join(waiter).pipe(Effect.exit, Effect.timeout("3 seconds"), Effect.option)
        const took = performance.now() - closedAt
        const waitedError = Option.isSome(waited) ? failureOf(waited.value) : "still waiting 3 s after the close"
        console.log(
          `[${kind} closed: blocked waiter] after ${took.toFixed(0)} ms: ${
            waitedError instanceof LockError.BackendError ? waitedError.message : String(waitedError)
          }`
        )
        assert.isTrue(
          waitedError instanceof LockError.BackendError && LockError.isBackendClosed(waitedError),
          `the waiter: ${String(waitedError)}`
        )
        assert.strictEqual(waitedError instanceof LockError.BackendError ? waitedError.message : "", closedMessage(db, "acquire"))
        assert.isBelow(took, 1_000)
        yield* Fiber.interrupt(waiter)
        yield* Fiber.interrupt(holder)
      }), 60_000)

    it.scopedLive("with a client of its own (layerConfig): a lock made under it fails typed", () =>
      Effect.gen(function*() {
        const backendScope = yield* Scope.make()
        const url = kind === "sqlite" ? `sqlite:${db.url}` : db.url
        const context = yield* Layer.buildWithScope(SqlBackend.layerConfig(Config.succeed(Redacted.make(url))), backendScope).pipe(
          Effect.orDie
        )
        const lock = yield* Lock.make(`closed:${kind}:own`).pipe(Effect.provide(context))
        yield* Effect.scoped(Lock.acquire(lock))
        yield* Scope.close(backendScope, Exit.void)
        const tried = yield* Effect.flip(Effect.scoped(Lock.tryAcquire(lock))).pipe(Effect.timeout(Duration.seconds(10)))
        console.log(`[${kind} closed: own client, tryAcquire] ${tried.message}`)
        assert.isTrue(tried._tag === "BackendError" && LockError.isBackendClosed(tried), tried.message)
        assert.strictEqual(tried.message, closedMessage(db, "acquire"))
        yield* checkEveryOperation(db, Context.get(context, LockBackend), `closed:${kind}:own-ops`)
      }), 60_000)
  })
}
