import { Cause, Context, Deferred, Duration, Effect, Either, Exit, Fiber, FiberId, Layer, Redacted, Schedule, Scope, Stream } from "effect"
import { constVoid } from "effect/Function"
import * as LockBackend from "@lockstep/core/LockBackend"
import { BackendError, backendClosed, InvalidLockOptions } from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import type { SqlClient } from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import * as Dialect from "./dialect.js"
import { decode, type Document, emptyDocument, encode, expiresAt } from "./document.js"
import type { Options } from "../SqlBackend.js"
import { describe, fromUrl, masked, ofClient } from "./endpoint.js"

/** The public options, imported (not copied) so that a new one cannot be silently ignored here. */
type Settings = Options

/** The ended holders of `key` an operation asks about (`ids`) and may add to (see `Rules`). */
interface Remembered {
  readonly key: string
  readonly ids: ReadonlyArray<string>
  /**
   * Acquire and release: the rules ask about `ids` only when this holder holds nothing on the key
   * (a late copy, or a re-entry into a hold that is gone); while it holds, they are not read.
   */
  readonly unlessHolding?: string
}

/** A row as a transaction found it. */
interface Loaded {
  readonly text: string
  readonly document: Document
  readonly version: number
}

const defaultTable = "lockstep_locks"

const asNumber = (value: unknown): number => (typeof value === "number" ? value : Number(value))

/** `name` as the driver returns it: MySQL's binary column arrives as a Buffer. */
const asName = (value: unknown): string =>
  typeof value === "string" ? value : value instanceof Uint8Array ? Buffer.from(value).toString("utf8") : String(value)

const lockPayload = (key: string) => `l:${key}`
const latchPayload = (key: string) => `c:${key}`

/** Whether the change from `before` to `after` may let a waiter of the lock in. */
const freesLock = (before: Rules.Key, after: Rules.Key): boolean => {
  for (const hold of before.holders) {
    const now = after.holders.find((h) => h.holder === hold.holder)
    if (now === undefined) return true
    if ((hold.exclusive > 0 && now.exclusive === 0) || (hold.shared > 0 && now.shared === 0)) return true
  }
  return before.queue[0]?.holder !== after.queue[0]?.holder && after.queue.length > 0
}

/** Whether a latch's waiters are to be woken: it reached 0, or was set anew. */
const wakesLatch = (before: Rules.Latch | undefined, after: Rules.Latch | undefined): boolean => {
  const was = before?.count ?? 0
  const is = after?.count ?? 0
  return (was > 0 && is === 0) || (was === 0 && is > 0)
}

/** A waiter's subscription: woken at once if a wake-up arrived since the last `await`. */
interface Waiter {
  pending: boolean
  readonly resumers: Set<() => void>
}

