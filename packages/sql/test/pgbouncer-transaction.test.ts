import { describe } from "@effect/vitest"
import * as Conformance from "@lockstep/testkit/Conformance"
import { backend, losingData } from "./fixtures/databases.js"
import { databaseThrough } from "./fixtures/pgbouncer.js"

// the whole conformance suite through PgBouncer in pool_mode = transaction, waiters woken by polling
const through = await databaseThrough("transaction", "PgBouncer transaction-mode conformance suite")
describe.runIf(through !== undefined)("SQL backend through PgBouncer (transaction mode, wakeUp: poll)", () => {
  if (through === undefined) return
  const options = { wakeUp: "poll" } as const
  Conformance.suite({
    name: "sql pg through PgBouncer, transaction mode, polling",
    layer: backend(through.pooled, options),
    clock: "live",
    dataLoss: losingData(through.pooled, options)
  })
})
