/**
 * The SQL backend, put together: its settings (settings.ts), its calls to the database
 * (calls.ts), its tables (tables.ts), its wake-ups (wakeups.ts, listen.ts) and its operations
 * (operations.ts, each a transaction of transact.ts), all under one `BackendKit.Lifecycle`.
 */
import { Effect } from "effect"
import type { Scope } from "effect"
import { makeLifecycle } from "@lockstep/core/BackendKit"
import type * as LockBackend from "@lockstep/core/LockBackend"
import type { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import type { SqlClient } from "@effect/sql/SqlClient"
import type { Options } from "../SqlBackend.js"
import * as Calls from "./calls.js"
import { driverMessage, ofClient } from "./endpoint.js"
import { listen } from "./listen.js"
import * as Operations from "./operations.js"
import { settingsOf, storageOf } from "./settings.js"
import * as Tables from "./tables.js"
import * as Transact from "./transact.js"
import * as Wakeups from "./wakeups.js"

/** `endpoint`: where the client connects, as errors name it; by default read from the client's configuration. */
export const make = (
  sql: SqlClient,
  options: Options | undefined,
  knownEndpoint?: string
): Effect.Effect<LockBackend.Service, BackendError | InvalidLockOptions, Scope.Scope> =>
  Effect.gen(function*() {
    const settings = yield* settingsOf(sql, options)
    const { dialect, notifies } = settings
    const endpoint = knownEndpoint ?? ofClient(sql, dialect.name)
    const clientId = crypto.randomUUID()
    // closed with the backend's scope: from then on every call says so, whatever the client
    // (borrowed, it may well still be open) would have answered
    const lifecycle = makeLifecycle({ backend: "SQL backend", endpoint, detailOf: driverMessage })
    const scope = yield* Effect.scope
    const calls = yield* Calls.make({ sql, dialect, lifecycle, endpoint, commandTimeout: settings.commandTimeout })
    const wakeups = Wakeups.make({ lifecycle, calls, dialect, notifies, pollInterval: settings.pollInterval, scope })

    if (dialect.name === "pg") yield* Calls.checkTransactions(calls)
    yield* Tables.prepare({ ...settings, sql, calls, endpoint, clientId }, settings.createSchema)
    const twoCalls = dialect.name !== "sqlite" && (yield* calls.bounded("connect", Calls.severalStatementsPerCall(sql)))
    yield* Tables.sweepEvery(calls, dialect, settings.sweepInterval)
    if (notifies) {
      yield* listen({ sql, listenUrl: settings.listenUrl, table: settings.table, clientId, endpoint, lifecycle, wake: wakeups.wake })
    }

    // added last, so run first when the scope closes: every waiter wakes to find the backend
    // closed, rather than waiting for a wake-up that nothing is left to send
    yield* lifecycle.closeWithScope

    const transact = Transact.make({ calls, wakeups, dialect, clientId, notifies, twoCalls, commandTimeout: settings.commandTimeout })
    return Operations.make({ clientId, lifecycle, transact, wakeups, renewBatchSize: settings.renewBatchSize })
  })

/** `SqlBackend.migrate`: the table, without a backend. */
export const migrate = (
  sql: SqlClient,
  options: Pick<Options, "schema" | "table"> | undefined
): Effect.Effect<void, BackendError | InvalidLockOptions> =>
  Effect.flatMap(storageOf(sql, options), ({ dialect }) => Tables.createSchema(sql, dialect, ofClient(sql, dialect.name)))
