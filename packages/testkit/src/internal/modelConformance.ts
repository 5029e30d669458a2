import { Effect, TestClock } from "effect"
import * as FaultyBackend from "../FaultyBackend.js"
import * as ModelCheck from "../ModelCheck.js"
import type { Kit } from "./conformanceKit.js"
import { everyOperation } from "./conformanceKit.js"

// The backend against the reference model, by model-based runs; once with every request
// delivered twice.

/** One queue for fair and non-fair waiters: a key is used either fairly or not. */
const fairnessOf = (harness: Kit["harness"]) => (harness.order === "fifo" ? "byKey" as const : "any" as const)

export const referenceModel = ({ harness, live, everyKind, withBackend }: Kit): void => {
  if (!live) {
    everyKind(`the backend follows the reference model (${harness.modelRuns ?? 200} model-based runs)`, () =>
      withBackend(ModelCheck.run({ advance: (ms) => TestClock.adjust(ms), numRuns: harness.modelRuns ?? 200, fairness: fairnessOf(harness) })), 120_000)
  } else {
    // Live: the backend keeps its own time, so no time is advanced, leases are long (60 s+) and
    // durations are compared within a tolerance. 200 runs of up to 40 commands take a few seconds
    // on a local redis-server.
    const runs = harness.modelRuns ?? 200
    const maxCommands = 40
    const toleranceMs = 1_000
    everyKind(
      `the backend follows the reference model (${runs} model-based runs of up to ${maxCommands} commands, live timing ±${toleranceMs} ms)`,
      () => withBackend(ModelCheck.run({ timing: { toleranceMs }, numRuns: runs, maxCommands, fairness: fairnessOf(harness) })),
      120_000
    )
  }
}

export const duplicatedDelivery = ({ harness, live, everyKind }: Kit): void =>
  everyKind("the backend follows the reference model with every request delivered twice", () => {
    const twice = FaultyBackend.duplicatingLayer({ operation: everyOperation, when: 1 })(harness.layer)
    const runs = Math.max(20, Math.floor((harness.modelRuns ?? 200) / 4))
    return Effect.provide(
      live
        ? ModelCheck.run({ timing: { toleranceMs: 1_000 }, numRuns: runs, maxCommands: 40, fairness: fairnessOf(harness) })
        : ModelCheck.run({ advance: (ms) => TestClock.adjust(ms), numRuns: runs, fairness: fairnessOf(harness) }),
      twice
    )
  }, 120_000)
