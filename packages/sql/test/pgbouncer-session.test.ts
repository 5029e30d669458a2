import { describe } from "@effect/vitest"
import * as Conformance from "@lockstep/testkit/Conformance"
import { backend, losingData } from "./fixtures/databases.js"
import { databaseThrough } from "./fixtures/pgbouncer.js"

// the whole conformance suite through PgBouncer in pool_mode = session, with the default wake-up
// (LISTEN on the client's own connection, which keeps its server in this mode)
const through = await databaseThrough("session", "PgBouncer session-mode conformance suite")
describe.runIf(through !== undefined)("SQL backend through PgBouncer (session mode)", () => {
  if (through === undefined) return
  Conformance.suite({
    name: "sql pg through PgBouncer, session mode",
    layer: backend(through.pooled),
    clock: "live",
    dataLoss: losingData(through.pooled)
  })
})