/** `endpoint`: where the client connects, as errors name it; by default read from the client's configuration. */
export const make = (
  sql: SqlClient,
  settings: Settings | undefined,
  knownEndpoint?: string
): Effect.Effect<LockBackend.Service, BackendError | InvalidLockOptions, Scope.Scope> =>
  Effect.gen(function*() {
    const { dialect, table } = yield* resolve(sql, settings)
    const name = dialect.name
    const endpoint = knownEndpoint ?? ofClient(sql, name)
    const clientId = crypto.randomUUID()
    const commandTimeout = Duration.decode(settings?.commandTimeout ?? Duration.seconds(5))
    const renewBatchSize = Math.max(1, settings?.renewBatchSize ?? 500)
    const pollInterval = Duration.decode(settings?.pollInterval ?? (name === "sqlite" ? Duration.millis(10) : Duration.millis(25)))
    const sweepInterval = Duration.decode(settings?.sweepInterval ?? Duration.minutes(1))
    const commandTimeoutMs = Duration.toMillis(commandTimeout)
    const wakeUp = settings?.wakeUp ?? "listen"
    if (typeof wakeUp === "object" && !/^postgres(ql)?:\/\//i.test(Redacted.value(wakeUp.listenUrl))) {
      return yield* new InvalidLockOptions({ field: "wakeUp", reason: "listenUrl must be a postgres:// or postgresql:// URL" })
    }
    if (typeof wakeUp === "object" && name !== "pg") {
      return yield* new InvalidLockOptions({
        field: "wakeUp",
        reason: "listenUrl is for PostgreSQL: MySQL and SQLite have no LISTEN, and their waiters poll"
      })
    }
    /** PostgreSQL with LISTEN: releases notify; elsewhere waiters read their rows' versions. */
    const notifies = name === "pg" && wakeUp !== "poll"

    // set when the backend's scope closes: from then on every call says so, whatever the client
    // (borrowed, it may well still be open) would have answered
    let closed = false
    const closedError = (operation: string) => backendClosed({ operation, backend: "SQL backend", endpoint })
    /** `effect`, unless the backend is closed. */
    const whileOpen = <A, E, R>(operation: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | BackendError, R> =>
      Effect.suspend((): Effect.Effect<A, E | BackendError, R> => (closed ? Effect.fail(closedError(operation)) : effect))

    // a call still under way when the backend closes fails as closed too: its connection may be gone
    const failure = (operation: string) => (cause: unknown) =>
      closed ? closedError(operation) : new BackendError({
        operation,
        cause,
        endpoint,
        detail: describe(cause)
      })

    const execute = (connection: Connection, statement: Dialect.Statement) =>
      connection.execute(statement.sql, statement.params, undefined) as Effect.Effect<
        ReadonlyArray<Record<string, unknown>>,
        unknown
      >

    /**
     * `effect` bounded by the command timeout, in a fiber of its own: the timeout stops it even
     * where the caller cannot be interrupted (an acquisition in flight ends with an answer or a
     * `BackendError`, never cut off after its commit), and a caller that can be interrupted stops
     * it too. One fiber and one timer per call: the timer interrupts the fiber, and the caller
     * reads its exit without taking on its fiber refs (nothing in them is the caller's concern,
     * and merging them back costs more than the call's own work). The timer is the host's: the
     * server answers in real time, whatever clock the caller's effects run on.
     */
    const bounded = <A>(operation: string, effect: Effect.Effect<A, unknown>): Effect.Effect<A, BackendError> =>
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
        Effect.mapError(failure(operation)),
        // a client closed under a call still under way may throw (better-sqlite3 does)
        Effect.catchAllDefect((defect) => (closed ? Effect.fail(closedError(operation)) : Effect.die(defect)))
      )

    /**
     * A connection from the pool, given back when `scope` closes. The drivers cannot withdraw a
     * request from their pool (a connection that arrives for an interrupted request would never go
     * back): the request runs to its end in a fiber of its own while the caller may stop waiting,
     * and a connection that arrives after `scope` closed goes back at once.
     */
    const reserveIn = (scope: Scope.Scope): Effect.Effect<Connection, unknown> =>
      Effect.flatMap(Effect.forkDaemon(Effect.uninterruptible(Scope.extend(sql.reserve, scope))), (fiber) => Effect.flatten(Fiber.await(fiber)))

    /** A statement outside any transaction, bounded like every call. */
    const run = (operation: string, statement: Dialect.Statement) =>
      bounded(operation, Effect.scoped(Effect.flatMap(Effect.flatMap(Effect.scope, reserveIn), (connection) => execute(connection, statement))))

    // ---- wake-ups ---------------------------------------------------------------------------
    const waiters = new Map<string, Set<Waiter>>()
    /** Versions of rows as this backend last saw them, for the poller (MySQL, SQLite). */
    const known = new Map<string, number>()
    let polling = false

    const signal = (payload: string): void => {
      const set = waiters.get(payload)
      if (set === undefined) return
      for (const waiter of set) {
        if (waiter.resumers.size === 0) {
          waiter.pending = true
          continue
        }
        const resumers = [...waiter.resumers]
        waiter.resumers.clear()
        for (const resume of resumers) resume()
      }
    }

    const isWatched = (key: string): boolean => !notifies && (waiters.has(lockPayload(key)) || waiters.has(latchPayload(key)))

    /** The keys someone here waits on. */
    const watched = (): Array<string> => {
      const names = new Set<string>()
      for (const payload of waiters.keys()) names.add(payload.slice(2))
      return [...names]
    }

    // Without LISTEN/NOTIFY (MySQL, SQLite, PostgreSQL with wakeUp: "poll"), other processes' changes are found by reading the versions of the
    // rows somebody here waits on: one query per interval for all of them, only while some wait.
    const poll: Effect.Effect<void> = Effect.gen(function*() {
      while (true) {
        yield* Effect.sleep(pollInterval)
        const names = watched()
        if (names.length === 0) {
          polling = false
          return
        }
        for (let i = 0; i < names.length; i += 500) {
          const chunk = names.slice(i, i + 500)
          const rows = yield* Effect.either(run("poll", dialect.versions(chunk)))
          if (Either.isLeft(rows)) continue
          const seen = new Map(rows.right.map((row) => [asName(row["name"]), asNumber(row["version"])]))
          for (const key of chunk) {
            const version = seen.get(key) ?? 0
            const before = known.get(key)
            known.set(key, version)
            if (before !== undefined && before !== version) {
              signal(lockPayload(key))
              signal(latchPayload(key))
            }
          }
        }
      }
    })
    const scope = yield* Effect.scope
    const startPolling = (): Effect.Effect<void> =>
      polling || notifies ? Effect.void : Effect.suspend(() => {
        polling = true
        // interruptible: forked from a subscription's acquisition, it would inherit its
        // uninterruptible region, and the closing scope would wait for every waiter to leave
        return Effect.asVoid(Effect.forkIn(Effect.interruptible(poll), scope))
      })

    const subscribeTo = (payload: string, key: string): Effect.Effect<LockBackend.Subscription, never, Scope.Scope> =>
      Effect.acquireRelease(
        Effect.suspend(() => {
          const waiter: Waiter = { pending: false, resumers: new Set() }
          let set = waiters.get(payload)
          if (set === undefined) {
            set = new Set()
            waiters.set(payload, set)
          }
          set.add(waiter)
          return Effect.as(startPolling(), waiter)
        }),
        (waiter) =>
          Effect.sync(() => {
            const set = waiters.get(payload)
            set?.delete(waiter)
            if (set !== undefined && set.size === 0) {
              waiters.delete(payload)
              if (!isWatched(key)) known.delete(key)
            }
          })
      ).pipe(Effect.map((waiter) =>
        LockBackend.subscriptionOf((wake) => {
          if (waiter.pending || closed) {
            waiter.pending = false
            wake(Effect.void)
            return constVoid
          }
          const resumer = () => wake(Effect.void)
          waiter.resumers.add(resumer)
          return () => void waiter.resumers.delete(resumer)
        })
      ))

    // ---- transactions -----------------------------------------------------------------------
    // better-sqlite3 waits for SQLite's write lock synchronously, blocking the event loop, and a
    // transaction of this same process that holds the lock could then never finish: the write
    // lock is taken without waiting, and the wait happens here, between tries
    const busyTimeout = name === "sqlite" ? yield* sqliteBusyTimeout(sql, endpoint) : undefined
    const begin = (connection: Connection): Effect.Effect<unknown, unknown> => {
      const start = connection.executeUnprepared(dialect.begin(Duration.toMillis(commandTimeout)).join("; "), [], undefined)
      if (busyTimeout === undefined) return start
      const setBusyTimeout = (ms: number) => connection.executeUnprepared(`PRAGMA busy_timeout = ${ms}`, [], undefined)
      return Effect.zipRight(setBusyTimeout(0), start).pipe(Effect.ensuring(Effect.ignore(setBusyTimeout(busyTimeout))))
    }

    /**
     * Runs `body` in a transaction on a connection of its own, bounded by the command timeout, and
     * runs it again after a failure the database says may simply be retried.
     */
    const inTransaction = <A>(
      operation: string,
      body: (connection: Connection) => Effect.Effect<A, unknown>,
      /** `body` sends BEGIN and COMMIT itself, each with other statements in one call. */
      ownsEnds = false
    ): Effect.Effect<A, BackendError> => {
      const attempt = Effect.uninterruptibleMask((restore) =>
        Effect.gen(function*() {
          const txScope = yield* Scope.make()
          const connection = yield* restore(reserveIn(txScope)).pipe(
            Effect.onError(() => Scope.close(txScope, Exit.void))
          )
          const outcome = yield* Effect.exit(restore(
            ownsEnds ? body(connection) : Effect.gen(function*() {
              yield* begin(connection)
              const result = yield* body(connection)
              yield* connection.executeUnprepared("COMMIT", [], undefined)
              return result
            })
          ))
          if (Exit.isSuccess(outcome)) {
            yield* Scope.close(txScope, Exit.void)
            return outcome.value
          }
          // roll back in the background: a call that timed out returns at once, and the connection
          // goes back to the pool only after the rollback, which waits for a statement still running
          yield* Effect.forkDaemon(
            connection.executeUnprepared("ROLLBACK", [], undefined).pipe(
              Effect.ignore,
              Effect.ensuring(Scope.close(txScope, Exit.void))
            )
          )
          return yield* outcome
        })
      )
      return bounded(operation, Effect.retry(attempt, { schedule: retrySchedule, while: (cause) => dialect.retryable(cause) }))
    }

    /** Whether transactions go in two calls (`transact`): set at start, once the client says it can. */
    let twoCallsHere = false

    /** The rows a lock statement returned, by name, and the database's clock as it read them. */
    const loadedOf = (rows: ReadonlyArray<Record<string, unknown>>) => {
      const loaded = new Map<string, Loaded>()
      let now = 0
      for (const row of rows) {
        const text = row["state"] === null || row["state"] === undefined ? "" : String(row["state"])
        loaded.set(asName(row["name"]), { text, document: decode(text), version: asNumber(row["version"]) })
        now = asNumber(row["now"])
      }
      return { loaded, now }
    }

    const endedOfRows = (rows: ReadonlyArray<Record<string, unknown>>): Map<string, number> =>
      new Map(rows.map((row) => [asName(row["holder"]), asNumber(row["expires_at"])]))

    /** What a transaction decided, and the statements that write it. */
    interface Plan<A> {
      readonly result: A
      readonly writes: ReadonlyArray<Dialect.Statement>
      readonly wake: Array<string>
      readonly versions: Array<readonly [string, number]>
    }

    /**
     * Runs `decide` on the rows of `keys` in one transaction that holds their row locks, with the
     * database's clock; writes the rows it changed and wakes the waiters the change may let in.
     * PostgreSQL and MySQL/MariaDB take it in two calls to the server (see `twoCalls`); SQLite,
     * in process, statement by statement.
     */
    const transact = <A>(
      operation: string,
      keys: ReadonlyArray<string>,
      decide: (state: Rules.State, now: number) => Rules.Step<A>,
      remembered?: Remembered
    ): Effect.Effect<A, BackendError> => {
      // sorted: transactions over several rows lock them in one order
      const names = [...new Set(keys)].sort()
      const asksAboutEnded = remembered !== undefined && remembered.ids.length > 0

      const plan = (loaded: ReadonlyMap<string, Loaded>, now: number, ended: ReadonlyMap<string, number>): Plan<A> => {
        const decision = decide(stateOf(names, loaded, remembered?.key, ended), now)
        const writes: Array<Dialect.RowWrite> = []
        const wake: Array<string> = []
        for (const key of names) {
          const old = loaded.get(key)
          const document: Document = {
            key: decision.state.keys.get(key) ?? Rules.emptyKey,
            latch: decision.state.latches.get(key)
          }
          const text = encode(document)
          if (old !== undefined && text === old.text) continue
          const previous = old?.document ?? emptyDocument
          const woken = [
            ...(freesLock(previous.key, document.key) ? [lockPayload(key)] : []),
            ...(wakesLatch(previous.latch, document.latch) ? [latchPayload(key)] : [])
          ]
          const version = old?.version ?? 0
          writes.push({
            name: key,
            state: text,
            expiresAt: expiresAt(document),
            // never back to a value a poller saw before the row was deleted and made again
            version: woken.length > 0 ? Math.max(version + 1, Math.floor(now * 1000)) : version
          })
          wake.push(...woken)
        }
        const after = remembered === undefined ? undefined : decision.state.keys.get(remembered.key)?.ended ?? new Map<string, number>()
        const remember = after === undefined ? [] : [...after].filter(([id, until]) => ended.get(id) !== until)
        // nobody listens where the backends poll: no NOTIFY
        const notices = notifies ? wake.map((payload) => `${clientId}|${payload}`) : []
        const endedWrite = remembered === undefined || remember.length === 0 ? undefined : { name: remembered.key, ended: remember }
        return {
          result: decision.result,
          writes: dialect.write(writes, notices, endedWrite),
          wake,
          versions: names.map((key) => [key, writes.find((w) => w.name === key)?.version ?? loaded.get(key)?.version ?? 0])
        }
      }

      /**
       * Whether the rules may ask about the ended holders (see `asksEnded`): read under the key's
       * lock, in rows of their own; left unread, they count as none.
       */
      const willAsk = (loaded: ReadonlyMap<string, Loaded>, now: number): boolean =>
        remembered !== undefined && asksAboutEnded && asksEnded(remembered, stateOf(names, loaded), now)

      /** Statement by statement: the lock, the ended holders if the rules will ask, the writes. */
      const oneByOne = (connection: Connection) =>
        Effect.gen(function*() {
          let rows: ReadonlyArray<Record<string, unknown>> = []
          for (const statement of dialect.lockRows(names)) rows = yield* execute(connection, statement)
          const { loaded, now } = loadedOf(rows)
          const ended = remembered !== undefined && willAsk(loaded, now)
            ? endedOfRows(yield* execute(connection, dialect.readEnded(remembered.key, remembered.ids)))
            : new Map<string, number>()
          const planned = plan(loaded, now, ended)
          for (const statement of planned.writes) yield* execute(connection, statement)
          return planned
        })

      /**
       * Two calls: BEGIN, the lock statements and the read of the ended holders in the first (each a
       * statement of its own, so that the read sees what the transactions it waited for wrote); the
       * writes and COMMIT in the second. A value that has no literal: statement by statement.
       */
      const twoCalls = (connection: Connection) =>
        Effect.suspend(() => {
          const beginning = dialect.begin(Duration.toMillis(commandTimeout))
          const lockRows = dialect.lockRows(names)
          const first = inlinedAll(dialect, [
            ...lockRows,
            ...(remembered !== undefined && asksAboutEnded ? [dialect.readEnded(remembered.key, remembered.ids)] : [])
          ])
          const commit = Effect.suspend(() => connection.executeUnprepared("COMMIT", [], undefined))
          if (first === undefined) return Effect.zipRight(begin(connection), Effect.tap(oneByOne(connection), () => commit))
          const rowsAt = beginning.length + lockRows.length - 1
          return Effect.gen(function*() {
            const results = yield* connection.executeUnprepared([...beginning, ...first].join("; "), [], undefined)
            const { loaded, now } = loadedOf(yield* resultAt(results, rowsAt))
            const ended = willAsk(loaded, now) ? endedOfRows(yield* resultAt(results, rowsAt + 1)) : new Map<string, number>()
            const planned = plan(loaded, now, ended)
            const writes = inlinedAll(dialect, planned.writes)
            if (writes === undefined) {
              for (const statement of planned.writes) yield* execute(connection, statement)
              yield* commit
            } else {
              yield* connection.executeUnprepared([...writes, "COMMIT"].join("; "), [], undefined)
            }
            return planned
          })
        })

      return inTransaction(operation, twoCallsHere ? twoCalls : oneByOne, twoCallsHere).pipe(
        // after the commit: the waiters here learn of the change at once
        Effect.map((planned) => {
          // the poller's baseline, for the keys somebody here waits on (and no others: the map
          // would keep every key this backend ever touched)
          for (const [key, version] of planned.versions) if (isWatched(key)) known.set(key, version)
          planned.wake.forEach(signal)
          return planned.result
        })
      )
    }

    /** A read of one row without a lock: `inspect` and `latchCount` change nothing. */
    const read = <A>(operation: string, key: string, f: (state: Rules.State, now: number) => A): Effect.Effect<A, BackendError> =>
      Effect.map(run(operation, dialect.readRow(key)), (rows) => {
        const row = rows[0] ?? {}
        const text = row["state"] === null || row["state"] === undefined ? "" : String(row["state"])
        return f(stateOf([key], new Map([[key, { text, document: decode(text), version: 0 }]])), asNumber(row["now"]))
      })

    const service: LockBackend.Service = {
      clientId,
      acquire: (request) =>
        whileOpen(
          "acquire",
          Effect.flatten(
            transact("acquire", [request.key], (state, now) => Rules.acquire(state, request, now), endedOf(request.key, request.holder))
          )
        ),
      release: (request) =>
        whileOpen(
          "release",
          Effect.flatten(
            transact("release", [request.key], (state, now) => Rules.release(state, request, now), endedOf(request.key, request.holder))
          )
        ),
      renew: (requests) =>
        whileOpen(
          "renew",
          Effect.map(
            Effect.forEach(chunks(requests, renewBatchSize), (batch) =>
              transact("renew", batch.map((r) => r.key), (state, now) => Rules.renew(state, batch, now))),
            (results) => results.flat()
          )
        ),
      inspect: (key) => whileOpen("inspect", read("inspect", key, (state, now) => Rules.inspect(state, key, now).result)),
      raiseFence: (request) =>
        whileOpen("raiseFence", transact("raiseFence", [request.key], (state, now) => Rules.raiseFence(state, request, now))),
      forceRelease: (request) =>
        whileOpen(
          "forceRelease",
          transact("forceRelease", [request.key], (state, now) => Rules.forceRelease(state, request, now), {
            key: request.key,
            ids: Rules.forceReleaseIds(request)
          })
        ),
      cancel: (request) =>
        whileOpen(
          "cancel",
          transact("cancel", [request.key], (state, now) => Rules.cancel(state, request, now), { key: request.key, ids: [] })
        ),
      subscribe: (key) => whileOpen("subscribe", subscribeTo(lockPayload(key), key)),
      latchSetCount: (request) =>
        whileOpen(
          "latchSetCount",
          Effect.flatten(transact("latchSetCount", [request.key], (state, now) => Rules.latchSetCount(state, request, now)))
        ),
      latchCountDown: (request) =>
        whileOpen(
          "latchCountDown",
          Effect.flatten(transact("latchCountDown", [request.key], (state, now) => Rules.latchCountDown(state, request, now)))
        ),
      latchCount: (key) =>
        whileOpen("latchCount", Effect.flatten(read("latchCount", key, (state, now) => Rules.latchCount(state, key, now).result))),
      latchSubscribe: (key) => whileOpen("latchSubscribe", subscribeTo(latchPayload(key), key))
    }

    // ---- schema, sweeping, notifications ----------------------------------------------------
    // every operation is a transaction: a pooler that runs none (PgBouncer's pool_mode =
    // statement) fails the layer here, saying what to use, rather than every lock later
    if (name === "pg") yield* inTransaction("connect", () => Effect.void).pipe(Effect.mapError(statementPooling))
    if (settings?.createSchema !== false) {
      yield* createSchema(sql, dialect, endpoint).pipe(Effect.mapError((error) => explained(error, dialect, table, "create")))
    } else {
      // every right the backend uses at run time, used once on a row of its own that it leaves as
      // it found it (absent): a role short of one fails here, not at its first lock
      const probe = `lockstep-check:${clientId}`
      yield* inTransaction("checkTables", (connection) =>
        Effect.forEach(
          [
            ...dialect.lockRows([probe]),
            ...dialect.write([{ name: probe, state: "", expiresAt: 0, version: 0 }], [], { name: probe, ended: [["check", 0]] }),
            dialect.readEnded(probe, ["check"]),
            ...dialect.forget(probe)
          ],
          (statement) => execute(connection, statement),
          { discard: true }
        )).pipe(Effect.mapError((error) => explained(error, dialect, table, "use")))
    }

    twoCallsHere = name !== "sqlite" && (yield* bounded("connect", severalStatementsPerCall(sql)))

    const sweep = inTransaction("sweep", (connection) => Effect.forEach(dialect.sweep, (statement) => execute(connection, statement)))
    yield* Effect.forkScoped(Effect.ignore(sweep).pipe(Effect.repeat(Schedule.spaced(sweepInterval)), Effect.interruptible))

    if (notifies) {
      const listener = typeof wakeUp === "object" ? yield* listenClient(wakeUp.listenUrl, endpoint) : undefined
      yield* listen(sql, listener, table, clientId, signal, failure("listen"))
    }

    // added last, so run first when the scope closes: every waiter wakes to find the backend
    // closed, rather than waiting for a wake-up that nothing is left to send
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
        for (const payload of [...waiters.keys()]) signal(payload)
      })
    )

    return service
  })

