import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, Fiber, Option, TestClock } from "effect"
import type { AcquireRequest, ReleaseRequest, Service } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import * as FaultyBackend from "@lockstep/testkit/FaultyBackend"

const exclusive = (holder: string, count = 1): AcquireRequest => ({
  key: "k",
  holder,
  mode: "exclusive",
  permits: 1,
  limit: 1,
  leaseMs: 1_000,
  fair: false,
  waiterTtlMs: 100,
  count
})

const release = (holder: string, count = 1): ReleaseRequest => ({ key: "k", holder, mode: "exclusive", count, leaseMs: 1_000 })

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
        yield* backend.acquire(exclusive("a", 2))
        assert.strictEqual(yield* backend.release(release("a", 2)), 1)
        assert.strictEqual(yield* backend.release(release("z")), 0)
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
      const released = yield* Effect.either(backend.release(release("a")))
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

  it.effect("duplicating runs a call twice; the caller sees the second run's reply", () =>
    Effect.gen(function*() {
      const real = yield* MemoryBackend.make
      const calls: Array<string> = []
      const counting: Service = { ...real, release: (r) => Effect.zipRight(Effect.sync(() => calls.push(r.holder)), real.release(r)) }
      const backend = FaultyBackend.duplicating({ operation: "release", when: 1 })(counting)
      yield* backend.acquire(exclusive("a"))
      yield* backend.acquire(exclusive("a", 2))
      // the copy of a release from 2 finds the count at 1 already: it changes nothing
      assert.strictEqual(yield* backend.release(release("a", 2)), 1)
      assert.deepStrictEqual(calls, ["a", "a"])
      assert.strictEqual((yield* real.inspect("k")).holders[0]?.exclusive, 1)
    }))

  it.effect("duplicating with copyAfter delivers a late copy in the background", () =>
    Effect.gen(function*() {
      const real = yield* MemoryBackend.make
      // what the real backend answered to each delivery of an acquisition
      const answers: Array<string> = []
      const recording: Service = {
        ...real,
        acquire: (r) =>
          real.acquire(r).pipe(
            Effect.tapBoth({
              onFailure: (e) => Effect.sync(() => answers.push(e._tag)),
              onSuccess: (a) => Effect.sync(() => answers.push(a._tag))
            })
          )
      }
      const backend = FaultyBackend.duplicating({ operation: "acquire", when: 1, copyAfter: "100 millis" })(recording)
      // the caller gets the original's reply at once
      assert.strictEqual((yield* backend.acquire(exclusive("a")))._tag, "Granted")
      yield* backend.release(release("a"))
      assert.deepStrictEqual(answers, ["Granted"])
      yield* TestClock.adjust("99 millis")
      yield* Effect.yieldNow()
      assert.deepStrictEqual(answers, ["Granted"])
      yield* TestClock.adjust("1 millis")
      yield* Effect.yieldNow()
      // the late copy of a's acquisition came after a ended: refused, it granted nothing
      assert.deepStrictEqual(answers, ["Granted", "NotHeld"])
      assert.deepStrictEqual((yield* real.inspect("k")).holders, [])
    }))

  it.effect("slow delays chosen calls on the clock", () =>
    Effect.gen(function*() {
      const backend = FaultyBackend.slow({ operation: "acquire", delay: "1 second" })(yield* MemoryBackend.make)
      const fiber = yield* Effect.fork(backend.acquire(exclusive("a")))
      yield* TestClock.adjust("999 millis")
      assert.isTrue(Option.isNone(yield* Fiber.poll(fiber)))
      yield* TestClock.adjust("1 millis")
      assert.strictEqual((yield* Fiber.join(fiber))._tag, "Granted")
    }))

  it.effect("losingData: wipe replaces the backend by an empty one, keeping the clientId", () =>
    Effect.gen(function*() {
      const backend = yield* LockBackend
      const control = yield* FaultyBackend.DataLoss
      const clientId = backend.clientId
      yield* backend.acquire(exclusive("a"))
      yield* control.wipe
      assert.strictEqual(backend.clientId, clientId)
      assert.deepStrictEqual((yield* backend.inspect("k")).holders, [])
      assert.strictEqual((yield* backend.acquire(exclusive("b")))._tag, "Granted")
    }).pipe(Effect.provide(FaultyBackend.losingData(MemoryBackend.layer))))
})
