/**
 * Every call the backend makes to its database: on a connection of the client's pool, bounded by
 * the command timeout, and (for the operations) in a transaction run again where the database
 * says it may simply be retried. Also what the backend asks of the connection as it starts: that
 * it runs transactions, and whether it takes several statements in one call.
 */
import { Cause, Duration, Effect, Exit, Fiber, FiberId, Schedule, Scope } from "effect"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import { BackendError } from "@lockstep/core/LockError"
import type { SqlClient } from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import type * as Dialect from "./dialect.js"
import { driverMessage } from "./endpoint.js"
import { asNumber, type Rows } from "./rows.js"

export interface Calls {
  /**
   * `effect` bounded by the command timeout, its failure a `BackendError` naming the endpoint (or
   * the closed-backend error, once the backend closed).
   */
  readonly bounded: <A>(operation: string, effect: Effect.Effect<A, unknown>) => Effect.Effect<A, BackendError>
  /** A statement outside any transaction, bounded like every call. */
  readonly run: (operation: string, statement: Dialect.Statement) => Effect.Effect<Rows, BackendError>
  /** BEGIN, with what the dialect sets for the transaction. */
  readonly begin: (connection: Connection) => Effect.Effect<unknown, unknown>
  /**
   * Runs `body` in a transaction on a connection of its own, bounded by the command timeout, and
   * runs it again after a failure the database says may simply be retried. `ownsEnds`: `body`
   * sends BEGIN and COMMIT itself, each with other statements in one call.
   */
  readonly inTransaction: <A>(
    operation: string,
    body: (connection: Connection) => Effect.Effect<A, unknown>,
    ownsEnds?: boolean
  ) => Effect.Effect<A, BackendError>
}

export const execute = (connection: Connection, statement: Dialect.Statement) =>
  connection.execute(statement.sql, statement.params, undefined) as Effect.Effect<Rows, unknown>

export const commit = (connection: Connection): Effect.Effect<unknown, unknown> =>
  connection.executeUnprepared("COMMIT", [], undefined)

const timedOut = "no answer within the command timeout"

/** Longer timeouts than a host timer takes never fire (as with `Effect.timeout`). */
const maxTimerMs = 2 ** 31 - 1

/** Between tries of a transaction the database refused for now: 2 ms, doubling up to 25 ms, jittered. */
const retrySchedule = Schedule.exponential(Duration.millis(2)).pipe(
  Schedule.union(Schedule.spaced(Duration.millis(25))),
  Schedule.jittered
)

/** What the calls are made with. */
export interface CallsContext {
  readonly sql: SqlClient
  readonly dialect: Dialect.Dialect
  /** Makes the calls' errors, and says whether the backend closed. */
  readonly lifecycle: Lifecycle
  readonly endpoint: string
  readonly commandTimeout: Duration.Duration
}

/** The calls of a backend on `sql` (reads SQLite's busy timeout first: see `begin`). */
export const make = ({ commandTimeout, dialect, endpoint, lifecycle, sql }: CallsContext): Effect.Effect<Calls, BackendError> =>
  Effect.gen(function*() {
    const commandTimeoutMs = Duration.toMillis(commandTimeout)
    const bounded = <A>(operation: string, effect: Effect.Effect<A, unknown>) => boundedCall(lifecycle, commandTimeoutMs, operation, effect)
    const run = (operation: string, statement: Dialect.Statement) =>
      bounded(operation, Effect.scoped(Effect.flatMap(Effect.flatMap(Effect.scope, reserveIn(sql)), (connection) => execute(connection, statement))))

    // better-sqlite3 waits for SQLite's write lock synchronously, blocking the event loop, and a
    // transaction of this same process that holds the lock could then never finish: the write
    // lock is taken without waiting, and the wait happens here, between tries
    const busyTimeout = dialect.name === "sqlite" ? yield* sqliteBusyTimeout(sql, endpoint) : undefined
    const begin = (connection: Connection): Effect.Effect<unknown, unknown> => {
      const start = connection.executeUnprepared(dialect.begin(commandTimeoutMs).join("; "), [], undefined)
      if (busyTimeout === undefined) return start
      const setBusyTimeout = (ms: number) => connection.executeUnprepared(`PRAGMA busy_timeout = ${ms}`, [], undefined)
      return Effect.zipRight(setBusyTimeout(0), start).pipe(Effect.ensuring(Effect.ignore(setBusyTimeout(busyTimeout))))
    }

    const inTransaction = <A>(
      operation: string,
      body: (connection: Connection) => Effect.Effect<A, unknown>,
      ownsEnds = false
    ): Effect.Effect<A, BackendError> =>
      bounded(
        operation,
        Effect.retry(
          attempt(sql, ownsEnds ? body : (connection) => withEnds(begin, connection, body)),
          { schedule: retrySchedule, while: (cause) => dialect.retryable(cause) }
        )
      )

    return { bounded, run, begin, inTransaction }
  })

/**
 * `effect` bounded by the command timeout, in a fiber of its own: the timeout stops it even
 * where the caller cannot be interrupted (an acquisition in flight ends with an answer or a
 * `BackendError`, never cut off after its commit), and a caller that can be interrupted stops
 * it too. One fiber and one timer per call: the timer interrupts the fiber, and the caller
 * reads its exit without taking on its fiber refs (nothing in them is the caller's concern,
 * and merging them back costs more than the call's own work). The timer is the host's: the
 * server answers in real time, whatever clock the caller's effects run on.
 */
