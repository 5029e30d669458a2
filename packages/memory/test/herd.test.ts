/**
 * A release wakes only waiters that can win: 100 fibers on one key cost at most 3 acquire calls
 * per grant, whatever the kind (see fixtures/herd.ts).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { MemoryBackend } from "@lockstep/memory"
import { callsPerGrantBudget, contend, kinds } from "./fixtures/herd.js"

describe("memory backend: wake-ups without a herd", () => {
  for (const kind of kinds) {
    it.live(`${kind}: 100 contenders, at most ${callsPerGrantBudget} acquire calls per grant`, () =>
      Effect.gen(function*() {
        const backend = yield* MemoryBackend.make
        const { acquires, grants, perGrant } = yield* contend(backend, kind, "herd")
        console.log(`[herd] memory ${kind}: ${acquires} acquire calls for ${grants} grants (${perGrant.toFixed(2)} per grant)`)
        assert.strictEqual(grants, 100)
        assert.isAtMost(perGrant, callsPerGrantBudget)
      }))
  }
})
