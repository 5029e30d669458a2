/**
 * A handle used after its Redis backend's layer closed: every operation fails with the typed
 * closed-backend error (`LockError.isBackendClosed`), not with ioredis's "Connection is closed."
 * (which reads like an outage), also under `layer({ client })` where the borrowed client is still
 * open; and waiters blocked in a subscription when the layer closes fail at once instead of
 * waiting. Each prints the message it got.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Layer as LayerType } from "effect"
import { ConfigProvider, Context, Effect, Exit, Fiber, Layer, Logger, Option, Scope } from "effect"
import { Redis } from "ioredis"
import { CountDownLatch, Lock, LockError } from "@lockstep/core"
import * as Conformance from "@lockstep/testkit/Conformance"
import { LockBackend } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import { rawClient, runnable, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis closed-backend suite (closed.test.ts)")

const closedMessage = (port: number, operation: string) =>
  `lock backend failed during ${operation} on Redis 127.0.0.1:${port}: the Redis backend is closed (the layer or scope that made it has ended)`

/** The error `exit` failed with, or a description of how it ended otherwise. */
const failureOf = (exit: Exit.Exit<unknown, unknown>): unknown =>
  Exit.match(exit, {
    onSuccess: (value) => `succeeded with ${JSON.stringify(value)}`,
    onFailure: (cause) => cause._tag === "Fail" ? cause.error : `ended with ${cause._tag}`
  })

const messageOf = (error: unknown): string =>
  error instanceof Error ? error.message : String(error)

const assertClosed = (port: number, what: string, operation: string, error: unknown, log = true) => {
  const message = messageOf(error)
  if (log) console.log(`[closed: ${what}: ${operation}] ${message}`)
  assert.isTrue(error instanceof LockError.BackendError && LockError.isBackendClosed(error), `${what}: ${operation}: ${message}`)
  assert.strictEqual((error as LockError.BackendError)._tag, "BackendError")
  assert.strictEqual(message, closedMessage(port, operation))
}

/** Every operation of `service` (the conformance suite's list), each failing with the closed error naming the endpoint. */
const checkEveryOperation = (port: number, what: string, service: LockBackend["Type"], key: string) =>
  Effect.gen(function*() {
    const failures: Array<string> = []
    const results = yield* Conformance.callEveryOperation(service, key)
    for (const { error, operation } of results) {
      if (!(error instanceof LockError.BackendError && LockError.isBackendClosed(error))) failures.push(`${operation}: ${messageOf(error)}`)
      console.log(`[closed: ${what}: ${operation}] ${messageOf(error)}`)
    }
    assert.deepStrictEqual(failures, [], `${what}: not failed as closed`)
    for (const { error, operation } of results) assertClosed(port, what, operation, error, false)
  })

/** A client the test opens (and quits at the end): the backend borrows it. */
const borrowed = (url: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const client = new Redis(url)
      client.on("error", () => undefined)
      return client
    }),
    (client) => Effect.promise(() => client.quit())
  )

/** Builds `layer` in a scope of its own, closed by the caller. */
const buildOwn = (layer: LayerType.Layer<LockBackend, unknown>) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(layer, scope).pipe(Effect.orDie)
    return { scope, context, service: Context.get(context, LockBackend) }
  })

describe.runIf(runnable)("a handle used after its Redis backend closed", () => {
  it.scopedLive("layer({ client }), the client still open: a Lock made under it and every operation fail typed", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const client = yield* borrowed(server.url)
      const { context, scope, service } = yield* buildOwn(RedisBackend.layer({ client }))
      const lock = yield* Lock.make("closed:borrowed").pipe(Effect.provide(context))
      yield* Effect.scoped(Lock.acquire(lock))
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(yield* Effect.promise(() => client.ping()), "PONG", "the borrowed client is still open")

      const withLock = failureOf(yield* Effect.exit(Lock.withLock(Effect.succeed("ran"), lock)))
      assertClosed(server.port, "layer({ client }), withLock", "acquire", withLock)
      const tried = failureOf(yield* Effect.exit(Effect.scoped(Lock.tryAcquire(lock))))
      assertClosed(server.port, "layer({ client }), tryAcquire", "acquire", tried)
      yield* checkEveryOperation(server.port, "layer({ client })", service, "closed:borrowed:ops")
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it.scopedLive("layerFrom and layerConfig (own connections): a Lock made under it and every operation fail typed", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const layers = {
        layerFrom: RedisBackend.layerFrom(server.url),
        layerConfig: RedisBackend.layerConfig().pipe(
          Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map([["REDIS_URL", server.url]]))))
        )
      }
      for (const [what, layer] of Object.entries(layers)) {
        const { context, scope, service } = yield* buildOwn(layer)
        const lock = yield* Lock.make(`closed:${what}`).pipe(Effect.provide(context))
        yield* Effect.scoped(Lock.acquire(lock))
        yield* Scope.close(scope, Exit.void)
        const withLock = failureOf(yield* Effect.exit(Lock.withLock(Effect.succeed("ran"), lock)))
        assertClosed(server.port, `${what}, withLock`, "acquire", withLock)
        yield* checkEveryOperation(server.port, what, service, `closed:${what}:ops`)
      }
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  for (const kind of ["layer({ client })", "layerFrom"] as const) {
    it.scopedLive(`${kind}: waiters blocked in a subscription when the layer closes fail at once`, () =>
      Effect.gen(function*() {
        const server = yield* RedisServer.make()
        const client = yield* borrowed(server.url)
        const { context, scope } = yield* buildOwn(kind === "layerFrom" ? RedisBackend.layerFrom(server.url) : RedisBackend.layer({ client }))
        const raw = yield* rawClient(server.url)
        // another process holds the lock for longer than the test
        yield* Effect.promise(() => raw.hset("closed:blocked", "elsewhere:1", "1").then(() => raw.pexpire("closed:blocked", 60_000)))
        const lock = yield* Lock.make("closed:blocked").pipe(Effect.provide(context))
        const latch = yield* CountDownLatch.make("closed:latch").pipe(Effect.provide(context))
        yield* CountDownLatch.trySetCount(latch, 1)
        const lockWaiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
        const latchWaiter = yield* Effect.fork(CountDownLatch.await(latch))
        yield* Effect.sleep("300 millis")

        const closedAt = performance.now()
        const closing = yield* Effect.disconnect(Scope.close(scope, Exit.void)).pipe(Effect.timeout("3 seconds"), Effect.option)
        assert.isTrue(Option.isSome(closing), "closing the layer did not end within 3 s")
        const waiters: ReadonlyArray<readonly [string, Fiber.Fiber<unknown, unknown>, string]> = [
          ["lock waiter", lockWaiter, "acquire"],
          ["latch waiter", latchWaiter, "latchCount"]
        ]
        for (const [what, waiter, operation] of waiters) {
          const waited = yield* Fiber.await(waiter).pipe(Effect.timeout("3 seconds"), Effect.option)
          const took = performance.now() - closedAt
          const error = Option.isSome(waited) ? failureOf(waited.value) : "still waiting 3 s after the close"
          console.log(`[closed: ${kind}: blocked ${what}] after ${took.toFixed(0)} ms`)
          assertClosed(server.port, `${kind}: blocked ${what}`, operation, error)
          assert.isBelow(took, 1_000)
          yield* Fiber.interrupt(waiter)
        }
      }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))
  }
})
