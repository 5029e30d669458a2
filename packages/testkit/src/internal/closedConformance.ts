/**
 * What every backend does once the layer (or scope) that made it has ended: every call fails with
 * the closed-backend `BackendError`, and a waiter blocked in a subscription at the close fails
 * at once with it rather than waiting for a wake-up nothing is left to send.
 */
import { assert } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Option, Scope } from "effect"
import * as Lock from "@lockstep/core/Lock"
import type { Service } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import { BackendError, isBackendClosed } from "@lockstep/core/LockError"
import type { ClosedCall } from "../Conformance.js"
import type { Kit } from "./conformanceKit.js"
import { counting } from "./conformanceKit.js"

/** Every operation of `service`, each called once (bounded by 5 s), with the error it failed with. */
export const callEveryOperation = (service: Service, key: string, latches = true): Effect.Effect<ReadonlyArray<ClosedCall>> => {
  const holder = `${service.clientId}:1`
  const latch = `${key}:latch`
  const calls: Array<readonly [string, Effect.Effect<unknown, unknown>]> = [
    ["acquire", service.acquire({ key, holder, mode: "exclusive", permits: 1, limit: 1, leaseMs: 5_000, fair: false, waiterTtlMs: 1_000, count: 1 })],
    ["release", service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 5_000 })],
    ["renew", service.renew([{ key, holder, leaseMs: 5_000 }])],
    ["inspect", service.inspect(key)],
    ["raiseFence", service.raiseFence({ key, fence: 1, leaseMs: 5_000 })],
    ["forceRelease", service.forceRelease({ key, id: crypto.randomUUID() })],
    ["cancel", service.cancel({ key, holder, leaseMs: 5_000 })],
    ["subscribe", Effect.scoped(service.subscribe(key, holder, "exclusive"))]
  ]
  if (latches) {
    calls.push(
      ["latchSetCount", service.latchSetCount({ key: latch, id: crypto.randomUUID(), count: 2 })],
    ["latchCountDown", service.latchCountDown({ key: latch, id: crypto.randomUUID() })],
    ["latchCount", service.latchCount(latch)],
      ["latchSubscribe", Effect.scoped(service.latchSubscribe(latch, holder))]
    )
  }
  return Effect.forEach(calls, ([operation, call]) =>
    Effect.map(Effect.exit(Effect.timeoutFail(call, { duration: "5 seconds", onTimeout: () => "no answer within 5 s" })), (exit) => ({
      operation,
      error: Exit.match(exit, {
        onSuccess: (value) => `succeeded with ${JSON.stringify(value)}`,
        onFailure: (cause) => (cause._tag === "Fail" ? cause.error : `ended with ${cause._tag}`)
      })
    })))
}

/** Fails unless `error` is the closed-backend error of `operation`. */
export const assertClosedError = (operation: string, error: unknown): void => {
  const message = error instanceof BackendError ? error.message : String(error instanceof Error ? error.message : error)
  assert.isTrue(error instanceof BackendError && isBackendClosed(error), `${operation} after the close: ${message}`)
  assert.strictEqual((error as BackendError).operation, operation, message)
}

export const closedBackend = ({ harness, test, freshKey, settle, live }: Kit): void =>
  test("a closed backend: every call fails with the closed-backend error, and a waiter blocked at the close fails at once", () =>
    Effect.gen(function*() {
      const counted = counting(harness.layer)
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(counted.layer, scope)
      const service = Context.get(context, LockBackend)
      const key = yield* freshKey("closed")
      const lock = yield* Lock.make(key).pipe(Effect.provide(context))

      const holding = yield* Deferred.make<void>()
      const holder = yield* Effect.fork(Lock.withLock(Effect.zipRight(Deferred.succeed(holding, undefined), Effect.never), lock))
      yield* Deferred.await(holding)
      const subscribed = counted.calls("subscribe")
      const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
      while (counted.calls("subscribe") === subscribed) yield* settle
      yield* settle

      const closedAt = performance.now()
      yield* Effect.disconnect(Scope.close(scope, Exit.void)).pipe(Effect.timeoutFail({
        duration: "5 seconds",
        onTimeout: () => new Error("closing the backend's scope did not end within 5 s")
      }))
      const waited = yield* Fiber.await(waiter).pipe(Effect.timeout("3 seconds"), Effect.option)
      assert.isTrue(Option.isSome(waited), "the blocked waiter was still waiting 3 s after the close")
      const exit = Option.getOrThrow(waited)
      assert.isTrue(Exit.isFailure(exit) && exit.cause._tag === "Fail", `the blocked waiter ended with ${String(exit)}`)
      if (Exit.isFailure(exit) && exit.cause._tag === "Fail") assertClosedError("acquire", exit.cause.error)
      if (live) assert.isBelow(performance.now() - closedAt, 2_000, "the blocked waiter took more than 2 s to fail")

      for (const { error, operation } of yield* callEveryOperation(service, `${key}:ops`, harness.kinds !== "exclusive")) assertClosedError(operation, error)
      const tried = yield* Effect.flip(Effect.scoped(Lock.tryAcquire(lock)))
      assertClosedError("acquire", tried)
      yield* Fiber.interrupt(holder)
    }))
