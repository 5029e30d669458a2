/**
 * The backend rules written down in `@lockstep/core/LockBackend`, as pure functions: the reference
 * every backend is checked against (`@lockstep/testkit`'s `Model` and `ModelCheck`), and the
 * interpreter of backends that keep a key's state as data and apply each operation to it in one
 * transaction (`@lockstep/sql`). It favours plainness over speed: immutable data, one function per
 * backend operation, each taking the current time `now` (milliseconds on the backend's clock) and
 * returning the next state with the result, in the very shapes the `LockBackend` service reports.
 * Where the rules leave a detail open (expiry at `now === expiresAt`, the fair queue and re-entry,
 * the stored limit, the fence formula, remembered holders, latches), the conventions it fixes are
 * in the README ("Semantics").
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import type {
  AcquireRequest,
  AcquireResult,
  CancelRequest,
  ForceReleaseRequest,
  RaiseFenceRequest,
  HoldMode,
  KeyState,
  LatchRequest,
  ReleaseRequest,
  RenewRequest,
  RenewResult,
  SetCountRequest
} from "./LockBackend.js"
import { forceReleaseMemoryMs, latchCallMemoryMs } from "./LockBackend.js"
import { InvalidLockOptions, LockUpgradeNotSupported, NotHeld } from "./LockError.js"

/**
 * One holder's holds on one key.
 *
 * @example
 * ```ts
 * import type { Rules } from "@lockstep/core"
 *
 * const writer: Rules.Hold = { holder: "c:1", exclusive: 1, shared: 0, permits: 0, fence: 1, expiresAt: 30_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Hold {
  readonly holder: string
  /** Exclusive hold count (0 when not held exclusively). */
  readonly exclusive: number
  /** Shared hold count (0 when not held shared). */
  readonly shared: number
  /** Permits of the shared hold (0 when not held shared). */
  readonly permits: number
  readonly fence: number
  readonly expiresAt: number
}

/**
 * One fair-queue entry.
 *
 * @example
 * ```ts
 * import type { Rules } from "@lockstep/core"
 *
 * const waiter: Rules.Waiter = { holder: "c:2", expiresAt: 5_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Waiter {
  readonly holder: string
  readonly expiresAt: number
}

/**
 * The state of one key.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const fresh: Rules.Key = Rules.emptyKey
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Key {
  /** The last fence issued (0 if none ever was). */
  readonly fence: number
  /** Until when `fence` is remembered; after that `inspect` reports 0. */
  readonly fenceUntil: number
  /** Ended holders and applied forced releases (`force|<id>`) -> until when they are remembered. */
  readonly ended: ReadonlyMap<string, number>
  /** The stored shared limit; `undefined` while the key has no shared holder. */
  readonly limit: number | undefined
  /** Holders in the order they were first granted. */
  readonly holders: ReadonlyArray<Hold>
  /** Waiters in arrival order. */
  readonly queue: ReadonlyArray<Waiter>
}

/**
 * The state of every key. Keys never touched are absent and behave as `emptyKey`.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const state: Rules.State = Rules.empty
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface State {
  readonly keys: ReadonlyMap<string, Key>
  readonly latches: ReadonlyMap<string, Latch>
}

/**
 * The next state together with the result of an operation.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const step: Rules.Step<boolean> = Rules.forceRelease(Rules.empty, { key: "k", id: "op-1" }, 0)
 * console.log(step.result) // false
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Step<A> {
  readonly state: State
  readonly result: A
}

/**
 * The errors `acquire` can report (a backend may also report `BackendError`; the model never does).
 *
 * @example
 * ```ts
 * import type { Rules } from "@lockstep/core"
 *
 * const tag = (e: Rules.AcquireRefusal) => e._tag
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type AcquireRefusal = LockUpgradeNotSupported | InvalidLockOptions | NotHeld

/**
 * A key nobody has touched yet.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * console.log(Rules.emptyKey.fence) // 0
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const emptyKey: Key = { fence: 0, fenceUntil: 0, ended: new Map(), limit: undefined, holders: [], queue: [] }

/**
 * The state in which no key was ever touched.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const state = Rules.empty
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const empty: State = { keys: new Map(), latches: new Map() }

/**
 * The stored state of a key, as is (expired entries included).
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * console.log(Rules.getKey(Rules.empty, "k").holders.length) // 0
 * ```
 *
 * @since 0.1.0
 * @category getters
 */
