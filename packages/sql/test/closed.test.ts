/**
 * A handle used after its SQL backend's layer closed: every operation fails with the typed
 * closed-backend error (also where the client is borrowed and still open), and a waiter blocked
 * when the layer closes fails at once instead of waiting. Each prints the message it got.
 */
import { assert, describe, it } from "@effect/vitest"
import { Config, Context, Duration, Effect, Exit, Fiber, Layer, Option, Redacted, Scope } from "effect"
import { Lock, LockError } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import { database, type Database } from "./databases.js"

/** How the backend names `db` in its errors. */
const endpointOf = (db: Database): string => {
  if (db.kind === "sqlite") return `SQLite ${db.url}`
  const url = new URL(db.url)
  return `${db.kind === "pg" ? "PostgreSQL" : "MySQL"} ${url.hostname}:${url.port}${url.pathname}`
}

const closedMessage = (db: Database, operation: string) =>
  `lock backend failed during ${operation} on ${endpointOf(db)}: the SQL backend is closed (the layer or scope that made it has ended)`

/** Every operation of `service`, each called once, with what it ended with. */
const everyOperation = (service: LockBackend["Type"], key: string) => {
  const holder = `${service.clientId}:1`
  const calls: ReadonlyArray<readonly [string, Effect.Effect<unknown, { readonly _tag: string }>]> = [
    ["acquire", service.acquire({ key, holder, mode: "exclusive", permits: 1, limit: 1, leaseMs: 5_000, fair: false, waiterTtlMs: 1_000, count: 1 })],
    ["release", service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 5_000 })],
    ["renew", service.renew([{ key, holder, leaseMs: 5_000 }])],
    ["inspect", service.inspect(key)],
    ["raiseFence", service.raiseFence({ key, fence: 1, leaseMs: 5_000 })],
    ["forceRelease", service.forceRelease({ key, id: crypto.randomUUID() })],
    ["cancel", service.cancel({ key, holder, leaseMs: 5_000 })],
    ["subscribe", Effect.scoped(service.subscribe(key, holder, "exclusive"))],
    ["latchSetCount", service.latchSetCount({ key: `${key}:latch`, id: crypto.randomUUID(), count: 2 })],
    ["latchCountDown", service.latchCountDown({ key: `${key}:latch`, id: crypto.randomUUID() })],
    ["latchCount", service.latchCount(`${key}:latch`)],
    ["latchSubscribe", Effect.scoped(service.latchSubscribe(`${key}:latch`, holder))]
  ]
  return Effect.forEach(calls, ([operation, call]) =>
    Effect.map(Effect.exit(Effect.timeout(call, "5 seconds")), (exit) => ({ operation, exit })))
}

/** The error `exit` failed with, or a description of how it ended otherwise. */
const failureOf = (exit: Exit.Exit<unknown, unknown>): unknown =>
  Exit.match(exit, {
    onSuccess: (value) => `succeeded with ${JSON.stringify(value)}`,
    onFailure: (cause) => cause._tag === "Fail" ? cause.error : `ended with ${cause._tag}`
  })

const checkEveryOperation = (db: Database, service: LockBackend["Type"], key: string) =>
  Effect.gen(function*() {
    const results = yield* everyOperation(service, key)
    for (const { exit, operation } of results) {
      const error = failureOf(exit)
      const message = error instanceof LockError.BackendError ? error.message : String(error instanceof Error ? error.message : error)
      console.log(`[${db.kind} closed: ${operation}] ${message}`)
      assert.isTrue(Exit.isFailure(exit), `${operation} after the close: ${message}`)
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
