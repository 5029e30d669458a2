/**
 * One operation as one transaction: lock the keys' rows, read them and the database's clock,
 * apply the rules of `@lockstep/core/Rules`, write back the rows that changed (and the ended
 * holders the rules remember), then wake the waiters the change may let in. PostgreSQL and
 * MySQL/MariaDB take it in two calls to the server where the client sends several statements in
 * one; otherwise, and on SQLite (in process), it goes statement by statement.
 */
import { Duration, Effect } from "effect"
import type { BackendError } from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import type { Connection } from "@effect/sql/SqlConnection"
import { type Calls, commit, execute } from "./calls.js"
import type * as Dialect from "./dialect.js"
import { type Document, emptyDocument, encode, expiresAt } from "./document.js"
import { endedOfRows, type Loaded, loadedOf, readOf, type Remembered, type Rows, stateOf } from "./rows.js"
import { freesLock, latchPayload, lockPayload, wakesLatch, type Wakeups } from "./wakeups.js"

/** What transactions are run with. */
export interface TransactContext {
  readonly calls: Calls
  readonly wakeups: Wakeups
  readonly dialect: Dialect.Dialect
  /** Starts the payloads this backend notifies, so that it knows its own notifications. */
  readonly clientId: string
  /** PostgreSQL with LISTEN: commits notify the payloads they wake. */
  readonly notifies: boolean
  /** Whether the client takes several statements in one call (see `twoCalls`). */
  readonly twoCalls: boolean
  readonly commandTimeout: Duration.Duration
}

/** One operation's transaction: the rows it locks, the rules' decision on them. */
interface Change<A> {
  /** Sorted and without repeats: transactions over several rows lock them in one order. */
  readonly names: ReadonlyArray<string>
  readonly decide: (state: Rules.State, now: number) => Rules.Step<A>
  readonly remembered: Remembered | undefined
}

/** What a transaction decided, and the statements that write it. */
interface Plan<A> {
  readonly result: A
  readonly writes: ReadonlyArray<Dialect.Statement>
  readonly wake: Array<string>
  readonly versions: Array<readonly [string, number]>
}

export interface Transact {
  /**
   * Runs `decide` on the rows of `keys` in one transaction that holds their row locks, with the
   * database's clock; writes the rows it changed and wakes the waiters the change may let in.
   * `remembered`: the ended holders the rules may ask about.
   */
  readonly transact: <A>(
    operation: string,
    keys: ReadonlyArray<string>,
    decide: (state: Rules.State, now: number) => Rules.Step<A>,
    remembered?: Remembered
  ) => Effect.Effect<A, BackendError>
  /** A read of one row without a lock: `inspect` and `latchCount` change nothing. */
  readonly read: <A>(operation: string, key: string, f: (state: Rules.State, now: number) => A) => Effect.Effect<A, BackendError>
}

export const make = (context: TransactContext): Transact => {
  const { calls, dialect, twoCalls, wakeups } = context
  const commandTimeoutMs = Duration.toMillis(context.commandTimeout)
  const transact = <A>(
    operation: string,
    keys: ReadonlyArray<string>,
    decide: (state: Rules.State, now: number) => Rules.Step<A>,
    remembered?: Remembered
  ): Effect.Effect<A, BackendError> => {
    const change: Change<A> = { names: [...new Set(keys)].sort(), decide, remembered }
    return calls.inTransaction(
      operation,
      twoCalls
        ? (connection) => inTwoCalls(context, commandTimeoutMs, change, connection)
        : (connection) => oneByOne(context, change, connection),
      twoCalls
    ).pipe(
      // after the commit: the waiters here learn of the change at once
      Effect.map((planned) => {
        wakeups.committed(planned.versions, planned.wake)
        return planned.result
      })
    )
  }
  const read = <A>(operation: string, key: string, f: (state: Rules.State, now: number) => A): Effect.Effect<A, BackendError> =>
    Effect.map(calls.run(operation, dialect.readRow(key)), (rows) => {
      const { loaded, now } = readOf(rows, key)
      return f(stateOf([key], loaded), now)
    })
  return { transact, read }
}

