/**
 * The public constructors of the memory backend, and what its close does.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { LockBackend } from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"
import { MemoryBackend } from "@lockstep/memory"
import * as Conformance from "@lockstep/testkit/Conformance"
import { unsafeMake } from "../src/internal/memoryBackend.js"
import { awaitFork, granted, isDone, KEY, nothingStored, request } from "./fixtures/memoryBackend.js"

describe("MemoryBackend", () => {
  describe("constructors", () => {
    it.effect("make gives independent backends with UUID client ids", () =>
      Effect.gen(function* () {
        const a = yield* MemoryBackend.make
        const b = yield* MemoryBackend.make
        assert.match(a.clientId, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
        assert.notStrictEqual(a.clientId, b.clientId)
        granted(yield* a.acquire(request("a:1")))
        // b shares no state with a
        granted(yield* b.acquire(request("b:1")))
      }))

    it.effect("layer provides LockBackend", () =>
      Effect.gen(function* () {
        const backend = yield* LockBackend
        granted(yield* backend.acquire(request("a:1")))
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual(state.holders.map((h) => h.holder), ["a:1"])
      }).pipe(Effect.provide(Layer.fresh(MemoryBackend.layer))))
  })

  describe("close", () => {
    it.effect("drops the state, lets lock and latch waiters go, and every later call fails as closed, named by its own operation", () =>
      Effect.gen(function* () {
        const { close, service, sizes } = unsafeMake("test-client")
        granted(yield* service.acquire(request("a:1")))
        const lockWaiter = yield* awaitFork(yield* service.subscribe(KEY, "b:1", "exclusive"))
        yield* service.latchSetCount({ key: "latch", id: "set", count: 1 })
        const latchWaiter = yield* awaitFork(yield* service.latchSubscribe("latch", "c:1"))
        assert.deepStrictEqual([yield* isDone(lockWaiter), yield* isDone(latchWaiter)], [false, false])

        close()
        assert.deepStrictEqual([yield* isDone(lockWaiter), yield* isDone(latchWaiter)], [true, true])
        assert.deepStrictEqual(sizes(), nothingStored)
        // latchSubscribe too: it once failed as `subscribe`
        for (const { error, operation } of yield* Conformance.callEveryOperation(service, KEY)) {
          assert.isTrue(error instanceof LockError.BackendError && LockError.isBackendClosed(error), `${operation}: ${String(error)}`)
          assert.strictEqual((error as LockError.BackendError).operation, operation)
        }
      }).pipe(Effect.scoped))
  })
})
