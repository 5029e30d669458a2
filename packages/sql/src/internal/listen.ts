/**
 * PostgreSQL's LISTEN: how a backend hears of other processes' commits (its own woke its waiters
 * at commit), on the client's own LISTEN connection or on one of its own to `wakeUp.listenUrl`.
 * The layer is ready only once a notification of its own has come back; a pooler that does not
 * pass notifications on (PgBouncer in transaction mode) fails it, saying what to use instead.
 */
import { Context, Deferred, Duration, Effect, Exit, Layer, Redacted, Schedule, Stream } from "effect"
import type { Scope } from "effect"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import { BackendError } from "@lockstep/core/LockError"
import type { SqlClient } from "@effect/sql/SqlClient"
import * as Dialect from "./dialect.js"
import { driverMessage, fromUrl, masked, ofClient } from "./endpoint.js"

/** What the LISTEN is set up with. */
export interface ListenContext {
  readonly sql: SqlClient
  /** `wakeUp.listenUrl`: LISTEN on a connection of its own to it, rather than on the client's. */
  readonly listenUrl: Redacted.Redacted | undefined
  readonly table: Dialect.Table
  /** Starts this backend's own notifications, which it does not act on. */
  readonly clientId: string
  readonly endpoint: string
  readonly lifecycle: Lifecycle
  /** Wakes the subscriptions to a payload another backend notified. */
  readonly wake: (payload: string) => void
}

/**
 * Wakes this backend's waiters on every other backend's notifications, for as long as the scope
 * lasts. Ready only once a notification of its own, sent through the client's pool, has come
 * back: a waiter subscribing after that never misses a release; where none comes back in time,
 * fails saying why.
 */
export const listen = (context: ListenContext): Effect.Effect<void, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const listener = context.listenUrl === undefined ? undefined : yield* listenClient(context.listenUrl, context.endpoint)
    yield* listenOn(context, listener)
  })

/** The client's LISTEN, where it has one (`@effect/sql-pg`). */
interface Listening {
  readonly listen: (channel: string) => Stream.Stream<string, unknown>
}

const canListen = (sql: SqlClient): sql is SqlClient & Listening =>
  "listen" in sql && typeof (sql as { readonly listen?: unknown }).listen === "function"

/** How long the layer waits for its own notification to come back before it calls LISTEN deaf. */
const listenCheck = Duration.seconds(5)

/**
 * Why no notification came back: the LISTEN connection failed, or (where it works) a pooler that
 * does not pass notifications on, or a `listenUrl` that does not reach the client's database.
 */
const unheard = (direct: string | undefined, lastError: unknown, within: Duration.Duration): string => {
  const wait = Duration.format(within)
  if (lastError !== undefined) return `the LISTEN connection${direct === undefined ? "" : ` to ${direct}`} failed: ${driverMessage(lastError)}`
  return direct === undefined
    ? `no notification came back to LISTEN within ${wait}: a connection pooler in transaction or statement mode ` +
      "(PgBouncer pool_mode = transaction) does not pass notifications on. Set the SQL backend's wakeUp option to " +
      "{ listenUrl } (a direct PostgreSQL URL for LISTEN) or to \"poll\", or use pool_mode = session"
    : `no notification came back to LISTEN on ${direct} (wakeUp.listenUrl) within ${wait}: it must reach the client's ` +
      "database, directly or through PgBouncer in pool_mode = session"
}

/**
 * The client of `wakeUp.listenUrl`: `@effect/sql-pg` on one connection, used only for LISTEN (its
 * start-up query's connection closes after a second idle). Errors name the URL's endpoint, never
 * its password.
 */
const listenClient = (url: Redacted.Redacted, endpoint: string): Effect.Effect<SqlClient & Listening, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const { endpoint: direct, password } = fromUrl("pg", Redacted.value(url))
    const fail = (cause: unknown, detail = driverMessage(cause)) =>
      new BackendError({
        operation: "listen",
        cause,
        endpoint,
        detail: masked(`cannot open the LISTEN connection (wakeUp.listenUrl) to ${direct}: ${detail}`, password)
      })
    const { PgClient } = yield* Effect.tryPromise({
      try: () => import("@effect/sql-pg"),
      catch: (cause) => fail(cause, "cannot load @effect/sql-pg: install it beside @lockstep/sql")
    })
    const context = yield* Layer.build(
      PgClient.layer({ url, maxConnections: 1, idleTimeout: Duration.seconds(1), applicationName: "lockstep listen" })
    ).pipe(Effect.mapError((error) => fail(error)))
    return Context.get(context, PgClient.PgClient)
  })

/** LISTEN on `listener` (`wakeUp.listenUrl`) or on the client's own LISTEN connection; see `listen`. */
const listenOn = (
  { clientId, lifecycle, sql, table, wake }: ListenContext,
  listener: (SqlClient & Listening) | undefined
): Effect.Effect<void, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const failure = lifecycle.failure("listen")
    const on = listener ?? sql
    if (!canListen(on)) return yield* failure("the PostgreSQL client has no LISTEN (use @effect/sql-pg)")
    const channel = Dialect.channelOf(table)
    const ready = yield* Deferred.make<void>()
    const own = `${clientId}|`
    let lastError: unknown = undefined
    yield* Effect.forkScoped(
      Stream.runForEach(on.listen(channel), (message) =>
        Effect.sync(() => {
          if (message === `${own}ready`) {
            Deferred.unsafeDone(ready, Exit.void)
            return
          }
          if (!message.startsWith(own)) wake(message.slice(message.indexOf("|") + 1))
        })).pipe(
          Effect.tapError((error) => Effect.sync(() => void (lastError = error))),
          Effect.retry(Schedule.spaced(Duration.seconds(1))),
          Effect.interruptible
        )
    )
    const ping = Effect.scoped(Effect.flatMap(sql.reserve, (connection) =>
      connection.execute("SELECT pg_notify($1, $2)", [channel, `${own}ready`], undefined)))
    const direct = listener === undefined ? undefined : ofClient(listener, "pg")
    // sent again every 250 ms: a LISTEN still being set up misses the first
    yield* Effect.raceFirst(Deferred.await(ready), Effect.repeat(ping, Schedule.spaced(Duration.millis(250)))).pipe(
      Effect.mapError(failure),
      Effect.timeoutFail({ duration: listenCheck, onTimeout: () => failure(new Error(unheard(direct, lastError, listenCheck))) })
    )
  })