/** Whether the change reads ended holders at all (an operation that remembers some may ask about none). */
const readsEnded = (remembered: Remembered | undefined): remembered is Remembered =>
  remembered !== undefined && remembered.ids.length > 0

/**
 * Whether the rules may ask about the ended holders the change names (`Rules.acquire` and
 * `Rules.release` look them up only for a holder without a live hold). They are read under the
 * key's lock, in rows of their own; left unread, they count as none: the decision is the same,
 * and what it remembers is written all the same (an upsert).
 */
const asksEnded = <A>({ names, remembered }: Change<A>, loaded: ReadonlyMap<string, Loaded>, now: number): boolean => {
  if (!readsEnded(remembered)) return false
  const holder = remembered.unlessHolding
  return holder === undefined ||
    !Rules.liveKey(stateOf(names, loaded), remembered.key, now).holders.some((h) => h.holder === holder)
}

/** The rules' decision on the rows as loaded, the rows it changes and what they wake. */
const plan = <A>(
  { clientId, dialect, notifies }: TransactContext,
  { decide, names, remembered }: Change<A>,
  loaded: ReadonlyMap<string, Loaded>,
  now: number,
  ended: ReadonlyMap<string, number>
): Plan<A> => {
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

/** Statement by statement: the lock, the ended holders if the rules will ask, the writes. */
const oneByOne = <A>(context: TransactContext, change: Change<A>, connection: Connection): Effect.Effect<Plan<A>, unknown> =>
  Effect.gen(function*() {
    const { dialect } = context
    const { names, remembered } = change
    let rows: Rows = []
    for (const statement of dialect.lockRows(names)) rows = yield* execute(connection, statement)
    const { loaded, now } = loadedOf(rows)
    const ended = remembered !== undefined && asksEnded(change, loaded, now)
      ? endedOfRows(yield* execute(connection, dialect.readEnded(remembered.key, remembered.ids)))
      : new Map<string, number>()
    const planned = plan(context, change, loaded, now, ended)
    for (const statement of planned.writes) yield* execute(connection, statement)
    return planned
  })

/**
 * Two calls: BEGIN, the lock statements and the read of the ended holders in the first (each a
 * statement of its own, so that the read sees what the transactions it waited for wrote); the
 * writes and COMMIT in the second. A value that has no literal: statement by statement.
 */
const inTwoCalls = <A>(
  context: TransactContext,
  commandTimeoutMs: number,
  change: Change<A>,
  connection: Connection
): Effect.Effect<Plan<A>, unknown> =>
  Effect.suspend(() => {
    const { calls, dialect } = context
    const { names, remembered } = change
    const beginning = dialect.begin(commandTimeoutMs)
    const lockRows = dialect.lockRows(names)
    const first = inlinedAll(dialect, [
      ...lockRows,
      ...(readsEnded(remembered) ? [dialect.readEnded(remembered.key, remembered.ids)] : [])
    ])
    const committing = Effect.suspend(() => commit(connection))
    if (first === undefined) return Effect.zipRight(calls.begin(connection), Effect.tap(oneByOne(context, change, connection), () => committing))
    const rowsAt = beginning.length + lockRows.length - 1
    return Effect.gen(function*() {
      const results = yield* connection.executeUnprepared([...beginning, ...first].join("; "), [], undefined)
      const { loaded, now } = loadedOf(yield* resultAt(results, rowsAt))
      const ended = asksEnded(change, loaded, now) ? endedOfRows(yield* resultAt(results, rowsAt + 1)) : new Map<string, number>()
      const planned = plan(context, change, loaded, now, ended)
      const writes = inlinedAll(dialect, planned.writes)
      if (writes === undefined) {
        for (const statement of planned.writes) yield* execute(connection, statement)
        yield* committing
      } else {
        yield* connection.executeUnprepared([...writes, "COMMIT"].join("; "), [], undefined)
      }
      return planned
    })
  })

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
const resultAt = (results: unknown, index: number): Effect.Effect<Rows, Error> => {
  const rows: unknown = Array.isArray(results) ? results[index] : undefined
  return Array.isArray(rows)
    ? Effect.succeed(rows as Rows)
    : Effect.fail(new Error(`the driver did not answer statement ${index + 1} of a call with its rows`))
}