export const getKey = (state: State, key: string): Key => state.keys.get(key) ?? emptyKey

const setKey = (state: State, key: string, value: Key): State => {
  const keys = new Map(state.keys)
  keys.set(key, normalize(value))
  return { ...state, keys }
}

/** The shared limit is forgotten once the key has no shared holder left. */
const normalize = (key: Key): Key =>
  key.holders.some((h) => h.shared > 0) ? key : { ...key, limit: undefined }

const isLive = (expiresAt: number, now: number): boolean => now < expiresAt

/** The key with its expired holders and queue entries dropped. */
const pruned = (key: Key, now: number): Key =>
  normalize({
    ...key,
    holders: key.holders.filter((h) => isLive(h.expiresAt, now)),
    queue: key.queue.filter((w) => isLive(w.expiresAt, now)),
    ended: new Map([...key.ended].filter(([, until]) => isLive(until, now)))
  })

const hasEnded = (key: Key, id: string, now: number): boolean => isLive(key.ended.get(id) ?? 0, now)

const remember = (key: Key, id: string, until: number): Key => ({ ...key, ended: new Map(key.ended).set(id, until) })

/**
 * The fence a grant issues at `now` (milliseconds) on a key whose last fence is `last`: above
 * every fence issued before, and never below the clock in microseconds, so that a key that forgot
 * its last fence still issues a greater one.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const fence = Rules.nextFence(0, 1_000) // 1_000_000
 * ```
 *
 * @since 0.1.0
 * @category fences
 */
export const nextFence = (last: number, now: number): number => Math.max(last + 1, Math.floor(now * 1000))

/**
 * Until when a key must remember `fence`, issued or raised at `now` for a lease of `leaseMs`, when
 * it remembered its previous fence until `until`: for the lease, and until the clock has passed the
 * fence (after that `nextFence` issues a greater one from the clock alone).
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const until = Rules.fenceRememberedUntil(0, 1_000_000, 1_000, 30_000) // 31_000
 * ```
 *
 * @since 0.1.0
 * @category fences
 */
export const fenceRememberedUntil = (until: number, fence: number, now: number, leaseMs: number): number =>
  Math.max(until, now + leaseMs, fence / 1000 + 1)

/** The key after issuing its next fence at `now` for a lease of `leaseMs`. */
const issueFence = (key: Key, now: number, leaseMs: number): Key => {
  const fence = nextFence(key.fence, now)
  return { ...key, fence, fenceUntil: fenceRememberedUntil(key.fenceUntil, fence, now, leaseMs) }
}

/**
 * The refusal of a shared request whose `limit` differs from the one the key is held with (an
 * infinite limit, a read lock's, reads "unlimited").
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const error = Rules.limitMismatch("k", 3, 5)
 * // error.reason: "\"k\" is held with limit 3, the request names limit 5"
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const limitMismatch = (key: string, heldLimit: number, requestedLimit: number): InvalidLockOptions =>
  new InvalidLockOptions({
    field: "limit",
    reason: `"${key}" is held with limit ${limitText(heldLimit)}, the request names limit ${limitText(requestedLimit)}`
  })

const limitText = (limit: number): string => (Number.isFinite(limit) ? String(limit) : "unlimited")

/**
 * The refusal of a shared request for more permits than its limit: it could never be granted.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const error = Rules.permitsExceedLimit("k", 4, 3)
 * // error.reason: "4 permits exceed the limit 3 of \"k\""
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const permitsExceedLimit = (key: string, permits: number, limit: number): InvalidLockOptions =>
  new InvalidLockOptions({ field: "permits", reason: `${permits} permits exceed the limit ${limitText(limit)} of "${key}"` })

/**
 * The refusal of a latch call on a key that a lock holds.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const error = Rules.notALatch("k")
 * // error.field: "key"
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const notALatch = (key: string): InvalidLockOptions =>
  new InvalidLockOptions({ field: "key", reason: `"${key}" is held by a lock, not a latch` })

/**
 * The live state of a key at `now`: expired holders and queue entries dropped.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const key = Rules.liveKey(Rules.empty, "k", 1_000)
 * ```
 *
 * @since 0.1.0
 * @category getters
 */