/**
 * Whether the client sends several statements in one call and answers with the rows of each:
 * `@effect/sql-pg` does (a simple query), `@effect/sql-mysql2` does (its pools allow multiple
 * statements). A client that does not gets its transactions statement by statement.
 */
const severalStatementsPerCall = (sql: SqlClient): Effect.Effect<boolean> =>
  Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.executeUnprepared("SELECT 1 AS one; SELECT 2 AS two", [], undefined))).pipe(
    Effect.map((results: unknown) => {
      if (!Array.isArray(results) || results.length !== 2) return false
      const [first, second] = results as ReadonlyArray<unknown>
      return Array.isArray(first) && Array.isArray(second) && asNumber((second[0] as Record<string, unknown> | undefined)?.["two"]) === 2
    }),
    Effect.orElseSucceed(() => false)
  )

/** Every statement of `statements` as SQL text with its literals, or `undefined` if one has none. */
const inlinedAll = (dialect: Dialect.Dialect, statements: ReadonlyArray<Dialect.Statement>): Array<string> | undefined => {
  const texts: Array<string> = []
  for (const statement of statements) {
    const text = dialect.inline(statement)
    if (text === undefined) return undefined
    texts.push(text)
  }
  return texts
}

/** The rows of the `index`th statement of a call that sent several (the drivers answer with one list per statement). */
const resultAt = (results: unknown, index: number): Effect.Effect<ReadonlyArray<Record<string, unknown>>, Error> => {
  const rows: unknown = Array.isArray(results) ? results[index] : undefined
  return Array.isArray(rows)
    ? Effect.succeed(rows as ReadonlyArray<Record<string, unknown>>)
    : Effect.fail(new Error(`the driver did not answer statement ${index + 1} of a call with its rows`))
}

