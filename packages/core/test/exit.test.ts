import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { runChild } from "./fixtures/exitScenarios.js"

const fixture = fileURLToPath(new URL("./fixtures/lockThenExit.ts", import.meta.url))

/** Long enough for sockets to close and the process to end on a busy machine, far below any timer of lockstep's. */
const settleBoundMs = 300
// the exit of a whole process on a loaded 2-core machine took up to ~460 ms; the bound stays below
// the shortest timer this must catch when one is left (an idle channel's unsubscribe, 1 s)
const exitBoundMs = 800

describe("process exit", () => {
  it.live("every lock path leaves nothing that keeps the process alive once its backend closed", () =>
    Effect.gen(function*() {
      const { exitedAfterMs, reports, stdout } = yield* runChild(fixture)
      assert.isAtLeast(reports.length, 8, stdout)
      for (const report of reports) {
        assert.isUndefined(report.error, `${report.name}: ${report.error}`)
        assert.deepStrictEqual(report.left, [], `${report.name}: still alive after ${report.settledMs} ms`)
        assert.isBelow(report.settledMs, settleBoundMs, report.name)
      }
      // the default watchdog (30 s) plans a renewal 10 s after a grant: the keeper must not wait for it
      assert.isBelow(exitedAfterMs, exitBoundMs, `exited ${exitedAfterMs} ms after the program ended`)
    }), 40_000)
})