export const liveKey = (state: State, key: string, now: number): Key => pruned(getKey(state, key), now)

const findHold = (key: Key, holder: string): Hold | undefined => key.holders.find((h) => h.holder === holder)

const replaceHold = (key: Key, hold: Hold): Key => ({
  ...key,
  holders: key.holders.map((h) => (h.holder === hold.holder ? hold : h))
})

const removeHolder = (key: Key, holder: string): Key => ({
  ...key,
  holders: key.holders.filter((h) => h.holder !== holder)
})

const dequeue = (key: Key, holder: string): Key => ({
  ...key,
  queue: key.queue.filter((w) => w.holder !== holder)
})

/** Adds `holder` at the end of the queue, or refreshes its entry in place. */
const enqueue = (key: Key, holder: string, expiresAt: number): Key =>
  key.queue.some((w) => w.holder === holder)
    ? { ...key, queue: key.queue.map((w) => (w.holder === holder ? { holder, expiresAt } : w)) }
    : { ...key, queue: [...key.queue, { holder, expiresAt }] }

const countOf = (hold: Hold, mode: HoldMode): number => (mode === "exclusive" ? hold.exclusive : hold.shared)

const granted = (fence: number, count: number): AcquireResult => ({ _tag: "Granted", fence, count })

/** The queue entries standing before `holder` (all of them when it is not queued). */
const aheadOf = (key: Key, holder: string): ReadonlyArray<Waiter> => {
  const index = key.queue.findIndex((w) => w.holder === holder)
  return index === -1 ? key.queue : key.queue.slice(0, index)
}