const timedOut = "no answer within the command timeout"

/** Longer timeouts than a host timer takes never fire (as with `Effect.timeout`). */
const maxTimerMs = 2 ** 31 - 1

/** Between tries of a transaction the database refused for now: 2 ms, doubling up to 25 ms, jittered. */
const retrySchedule = Schedule.exponential(Duration.millis(2)).pipe(
  Schedule.union(Schedule.spaced(Duration.millis(25))),
  Schedule.jittered
)

/** The SQLite connection's own busy timeout, to put back after each transaction has begun. */
const sqliteBusyTimeout = (sql: SqlClient, endpoint: string): Effect.Effect<number, BackendError> =>
  Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.executeUnprepared("PRAGMA busy_timeout", [], undefined))).pipe(
    Effect.map((rows) => {
      const row = (rows as ReadonlyArray<Record<string, unknown>>)[0] ?? {}
      return asNumber(row["timeout"] ?? 0)
    }),
    Effect.mapError((cause) => new BackendError({ operation: "connect", cause, endpoint, detail: describe(cause) }))
  )

/** The client's dialect and the table, once both are known to be valid. */
const resolve = (
  sql: SqlClient,
  settings: Pick<Settings, "schema" | "table"> | undefined
): Effect.Effect<{ readonly dialect: Dialect.Dialect; readonly table: Dialect.Table }, InvalidLockOptions> =>
  Effect.suspend(() => {
    const name = sql.onDialectOrElse<Dialect.DialectName | undefined, Dialect.DialectName, Dialect.DialectName, Dialect.DialectName>({
      orElse: () => undefined,
      pg: () => "pg",
      mysql: () => "mysql",
      sqlite: () => "sqlite"
    })
    if (name === undefined) {
      return Effect.fail(new InvalidLockOptions({ field: "client", reason: "the SQL client must be PostgreSQL, MySQL/MariaDB or SQLite" }))
    }
    const table: Dialect.Table = { schema: settings?.schema, table: settings?.table ?? defaultTable }
    for (const [field, value] of [["schema", table.schema], ["table", table.table]] as const) {
      const reason = value === undefined ? undefined : Dialect.invalidIdentifier(value)
      if (reason !== undefined) return Effect.fail(new InvalidLockOptions({ field, reason }))
    }
    return Effect.succeed({ dialect: Dialect.make(name, table), table })
  })

