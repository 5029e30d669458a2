import { assert, describe, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import type { AcquireRequest, Service } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import * as FaultyBackend from "@lockstep/testkit/FaultyBackend"

const exclusive = (holder: string): AcquireRequest => ({
  key: "k",
  holder,
  mode: "exclusive",
  permits: 1,
  limit: 1,
  leaseMs: 1_000,
  fair: false,
  waiterTtlMs: 100
})

const withBackend = <A, E>(f: (backend: Service) => Effect.Effect<A, E>) => Effect.flatMap(LockBackend, f)

describe("FaultyBackend", () => {
  it.effect("grantTwice reports a denied exclusive acquisition as a fresh grant", () =>
    withBackend((backend) =>
      Effect.gen(function*() {
        const first = yield* backend.acquire(exclusive("a"))
        const second = yield* backend.acquire(exclusive("b"))
        assert.deepStrictEqual(first, { _tag: "Granted", fence: 1, count: 1 })
        assert.deepStrictEqual(second, { _tag: "Granted", fence: 2, count: 1 })
        // the real backend still only knows a
        const state = yield* backend.inspect("k")
        assert.deepStrictEqual(state.holders.map((h) => h.holder), ["a"])
      })
    ).pipe(Effect.provide(FaultyBackend.grantTwiceLayer(MemoryBackend.layer))))

  it.effect("grantTwice as a Service function leaves shared denials alone", () =>
    Effect.gen(function*() {
      const backend = FaultyBackend.grantTwice(yield* MemoryBackend.make)
      yield* backend.acquire(exclusive("a"))
      const reader = yield* backend.acquire({ ...exclusive("b"), mode: "shared", limit: Infinity })
      assert.strictEqual(reader._tag, "Denied")
    }))

  it.effect("ignoreRelease reports success but keeps the hold", () =>
    withBackend((backend) =>
      Effect.gen(function*() {
        yield* backend.acquire(exclusive("a"))
        yield* backend.acquire(exclusive("a"))
        assert.strictEqual(yield* backend.release({ key: "k", holder: "a", mode: "exclusive" }), 1)
        assert.strictEqual(yield* backend.release({ key: "k", holder: "z", mode: "exclusive" }), 0)
        const state = yield* backend.inspect("k")
        assert.strictEqual(state.holders[0]?.exclusive, 2)
      })
    ).pipe(Effect.provide(FaultyBackend.ignoreReleaseLayer(MemoryBackend.layer))))

  it.effect("failing (before) fails chosen calls with BackendError without reaching the backend", () =>
    Effect.gen(function*() {
      const real = yield* MemoryBackend.make
      const backend = FaultyBackend.failing({ operation: "acquire", when: (call) => call % 2 === 1 })(real)
      const first = yield* Effect.either(backend.acquire(exclusive("a")))
      assert.isTrue(Either.isLeft(first) && first.left._tag === "BackendError" && first.left.operation === "acquire")
      assert.deepStrictEqual((yield* real.inspect("k")).holders, [])
      const second = yield* backend.acquire(exclusive("a"))
      assert.strictEqual(second._tag, "Granted")
      // other operations are untouched
      assert.strictEqual((yield* backend.inspect("k")).holders.length, 1)
    }))

  it.effect("failing (after) carries the call out and loses the reply", () =>
    Effect.gen(function*() {
      const real = yield* MemoryBackend.make
      const backend = FaultyBackend.failing({ operation: ["acquire", "release"], when: 1, timing: "after" })(real)
      const acquired = yield* Effect.either(backend.acquire(exclusive("a")))
      assert.isTrue(Either.isLeft(acquired))
      assert.deepStrictEqual((yield* real.inspect("k")).holders.map((h) => h.holder), ["a"])
      const released = yield* Effect.either(backend.release({ key: "k", holder: "a", mode: "exclusive" }))
      assert.isTrue(Either.isLeft(released))
      assert.deepStrictEqual((yield* real.inspect("k")).holders, [])
    }))

  it.effect("failing with probability 0 never fails", () =>
    Effect.gen(function*() {
      const backend = FaultyBackend.failing({ operation: "renew", when: 0 })(yield* MemoryBackend.make)
      const results = yield* Effect.forEach(Array.from({ length: 20 }), () => backend.renew([]))
      assert.strictEqual(results.length, 20)
    }))

  it.effect("failingLayer counts calls per layer build", () =>
    withBackend((backend) =>
      Effect.gen(function*() {
        const outcomes = yield* Effect.forEach([1, 2, 3], () => Effect.either(backend.inspect("k")))
        assert.deepStrictEqual(outcomes.map((o) => o._tag), ["Right", "Right", "Left"])
      })
    ).pipe(Effect.provide(FaultyBackend.failingLayer({ operation: "inspect", when: (call) => call === 3 })(MemoryBackend.layer))))
})