/**
 * Applies an acquisition attempt.
 *
 * In order: drop expired entries; a shared request naming another limit than the stored one fails
 * with `InvalidLockOptions`; an exclusive request by a holder holding the key only shared fails
 * with `LockUpgradeNotSupported`; a holder already holding the key in the requested mode re-enters
 * (count + 1, expiry at least now + lease, same fence); a writer asking for the read lock gets it
 * if its permits fit (same fence). Otherwise it is a new grant, allowed iff the mode allows it
 * (exclusive: no live holder; shared: no live exclusive holder and the shared permits + `permits`
 * fit the limit) and, when `fair`, the queue is empty or starts with the holder. A new grant takes
 * the next fence. A denied fair request queues the holder (or refreshes its entry) until
 * now + `waiterTtlMs`. `retryAfterMs` is the time until the earliest blocking hold or queue entry
 * expires, at least 1.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const request = {
 *   key: "k", holder: "c:1", mode: "exclusive", permits: 1, limit: 1,
 *   leaseMs: 100, fair: false, waiterTtlMs: 50, count: 1
 * } as const
 * const { state, result } = Rules.acquire(Rules.empty, request, 0)
 * // result: Either.right({ _tag: "Granted", fence: 1, count: 1 })
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const acquire = (
  state: State,
  request: AcquireRequest,
  now: number
): Step<Either.Either<AcquireResult, AcquireRefusal>> => {
  const key = liveKey(state, request.key, now)
  const { holder, mode } = request
  const done = (next: Key, result: Either.Either<AcquireResult, AcquireRefusal>) => ({
    state: setKey(state, request.key, next),
    result
  })

  if (mode === "shared" && key.limit !== undefined && key.limit !== request.limit) {
    return done(key, Either.left(limitMismatch(request.key, key.limit, request.limit)))
  }

  if (mode === "shared" && request.permits > request.limit) {
    return done(key, Either.left(permitsExceedLimit(request.key, request.permits, request.limit)))
  }

  const hold = findHold(key, holder)
  const expiresAt = now + request.leaseMs

  if (hold !== undefined) {
    const extended = Math.max(hold.expiresAt, expiresAt)
    if (countOf(hold, mode) > 0) {
      // Re-entry, or a copy of one already applied: the count becomes the requested one; a
      // reader's permits stay those of its first shared grant.
      const next: Hold = mode === "exclusive"
        ? { ...hold, exclusive: request.count, expiresAt: extended }
        : { ...hold, shared: request.count, expiresAt: extended }
      return done(dequeue(replaceHold(key, next), holder), Either.right(granted(hold.fence, request.count)))
    }
    if (mode === "exclusive") {
      return done(key, Either.left(new LockUpgradeNotSupported({ key: request.key, holder })))
    }
    // A writer taking the read lock (downgrade): the queue does not apply to a current holder.
    const check = modeCheck(key, request)
    if (!check.allowed) {
      return done(key, Either.right(denied(check.blocking, [], now)))
    }
    const next: Hold = { ...hold, shared: request.count, permits: request.permits, expiresAt: extended }
    return done(
      { ...dequeue(replaceHold(key, next), holder), limit: request.limit },
      Either.right(granted(hold.fence, request.count))
    )
  }

  // Not a holder: a re-entry into a hold that is gone, or a late copy from a holder that ended.
  if (request.count > 1 || hasEnded(key, holder, now) || hasEnded(key, endedUnheld(holder), now)) {
    return done(key, Either.left(new NotHeld({ key: request.key, holder })))
  }

  // A new grant: the mode rules, then (if fair) the queue.
  const check = modeCheck(key, request)
  const waitersAhead = request.fair ? aheadOf(key, holder) : []
  if (check.allowed && waitersAhead.length === 0) {
    const fenced = issueFence(key, now, request.leaseMs)
    const next: Hold = {
      holder,
      exclusive: mode === "exclusive" ? 1 : 0,
      shared: mode === "shared" ? 1 : 0,
      permits: mode === "shared" ? request.permits : 0,
      fence: fenced.fence,
      expiresAt
    }
    return done(
      {
        ...dequeue(fenced, holder),
        limit: mode === "shared" ? request.limit : key.limit,
        holders: [...key.holders, next]
      },
      Either.right(granted(fenced.fence, 1))
    )
  }
  const result = denied(check.allowed ? [] : check.blocking, waitersAhead, now)
  return done(request.fair ? enqueue(key, holder, now + request.waiterTtlMs) : key, Either.right(result))
}

/**
 * Whether the mode rules let `request.holder` take the key in `request.mode`, ignoring its own
 * holds, and if not, which live holds of others keep it out.
 */
const modeCheck = (
  key: Key,
  request: AcquireRequest
): { readonly allowed: boolean; readonly blocking: ReadonlyArray<Hold> } => {
  const others = key.holders.filter((h) => h.holder !== request.holder)
  if (request.mode === "exclusive") {
    // A writer needs the key to itself.
    return { allowed: others.length === 0, blocking: others }
  }
  const writers = others.filter((h) => h.exclusive > 0)
  if (writers.length > 0) {
    return { allowed: false, blocking: writers }
  }
  // Readers and semaphore holders share the key up to the limit.
  const readers = others.filter((h) => h.shared > 0)
  const taken = readers.reduce((sum, h) => sum + h.permits, 0)
  if (taken + request.permits <= request.limit) {
    return { allowed: true, blocking: [] }
  }
  return { allowed: false, blocking: readers }
}