/**
 * Creates the tables if absent. Two processes doing it at once can make one `CREATE … IF NOT
 * EXISTS` fail (PostgreSQL's catalog unique violation); run again, it finds the table there.
 */
const createSchema = (sql: SqlClient, dialect: Dialect.Dialect, endpoint: string): Effect.Effect<void, BackendError> =>
  Effect.forEach(dialect.createSchema, (statement) =>
    Effect.scoped(Effect.flatMap(sql.reserve, (connection) => connection.execute(statement, [], undefined))).pipe(
      Effect.retry({ times: 1, while: (cause) => dialect.refusal(cause) === undefined })
    ), { discard: true }).pipe(
      Effect.mapError((cause) => new BackendError({ operation: "createSchema", cause, endpoint, detail: describe(cause) }))
    )

/**
 * `error` with what to do about it, where the database refused for want of a right or of a table:
 * the server's reason names the table or schema, not what the backend needs.
 */
const explained = (error: BackendError, dialect: Dialect.Dialect, table: Dialect.Table, doing: "create" | "use"): BackendError => {
  const refusal = dialect.refusal(error.cause)
  if (refusal === undefined) return error
  const tables = `${table.table} and ${table.table}_ended`
  const hint = doing === "create"
    ? refusal === "denied"
      ? "a role that may not create them needs the tables made beforehand with SqlBackend.migrate, and createSchema: false"
      : undefined
    : refusal === "denied"
    ? `the backend needs SELECT, INSERT, UPDATE and DELETE on ${tables}${dialect.name === "pg" ? ", and USAGE on their schema" : ""}`
    : `make ${tables} with SqlBackend.migrate, or build the backend with createSchema: true`
  return hint === undefined ? error : new BackendError({
    operation: error.operation,
    cause: error.cause,
    endpoint: error.endpoint,
    detail: `${error.detail ?? describe(error.cause)} (${hint})`
  })
}

