/**
 * The checks the conformance suite runs (the model-based test, the history checker) fail a
 * backend that breaks mutual exclusion: the memory backend made to grant an exclusive lock twice.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, TestClock } from "effect"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import { FaultyBackend, History, ModelCheck } from "@lockstep/testkit"

describe("the conformance checks catch a backend that grants an exclusive lock twice", () => {
  it.effect("the model-based test fails", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(ModelCheck.run({ advance: (ms) => TestClock.adjust(ms), numRuns: 200 }))
      assert.strictEqual(error._tag, "ModelMismatch")
    }).pipe(Effect.provide(FaultyBackend.grantTwiceLayer(MemoryBackend.layer))))

  it.effect("the history checker reports the overlap of 60 contending fibers", () =>
    Effect.gen(function*() {
      const history = yield* History.make
      const backend = Layer.effect(LockBackend, Effect.map(LockBackend, (service) => History.instrument(history, service)))
        .pipe(Layer.provide(FaultyBackend.grantTwiceLayer(MemoryBackend.layer)))
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make("broken")
        yield* Effect.forEach(Array.from({ length: 60 }), () => Effect.yieldNow().pipe(Lock.withLock(lock)), {
          concurrency: "unbounded",
          discard: true
        })
      }).pipe(Effect.provide(backend))
      const violations = yield* history.check
      assert.isTrue(violations.some((v) => v._tag === "Overlap"), violations.map(History.formatViolation).join("\n"))
    }))
})