/** `retryAfterMs`: until the earliest blocking hold or queue entry expires, at least 1. */
const denied = (holds: ReadonlyArray<Hold>, waiters: ReadonlyArray<Waiter>, now: number): AcquireResult => {
  const expiries = [...holds.map((h) => h.expiresAt), ...waiters.map((w) => w.expiresAt)]
  // Nothing blocks only for requests the API never sends (permits > limit): retry soon.
  const earliest = expiries.length === 0 ? now + 1 : Math.min(...expiries)
  return { _tag: "Denied", retryAfterMs: Math.max(1, earliest - now) }
}

/**
 * Releases one hold of `holder` in `mode`: its count for that mode goes from `request.count` to
 * `request.count - 1` (a lower count is a copy of a release already applied, and stays); at 0 for
 * both modes the holder is removed and remembered as ended. Succeeds with the remaining count for
 * that mode; a holder that holds nothing gets `NotHeld` (unless it just ended: a copy of its last
 * release succeeds with 0).
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const { result } = Rules.release(
 *   Rules.empty,
 *   { key: "k", holder: "c:1", mode: "exclusive", count: 1, leaseMs: 1000 },
 *   0
 * )
 * // result: Either.left(NotHeld)
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const release = (
  state: State,
  request: ReleaseRequest,
  now: number
): Step<Either.Either<number, NotHeld>> => {
  const key = liveKey(state, request.key, now)
  const hold = findHold(key, request.holder)
  const ended = now + request.leaseMs
  if (hold === undefined) {
    // A copy of a last release succeeds again; otherwise NotHeld (and a copy of that answers
    // NotHeld again). Either way the holder is remembered as ended, so a late copy of its
    // acquisition grants nothing.
    const released = hasEnded(key, request.holder, now)
    return {
      state: setKey(state, request.key, remember(key, released ? request.holder : endedUnheld(request.holder), ended)),
      result: released ? Either.right(0) : Either.left(new NotHeld({ key: request.key, holder: request.holder }))
    }
  }
  const current = countOf(hold, request.mode)
  // A count below the caller's: a copy of a release already applied changes nothing.
  const remaining = current >= request.count ? request.count - 1 : current
  const next: Hold = request.mode === "exclusive"
    ? { ...hold, exclusive: remaining }
    : { ...hold, shared: remaining, permits: remaining === 0 ? 0 : hold.permits }
  const nextKey = next.exclusive === 0 && next.shared === 0
    ? remember(removeHolder(key, request.holder), request.holder, ended)
    : replaceHold(key, next)
  return { state: setKey(state, request.key, nextKey), result: Either.right(remaining) }
}

/**
 * Renews leases, in order: each holder that still holds its key gets its expiry extended to at
 * least now + lease (`true`); the others get `false`.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const { result } = Rules.renew(Rules.empty, [{ key: "k", holder: "c:1", leaseMs: 100 }], 0)
 * // result: [Either.right(false)]
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const renew = (
  state: State,
  requests: ReadonlyArray<RenewRequest>,
  now: number
): Step<ReadonlyArray<RenewResult>> => {
  let current = state
  const results: Array<RenewResult> = []
  for (const request of requests) {
    const key = liveKey(current, request.key, now)
    const hold = findHold(key, request.holder)
    if (hold === undefined) {
      current = setKey(current, request.key, key)
      results.push(Either.right(false))
    } else {
      const next = { ...hold, expiresAt: Math.max(hold.expiresAt, now + request.leaseMs) }
      current = setKey(current, request.key, replaceHold(key, next))
      results.push(Either.right(true))
    }
  }
  return { state: current, result: results }
}

/**
 * Reports the live state of a key, in the shape of `LockBackend.inspect`.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const { result } = Rules.inspect(Rules.empty, "k", 0)
 * // result: { key: "k", fence: 0, limit: undefined, holders: [], queue: [] }
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const inspect = (state: State, key: string, now: number): Step<KeyState> => {
  const live = liveKey(state, key, now)
  return {
    state: setKey(state, key, live),
    result: {
      key,
      fence: isLive(live.fenceUntil, now) ? live.fence : 0,
      limit: live.limit,
      holders: live.holders.map((h) => ({
        holder: h.holder,
        exclusive: h.exclusive,
        shared: h.shared,
        permits: h.permits,
        fence: h.fence,
        ttlMs: h.expiresAt - now
      })),
      queue: live.queue.map((w) => ({ holder: w.holder, ttlMs: w.expiresAt - now }))
    }
  }
}

/**
 * The id under which a holder whose release was answered `NotHeld` is remembered in `Key.ended`
 * (beside the holder's own id, remembered when its last hold ended). A backend that keeps ended
 * holders apart from the key looks up these two ids for an acquire or a release.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const ids = ["c:1", Rules.endedUnheld("c:1")]
 * ```
 *
 * @since 0.1.0
 * @category ended holders
 */
