import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, TestClock } from "effect"
import { MemoryBackend } from "@lockstep/memory"
import * as FaultyBackend from "@lockstep/testkit/FaultyBackend"
import * as ModelCheck from "@lockstep/testkit/ModelCheck"
import * as ModelBackend from "./ModelBackend.js"

const C = ModelCheck.Command
const options = { advance: TestClock.adjust }

describe("ModelCheck", () => {
  describe("against the model itself", () => {
    it.effect("passes", () =>
      Effect.gen(function*() {
        yield* ModelCheck.run({ ...options, numRuns: 100 })
      }).pipe(Effect.provide(ModelBackend.layer)))

    it.effect("fails a backend that grants twice, with a shrunk counterexample in the message", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(ModelCheck.run({ ...options, numRuns: 200 }))
        assert.strictEqual(error._tag, "ModelMismatch")
        assert.strictEqual(error.what, "acquire result")
        assert.match(error.expected, /^Denied/)
        assert.match(error.actual, /^Granted/)
        // the smallest counterexample: someone holds the key exclusively, then another asks for it
        assert.isAtMost(error.commands.length, 3)
        assert.strictEqual(error.step, error.commands.length - 1)
        assert.include(error.message, "acquire result")
        assert.include(error.message, `seed ${error.seed}`)
        assert.include(error.message, "expected (model): Denied")
        for (const [i, command] of error.commands.entries()) {
          assert.include(error.message, `${i}. ${command._tag.toLowerCase()}`)
        }
        // the reported commands replay to the same failure
        const replay = yield* Effect.flip(ModelCheck.execute(error.commands, options))
        assert.strictEqual(replay.actual, error.actual)
      }).pipe(Effect.provide(FaultyBackend.grantTwiceLayer(ModelBackend.layer))))

    it.effect("is repeatable with a seed", () =>
      Effect.gen(function*() {
        const first = yield* Effect.flip(ModelCheck.run({ ...options, seed: 7 }))
        const second = yield* Effect.flip(ModelCheck.run({ ...options, seed: 7 }))
        assert.strictEqual(first.message, second.message)
      }).pipe(Effect.provide(FaultyBackend.ignoreReleaseLayer(ModelBackend.layer))))

    it.effect("reports injected backend errors as mismatches", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(ModelCheck.run({ ...options, numRuns: 50 }))
        assert.include(error.actual, "BackendError")
      }).pipe(Effect.provide(FaultyBackend.failingLayer({ operation: "renew", when: 0.5 })(ModelBackend.layer))))

    it.effect("execute compares every step, including inspected state", () =>
      Effect.gen(function*() {
        yield* ModelCheck.execute([
          C.Acquire({ key: 0, holder: 0, mode: "shared", permits: 2, limit: 3, leaseMs: 20, fair: false, waiterTtlMs: 10 }),
          C.Acquire({ key: 0, holder: 1, mode: "exclusive", permits: 1, limit: 1, leaseMs: 20, fair: true, waiterTtlMs: 10 }),
          C.Advance({ ms: 5 }),
          C.Renew({ leases: [{ key: 0, holder: 0, leaseMs: 50 }] }),
          C.Cancel({ key: 0, holder: 1 }),
          C.Release({ key: 0, holder: 0, mode: "shared" }),
          C.Inspect({ key: 0 }),
          C.ForceRelease({ key: 0 })
        ], options)
      }).pipe(Effect.provide(ModelBackend.layer)))
  })

  describe("against the memory backend", () => {
    it.effect("memory backend follows the model (200 runs)", () =>
      Effect.gen(function*() {
        const outcome = yield* Effect.either(ModelCheck.run({ ...options, numRuns: 200 }))
        // On failure, show the counterexample rather than just "Left".
        assert.isTrue(Either.isRight(outcome), Either.isLeft(outcome) ? outcome.left.message : "")
      }).pipe(Effect.provide(MemoryBackend.layer)))

    it.effect("a fair waiter at the head of the queue is granted once the key is free", () =>
      ModelCheck.execute([
        C.Acquire({ key: 0, holder: 1, mode: "exclusive", permits: 1, limit: 1, leaseMs: 20, fair: false, waiterTtlMs: 10 }),
        C.Acquire({ key: 0, holder: 0, mode: "exclusive", permits: 1, limit: 1, leaseMs: 10, fair: true, waiterTtlMs: 30 }),
        C.Release({ key: 0, holder: 1, mode: "exclusive" }),
        C.Acquire({ key: 0, holder: 0, mode: "exclusive", permits: 1, limit: 1, leaseMs: 10, fair: true, waiterTtlMs: 30 })
      ], options).pipe(Effect.provide(MemoryBackend.layer)))

    it.effect("fails the memory backend wrapped with grantTwice", () =>
      Effect.gen(function*() {
        const error = yield* Effect.flip(ModelCheck.run({ ...options, numRuns: 200 }))
        assert.strictEqual(error._tag, "ModelMismatch")
        assert.isAtMost(error.commands.length, 3)
      }).pipe(Effect.provide(FaultyBackend.grantTwiceLayer(MemoryBackend.layer))))
  })
})