const boundedCall = <A>(
  lifecycle: Lifecycle,
  commandTimeoutMs: number,
  operation: string,
  effect: Effect.Effect<A, unknown>
): Effect.Effect<A, BackendError> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(
      // a daemon: a child fiber would be interrupted with the caller, also where it cannot be
      Effect.forkDaemon(Effect.interruptible(effect)),
      (fiber) => {
        let late = false
        const timer = Number.isFinite(commandTimeoutMs) && commandTimeoutMs < maxTimerMs
          ? setTimeout(() => {
            late = true
            fiber.unsafeInterruptAsFork(FiberId.none)
          }, commandTimeoutMs)
          : undefined
        return restore(Fiber.await(fiber)).pipe(
          Effect.onInterrupt(() => Fiber.interrupt(fiber)),
          Effect.ensuring(Effect.sync(() => clearTimeout(timer))),
          // an answer that arrived as the timer fired is still the answer
          Effect.flatMap((exit) => late && Exit.isFailure(exit) && Cause.isInterrupted(exit.cause) ? Effect.fail(timedOut) : exit)
        )
      }
    )
  ).pipe(
    Effect.mapError(lifecycle.failure(operation)),
    // a client closed under a call still under way may throw (better-sqlite3 does)
    Effect.catchAllDefect((defect) => (lifecycle.isClosed() ? Effect.fail(lifecycle.closedError(operation)) : Effect.die(defect)))
  )

/**
 * A connection from the pool, given back when `scope` closes. The drivers cannot withdraw a
 * request from their pool (a connection that arrives for an interrupted request would never go
 * back): the request runs to its end in a fiber of its own while the caller may stop waiting,
 * and a connection that arrives after `scope` closed goes back at once.
 */
const reserveIn = (sql: SqlClient) => (scope: Scope.Scope): Effect.Effect<Connection, unknown> =>
  Effect.flatMap(Effect.forkDaemon(Effect.uninterruptible(Scope.extend(sql.reserve, scope))), (fiber) => Effect.flatten(Fiber.await(fiber)))

/** `body` between BEGIN and COMMIT. */
const withEnds = <A>(
  begin: (connection: Connection) => Effect.Effect<unknown, unknown>,
  connection: Connection,
  body: (connection: Connection) => Effect.Effect<A, unknown>
): Effect.Effect<A, unknown> =>
  Effect.gen(function*() {
    yield* begin(connection)
    const result = yield* body(connection)
    yield* commit(connection)
    return result
  })

/**
 * One try of a transaction (`body` sends its BEGIN and COMMIT) on a connection of its own. On a
 * failure the connection is rolled back in the background: a call that timed out returns at
 * once, and the connection goes back to the pool only after the rollback, which waits for a
 * statement still running.
 */
const attempt = <A>(sql: SqlClient, body: (connection: Connection) => Effect.Effect<A, unknown>): Effect.Effect<A, unknown> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const txScope = yield* Scope.make()
      const connection = yield* restore(reserveIn(sql)(txScope)).pipe(
        Effect.onError(() => Scope.close(txScope, Exit.void))
      )
      const outcome = yield* Effect.exit(restore(body(connection)))
      if (Exit.isSuccess(outcome)) {
        yield* Scope.close(txScope, Exit.void)
        return outcome.value
      }
      yield* Effect.forkDaemon(
        connection.executeUnprepared("ROLLBACK", [], undefined).pipe(
          Effect.ignore,
          Effect.ensuring(Scope.close(txScope, Exit.void))
        )
      )
      return yield* outcome
    })
  )

/** The SQLite connection's own busy timeout, to put back after each transaction has begun. */
const sqliteBusyTimeout = (sql: SqlClient, endpoint: string): Effect.Effect<number, BackendError> =>
  Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.executeUnprepared("PRAGMA busy_timeout", [], undefined))).pipe(
    Effect.map((rows) => {
      const row = (rows as Rows)[0] ?? {}
      return asNumber(row["timeout"] ?? 0)
    }),
    Effect.mapError((cause) => new BackendError({ operation: "connect", cause, endpoint, detail: driverMessage(cause) }))
  )

/**
 * Whether the client sends several statements in one call and answers with the rows of each:
 * `@effect/sql-pg` does (a simple query), `@effect/sql-mysql2` does (its pools allow multiple
 * statements). A client that does not gets its transactions statement by statement.
 */
export const severalStatementsPerCall = (sql: SqlClient): Effect.Effect<boolean> =>
  Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.executeUnprepared("SELECT 1 AS one; SELECT 2 AS two", [], undefined))).pipe(
    Effect.map((results: unknown) => {
      if (!Array.isArray(results) || results.length !== 2) return false
      const [first, second] = results as ReadonlyArray<unknown>
      return Array.isArray(first) && Array.isArray(second) && asNumber((second[0] as Record<string, unknown> | undefined)?.["two"]) === 2
    }),
    Effect.orElseSucceed(() => false)
  )

/**
 * Every operation is a transaction: a pooler that runs none (PgBouncer's `pool_mode = statement`)
 * fails the layer here, saying what to use, rather than every lock later.
 */
export const checkTransactions = (calls: Calls): Effect.Effect<void, BackendError> =>
  calls.inTransaction("connect", () => Effect.void).pipe(Effect.mapError(statementPooling))

/** PgBouncer's refusal of a transaction in `pool_mode = statement`, with what to use instead. */
const statementPooling = (error: BackendError): BackendError =>
  /statement pooling mode/i.test(error.detail ?? "")
    ? new BackendError({
      operation: error.operation,
      cause: error.cause,
      endpoint: error.endpoint,
      detail: `${error.detail} (every lock operation is a transaction: connect through PgBouncer in pool_mode = transaction, ` +
        "with the SQL backend's wakeUp option set, or in pool_mode = session)"
    })
    : error