/** `SqlBackend.migrate`: the table, without a backend. */
export const migrate = (
  sql: SqlClient,
  settings: Pick<Settings, "schema" | "table"> | undefined
): Effect.Effect<void, BackendError | InvalidLockOptions> =>
  Effect.flatMap(resolve(sql, settings), ({ dialect }) => createSchema(sql, dialect, ofClient(sql, dialect.name)))

/** Acquire and release ask whether the holder ended, and whether it ended without holding. */
const endedOf = (key: string, holder: string): Remembered => ({ key, ids: [holder, Rules.endedUnheld(holder)], unlessHolding: holder })

/**
 * Whether the rules may ask about the ended holders of `remembered` in `state` (`Rules.acquire` and
 * `Rules.release` look them up only for a holder without a live hold). Left unread, they count as
 * none: the decision is the same, and what it remembers is written all the same (an upsert).
 */
const asksEnded = (remembered: Remembered, state: Rules.State, now: number): boolean => {
  const holder = remembered.unlessHolding
  return holder === undefined || !Rules.liveKey(state, remembered.key, now).holders.some((h) => h.holder === holder)
}

const stateOf = (
  names: ReadonlyArray<string>,
  loaded: ReadonlyMap<string, Loaded>,
  endedKey?: string,
  ended?: ReadonlyMap<string, number>
): Rules.State => ({
  keys: new Map(names.map((key) => {
    const state = (loaded.get(key)?.document ?? emptyDocument).key
    return [key, key === endedKey && ended !== undefined ? { ...state, ended } : state]
  })),
  latches: new Map(
    names.flatMap((key) => {
      const latch = loaded.get(key)?.document.latch
      return latch === undefined ? [] : [[key, latch] as const]
    })
  )
})

