import { describe } from "@effect/vitest"
import { Redacted } from "effect"
import * as Conformance from "@lockstep/testkit/Conformance"
import type { SqlBackend } from "@lockstep/sql"
import { backend, losingData } from "./fixtures/databases.js"
import { databaseThrough } from "./fixtures/pgbouncer.js"

// the whole conformance suite through PgBouncer in pool_mode = transaction, waiters woken by
// LISTEN on a direct connection to PostgreSQL (and never by polling: 1 hour)
const through = await databaseThrough("transaction", "PgBouncer transaction-mode listenUrl conformance suite")
describe.runIf(through !== undefined)("SQL backend through PgBouncer (transaction mode, wakeUp: { listenUrl })", () => {
  if (through === undefined) return
  const options: SqlBackend.Options = { wakeUp: { listenUrl: Redacted.make(through.direct.url) }, pollInterval: "1 hour" }
  Conformance.suite({
    name: "sql pg through PgBouncer, transaction mode, direct LISTEN",
    layer: backend(through.pooled, options),
    clock: "live",
    dataLoss: losingData(through.pooled, options)
  })
})
