/**
 * Two OS processes contend on one lock through the SQL backend on each database (`contention.ts`):
 * the merged history must show mutual exclusion and increasing fences, and both must hold it.
 */
import { describe, it } from "@effect/vitest"
import { contendAcrossProcesses } from "../../testkit/test/fixtures/contention.js"
import { database } from "./fixtures/databases.js"

for (const kind of ["pg", "mysql", "sqlite"] as const) {
  const db = await database(kind)
  describe.runIf(db !== undefined)(`two processes contend on one lock on ${kind}`, () => {
    it.scopedLive("mutual exclusion and increasing fences across processes; both processes hold the lock", () =>
      contendAcrossProcesses(`${kind} processes`, kind === "sqlite" ? `sqlite:${db!.url}` : db!.url, `processes-${kind}`, 40), 60_000)
  })
}
