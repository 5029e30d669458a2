import { describe } from "@effect/vitest"
import * as Conformance from "@lockstep/testkit/Conformance"
import { backend, database, type Kind, losingData } from "./fixtures/databases.js"

// every conformance scenario, the model-based runs and the fault wrappers, on real databases
for (const kind of ["pg", "mysql", "sqlite"] as const satisfies ReadonlyArray<Kind>) {
  const db = await database(kind)
  describe.runIf(db !== undefined)(`SQL backend on ${kind}`, () => {
    if (db === undefined) return
    Conformance.suite({ name: `sql ${kind}`, layer: backend(db), clock: "live", dataLoss: losingData(db) })
  })
}