const chunks = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> => {
  const out: Array<ReadonlyArray<A>> = []
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size))
  return out
}

/** The client's LISTEN, where it has one (`@effect/sql-pg`). */
interface Listening {
  readonly listen: (channel: string) => Stream.Stream<string, unknown>
}

const canListen = (sql: SqlClient): sql is SqlClient & Listening =>
  "listen" in sql && typeof (sql as { readonly listen?: unknown }).listen === "function"

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

/** How long the layer waits for its own notification to come back before it calls LISTEN deaf. */
const listenCheck = Duration.seconds(5)

/**
 * Why no notification came back: the LISTEN connection failed, or (where it works) a pooler that
 * does not pass notifications on, or a `listenUrl` that does not reach the client's database.
 */
const unheard = (direct: string | undefined, lastError: unknown, within: Duration.Duration): string => {
  const wait = Duration.format(within)
  if (lastError !== undefined) return `the LISTEN connection${direct === undefined ? "" : ` to ${direct}`} failed: ${describe(lastError)}`
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
    const fail = (cause: unknown, detail = describe(cause)) =>
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

/**
 * Wakes this backend's waiters on every other backend's notifications (its own woke them at
 * commit), heard on `listener` (`wakeUp.listenUrl`) or on the client's own LISTEN connection.
 * Ready only once a notification of its own, sent through the client's pool, has come back: a
 * waiter subscribing after that never misses a release; where none comes back in time, fails
 * saying why.
 */
const listen = (
  sql: SqlClient,
  listener: (SqlClient & Listening) | undefined,
  table: Dialect.Table,
  clientId: string,
  signal: (payload: string) => void,
  failure: (cause: unknown) => BackendError
): Effect.Effect<void, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
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
          if (!message.startsWith(own)) signal(message.slice(message.indexOf("|") + 1))
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