export const endedUnheld = (holder: string): string => `!${holder}`

/**
 * The ids under which an applied `forceRelease` is remembered in `Key.ended`: when it found the
 * key held, and when it found it free. A backend that keeps ended holders apart from the key looks
 * up these for a forced release.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const [whenHeld, whenFree] = Rules.forceReleaseIds({ key: "k", id: "op-1" })
 * ```
 *
 * @since 0.1.0
 * @category ended holders
 */
export const forceReleaseIds = (request: ForceReleaseRequest): readonly [string, string] => [
  `force|1|${request.id}`,
  `force|0|${request.id}`
]

/**
 * Drops every live holder of the key (its queue and fence stay) and remembers them as ended until
 * their holds would have expired; `true` if anything was held. A second delivery of the same `id`
 * (within `forceReleaseMemoryMs`) changes nothing and answers as the first.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const { result } = Rules.forceRelease(Rules.empty, { key: "k", id: "op-1" }, 0)
 * // result: false
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const forceRelease = (state: State, request: ForceReleaseRequest, now: number): Step<boolean> => {
  const live = liveKey(state, request.key, now)
  const [appliedHeld, appliedFree] = forceReleaseIds(request)
  // a copy answers as the first delivery did
  if (hasEnded(live, appliedHeld, now)) return { state: setKey(state, request.key, live), result: true }
  if (hasEnded(live, appliedFree, now)) return { state: setKey(state, request.key, live), result: false }
  const held = live.holders.length > 0
  const forgotten = live.holders.reduce((key, h) => remember(key, h.holder, h.expiresAt), live)
  return {
    state: setKey(state, request.key, remember({ ...forgotten, holders: [] }, held ? appliedHeld : appliedFree, now + forceReleaseMemoryMs)),
    result: held
  }
}

/**
 * Raises the key's last fence to at least `fence`, remembered until `max(now + lease, fence /
 * 1000 + 1)`, as a grant's fence is: every later fence is above it. A lower fence changes nothing.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const { state } = Rules.raiseFence(Rules.empty, { key: "k", fence: 5_000, leaseMs: 1000 }, 0)
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const raiseFence = (state: State, request: RaiseFenceRequest, now: number): Step<void> => {
  const live = liveKey(state, request.key, now)
  if (request.fence <= live.fence) return { state: setKey(state, request.key, live), result: undefined }
  const raised = { ...live, fence: request.fence, fenceUntil: fenceRememberedUntil(live.fenceUntil, request.fence, now, request.leaseMs) }
  return { state: setKey(state, request.key, raised), result: undefined }
}

/**
 * Removes `holder` from the key's queue (a waiter giving up) and, unless it holds the key,
 * remembers it as ended for `leaseMs`.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const { state } = Rules.cancel(Rules.empty, { key: "k", holder: "c:1", leaseMs: 1000 }, 0)
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const cancel = (state: State, request: CancelRequest, now: number): Step<void> => {
  const live = dequeue(liveKey(state, request.key, now), request.holder)
  const next = findHold(live, request.holder) === undefined ? remember(live, request.holder, now + request.leaseMs) : live
  return { state: setKey(state, request.key, next), result: undefined }
}

/**
 * A latch's state: its count, and the ids of the calls applied to it -> until when they are
 * remembered (a copy of a remembered call changes nothing).
 *
 * @example
 * ```ts
 * import type { Rules } from "@lockstep/core"
 *
 * const latch: Rules.Latch = { count: 2, applied: new Map([["c:1", 60_000]]) }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Latch {
  readonly count: number
  readonly applied: ReadonlyMap<string, number>
}

const emptyLatch: Latch = { count: 0, applied: new Map() }

/** The latch with the calls it no longer remembers dropped. */
const liveLatch = (state: State, key: string, now: number): Latch => {
  const latch = state.latches.get(key) ?? emptyLatch
  const applied = new Map([...latch.applied].filter(([, until]) => now < until))
  return { count: latch.count, applied }
}

