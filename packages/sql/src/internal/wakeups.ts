/**
 * How the waiters of this backend learn that a key changed: a `WaiterSignal` per subscription,
 * woken by this backend's own commits at once, and by other processes' commits through
 * PostgreSQL's LISTEN (listen.ts) or, without it (MySQL, SQLite, PostgreSQL with `wakeUp:
 * "poll"`), by a poller that reads the versions of the rows somebody here waits on.
 */
import type { Duration, Scope } from "effect"
import { Effect, Either } from "effect"
import type { Lifecycle, WaiterSignal } from "@lockstep/core/BackendKit"
import type * as LockBackend from "@lockstep/core/LockBackend"
import type * as Rules from "@lockstep/core/Rules"
import type { Calls } from "./calls.js"
import type * as Dialect from "./dialect.js"
import { asName, asNumber } from "./rows.js"

/** What a change to a key's lock wakes (its waiters' subscriptions, and NOTIFY's payload). */
export const lockPayload = (key: string) => `l:${key}`
/** What a change to a key's latch wakes. */
export const latchPayload = (key: string) => `c:${key}`

/** Whether the change from `before` to `after` may let a waiter of the lock in. */
export const freesLock = (before: Rules.Key, after: Rules.Key): boolean => {
  for (const hold of before.holders) {
    const now = after.holders.find((h) => h.holder === hold.holder)
    if (now === undefined) return true
    if ((hold.exclusive > 0 && now.exclusive === 0) || (hold.shared > 0 && now.shared === 0)) return true
  }
  return before.queue[0]?.holder !== after.queue[0]?.holder && after.queue.length > 0
}

/** Whether a latch's waiters are to be woken: it reached 0, or was set anew. */
export const wakesLatch = (before: Rules.Latch | undefined, after: Rules.Latch | undefined): boolean => {
  const was = before?.count ?? 0
  const is = after?.count ?? 0
  return (was > 0 && is === 0) || (was === 0 && is > 0)
}

export interface Wakeups {
  /** Wakes every subscription to `payload`. */
  readonly wake: (payload: string) => void
  /** A subscription to `payload` (of `key`), for as long as the scope lasts. */
  readonly subscribe: (payload: string, key: string) => Effect.Effect<LockBackend.Subscription, never, Scope.Scope>
  /**
   * After a commit of this backend: the rows' `versions` become the poller's baseline, and the
   * subscriptions to `wake` wake at once.
   */
  readonly committed: (versions: ReadonlyArray<readonly [string, number]>, wake: ReadonlyArray<string>) => void
}

/** What the wake-ups are made with. */
export interface WakeupsContext {
  /** Makes the subscriptions' signals, all woken when the backend closes. */
  readonly lifecycle: Lifecycle
  readonly calls: Calls
  readonly dialect: Dialect.Dialect
  /** PostgreSQL with LISTEN: no poller. */
  readonly notifies: boolean
  readonly pollInterval: Duration.Duration
  /** The backend's: the poller runs in it. */
  readonly scope: Scope.Scope
}

/** The keys a poll reads in one statement at most. */
const pollChunk = 500

export const make = ({ calls, dialect, lifecycle, notifies, pollInterval, scope }: WakeupsContext): Wakeups => {
  const signals = new Map<string, Set<WaiterSignal>>()
  /** Versions of rows as this backend last saw them, for the poller (MySQL, SQLite). */
  const known = new Map<string, number>()
  let polling = false

  const wake = (payload: string): void => {
    const set = signals.get(payload)
    if (set === undefined) return
    for (const signal of set) signal.wake()
  }

  const isWatched = (key: string): boolean => !notifies && (signals.has(lockPayload(key)) || signals.has(latchPayload(key)))

  /** The keys someone here waits on. */
  const watched = (): Array<string> => {
    const names = new Set<string>()
    for (const payload of signals.keys()) names.add(payload.slice(2))
    return [...names]
  }

  // Without LISTEN/NOTIFY, other processes' changes are found by reading the versions of the rows
  // somebody here waits on: one query per interval for all of them, only while some wait.
  const poll: Effect.Effect<void> = Effect.gen(function*() {
    while (true) {
      yield* Effect.sleep(pollInterval)
      const names = watched()
      if (names.length === 0) {
        polling = false
        return
      }
      for (let i = 0; i < names.length; i += pollChunk) {
        const chunk = names.slice(i, i + pollChunk)
        const rows = yield* Effect.either(calls.run("poll", dialect.versions(chunk)))
        if (Either.isLeft(rows)) continue
        const seen = new Map(rows.right.map((row) => [asName(row["name"]), asNumber(row["version"])]))
        for (const key of chunk) {
          const version = seen.get(key) ?? 0
          const before = known.get(key)
          known.set(key, version)
          if (before !== undefined && before !== version) {
            wake(lockPayload(key))
            wake(latchPayload(key))
          }
        }
      }
    }
  })

  const startPolling = (): Effect.Effect<void> =>
    polling || notifies ? Effect.void : Effect.suspend(() => {
      polling = true
      // interruptible: forked from a subscription's acquisition, it would inherit its
      // uninterruptible region, and the closing scope would wait for every waiter to leave
      return Effect.asVoid(Effect.forkIn(Effect.interruptible(poll), scope))
    })

  const subscribe = (payload: string, key: string): Effect.Effect<LockBackend.Subscription, never, Scope.Scope> =>
    Effect.acquireRelease(
      Effect.suspend(() => {
        const signal = lifecycle.waiterSignal()
        let set = signals.get(payload)
        if (set === undefined) {
          set = new Set()
          signals.set(payload, set)
        }
        set.add(signal)
        return Effect.as(startPolling(), signal)
      }),
      (signal) =>
        Effect.sync(() => {
          const set = signals.get(payload)
          set?.delete(signal)
          if (set !== undefined && set.size === 0) {
            signals.delete(payload)
            if (!isWatched(key)) known.delete(key)
          }
          signal.close()
        })
    ).pipe(Effect.map((signal) => signal.subscription))

  const committed = (versions: ReadonlyArray<readonly [string, number]>, woken: ReadonlyArray<string>): void => {
    // the poller's baseline, for the keys somebody here waits on (and no others: the map would
    // keep every key this backend ever touched)
    for (const [key, version] of versions) if (isWatched(key)) known.set(key, version)
    woken.forEach(wake)
  }

  return { wake, subscribe, committed }
}
