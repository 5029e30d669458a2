/**
 * `lockstep run` on PostgreSQL (a database of this file's own): mutual exclusion between
 * processes with increasing fences, the conflict exit code, `status`, latches.
 */
import { describe } from "vitest"
import { buildBin, postgresDatabase, postgresRuns, runScenarios, tempDir } from "./fixtures/lockstep.js"

describe.runIf(await postgresRuns("lockstep run on PostgreSQL"))("lockstep run on PostgreSQL", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const url = postgresDatabase()

  runScenarios(bin, dir, url)
})