const setLatch = (state: State, key: string, latch: Latch): State => {
  const latches = new Map(state.latches)
  if (latch.count === 0 && latch.applied.size === 0) latches.delete(key)
  else latches.set(key, latch)
  return { ...state, latches }
}

const applying = (latch: Latch, id: string, count: number, now: number): Latch => ({
  count,
  applied: new Map([...latch.applied, [id, now + latchCallMemoryMs]])
})

/**
 * A latch call: refused on a key a lock holds; otherwise `f` gets the live latch and returns the
 * next one with the call's result.
 */
const onLatch = <A>(
  state: State,
  key: string,
  now: number,
  f: (latch: Latch) => readonly [Latch, A]
): Step<Either.Either<A, InvalidLockOptions>> => {
  if (liveKey(state, key, now).holders.length > 0) {
    return { state, result: Either.left(notALatch(key)) }
  }
  const [next, result] = f(liveLatch(state, key, now))
  return { state: setLatch(state, key, next), result: Either.right(result) }
}

/**
 * `latchSetCount`: sets the count if it is 0; `true` if it did (or a copy of a call that did).
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const step = Rules.latchSetCount(Rules.empty, { key: "l", id: "c:1", count: 2 }, 0)
 * console.log(step.result) // { _id: "Either", _tag: "Right", right: true }
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const latchSetCount = (
  state: State,
  request: SetCountRequest,
  now: number
): Step<Either.Either<boolean, InvalidLockOptions>> =>
  onLatch(state, request.key, now, (latch) =>
    latch.applied.has(request.id)
      ? [latch, true]
      : latch.count > 0
      ? [latch, false]
      : [applying(latch, request.id, request.count, now), true])

/**
 * `latchCountDown`: one off the count (not below 0); the count after. A copy of an applied call
 * changes nothing and answers the count.
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * const step = Rules.latchCountDown(Rules.empty, { key: "l", id: "c:2" }, 0)
 * console.log(step.result) // { _id: "Either", _tag: "Right", right: 0 }
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const latchCountDown = (
  state: State,
  request: LatchRequest,
  now: number
): Step<Either.Either<number, InvalidLockOptions>> =>
  onLatch(state, request.key, now, (latch) => {
    if (latch.applied.has(request.id) || latch.count === 0) return [latch, latch.count]
    return [applying(latch, request.id, latch.count - 1, now), latch.count - 1]
  })

/**
 * `latchCount`: the count (0 when never set or counted down).
 *
 * @example
 * ```ts
 * import { Rules } from "@lockstep/core"
 *
 * console.log(Rules.latchCount(Rules.empty, "l", 0).result) // { _id: "Either", _tag: "Right", right: 0 }
 * ```
 *
 * @since 0.1.0
 * @category operations
 */
export const latchCount = (state: State, key: string, now: number): Step<Either.Either<number, InvalidLockOptions>> =>
  onLatch(state, key, now, (latch) => [latch, latch.count])
