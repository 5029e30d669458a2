import type { Clock, Scope } from "effect"
import { Effect, Exit } from "effect"
import type * as LockBackend from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"

/** One holder's holds on a key. A holder may hold both modes at once (after a downgrade). */
interface Hold {
  exclusive: number
  shared: number
  permits: number
  readonly fence: number
  expiresAt: number
}

interface Waiter {
  readonly holder: string
  expiresAt: number
}

/** Exists only while the key has holders or queue entries. */
interface KeyData {
  readonly holders: Map<string, Hold>
  /** The shared limit, defined while some holder holds the key in shared mode. */
  limit: number | undefined
  queue: Array<Waiter>
}

interface Sub {
  readonly key: string
  readonly holder: string
  readonly mode: LockBackend.HoldMode
  /** A wake-up was delivered and the subscriber has not yet consumed it. */
  signalled: boolean
  closed: boolean
  /** Fibers currently suspended in `await`. */
  readonly resumers: Set<() => void>
}

type AcquireOutcome = LockBackend.AcquireResult | LockError.InvalidLockOptions | LockError.LockUpgradeNotSupported

/** Sizes of the backend's internal maps; used by tests to check nothing leaks. */
export interface Sizes {
  readonly keys: number
  readonly subscribedKeys: number
  readonly subscriptions: number
  readonly fences: number
}

/** @internal */
export interface MemoryBackendInternal {
  readonly service: LockBackend.Service
  readonly sizes: () => Sizes
}

/** @internal */
export const unsafeMake = (clientId: string): MemoryBackendInternal => {
  const keys = new Map<string, KeyData>()
  // Fence counters outlive the key state so a fence is never reissued.
  const fences = new Map<string, number>()
  // Per key, in arrival order (Set iteration order is insertion order).
  const subscriptions = new Map<string, Set<Sub>>()

  // All operations read time synchronously from Effect's Clock and apply their whole state
  // transition in one synchronous block: JS is single-threaded, so each operation is atomic.
  const atomically = <A, E>(f: (now: number) => Effect.Effect<A, E>): Effect.Effect<A, E> =>
    // monotonic: a wall-clock step must not expire leases early
    Effect.clockWith((clock: Clock.Clock) => Effect.suspend(() => f(Number(clock.unsafeCurrentTimeNanos()) / 1_000_000)))

  /** Drops expired holders and queue entries; `true` if anything was dropped. */
  const prune = (key: string, now: number): boolean => {
    const data = keys.get(key)
    if (data === undefined) return false
    let dropped = false
    for (const [holder, hold] of data.holders) {
      if (hold.expiresAt <= now) {
        data.holders.delete(holder)
        dropped = true
      }
    }
    const queue = data.queue.filter((w) => w.expiresAt > now)
    if (queue.length !== data.queue.length) {
      data.queue = queue
      dropped = true
    }
    return dropped
  }

  /** Forgets the limit once no shared holder is left, and the whole key once it is empty. */
  const tidy = (key: string): void => {
    const data = keys.get(key)
    if (data === undefined) return
    if (data.holders.size === 0 && data.queue.length === 0) {
      keys.delete(key)
      return
    }
    let hasShared = false
    for (const hold of data.holders.values()) {
      if (hold.shared > 0) {
        hasShared = true
        break
      }
    }
    if (!hasShared) data.limit = undefined
  }

  const keyData = (key: string): KeyData => {
    let data = keys.get(key)
    if (data === undefined) {
      data = { holders: new Map(), limit: undefined, queue: [] }
      keys.set(key, data)
    }
    return data
  }

  const nextFence = (key: string): number => {
    const fence = (fences.get(key) ?? 0) + 1
    fences.set(key, fence)
    return fence
  }

  const signal = (sub: Sub): void => {
    sub.signalled = true
    const resumers = [...sub.resumers]
    sub.resumers.clear()
    for (const resume of resumers) resume()
  }

  /**
   * Signals ONE subscriber of the key that has no unconsumed signal, preferring the fair-queue
   * head's subscriber. `except` skips a holder that needs no wake-up (the one just granted).
   */
  const wake = (key: string, except?: string): void => {
    const subs = subscriptions.get(key)
    if (subs === undefined) return
    const head = keys.get(key)?.queue[0]?.holder
    let chosen: Sub | undefined
    for (const sub of subs) {
      if (sub.signalled || sub.holder === except) continue
      if (sub.holder === head) {
        chosen = sub
        break
      }
      chosen ??= sub
      if (head === undefined) break
    }
    if (chosen === undefined) return
    signal(chosen)
    // freed capacity may fit several shared waiters, and a denied one would not pass it on
    if (chosen.mode === "shared") {
      for (const sub of subs) if (!sub.signalled && sub.mode === "shared" && sub.holder !== except) signal(sub)
    }
  }

  const extend = (hold: Hold, now: number, leaseMs: number): void => {
    hold.expiresAt = Math.max(hold.expiresAt, now + leaseMs)
  }

  /** Queue entries ahead of `holder` (the whole queue when it is not queued). */
  const queueAhead = (data: KeyData | undefined, holder: string): ReadonlyArray<Waiter> => {
    if (data === undefined) return []
    const index = data.queue.findIndex((w) => w.holder === holder)
    return index === -1 ? data.queue : data.queue.slice(0, index)
  }

  const removeFromQueue = (data: KeyData, holder: string): void => {
    const index = data.queue.findIndex((w) => w.holder === holder)
    if (index !== -1) data.queue.splice(index, 1)
  }

  /** A denial; `queued` says whether it puts the holder in (or refreshes it in) the fair queue. */
  const deny = (
    request: LockBackend.AcquireRequest,
    now: number,
    blockers: ReadonlyArray<Hold>,
    ahead: ReadonlyArray<Waiter>,
    queued: boolean
  ): LockBackend.AcquireResult => {
    let earliest = Infinity
    for (const hold of blockers) earliest = Math.min(earliest, hold.expiresAt)
    for (const waiter of ahead) earliest = Math.min(earliest, waiter.expiresAt)
    if (queued) {
      const data = keyData(request.key)
      const entry = data.queue.find((w) => w.holder === request.holder)
      if (entry === undefined) data.queue.push({ holder: request.holder, expiresAt: now + request.waiterTtlMs })
      else entry.expiresAt = now + request.waiterTtlMs
    }
    // Denial always has a blocker, so `earliest` is finite; the guard keeps the result sane anyway.
    const retryAfterMs = Number.isFinite(earliest) ? Math.max(1, Math.ceil(earliest - now)) : 1
    return { _tag: "Denied", retryAfterMs }
  }

  const acquireExclusive = (request: LockBackend.AcquireRequest, now: number): AcquireOutcome => {
    const { holder, key } = request
    const data = keys.get(key)
    const own = data?.holders.get(holder)
    if (data !== undefined && own !== undefined) {
      if (own.exclusive === 0) return new LockError.LockUpgradeNotSupported({ key, holder })
      // Re-entry: never held back by the queue (the holder is not queued anyway).
      own.exclusive += 1
      extend(own, now, request.leaseMs)
      removeFromQueue(data, holder)
      return { _tag: "Granted", fence: own.fence, count: own.exclusive }
    }
    const blockers = data === undefined ? [] : [...data.holders.values()]
    const ahead = request.fair ? queueAhead(data, holder) : []
    if (blockers.length > 0 || ahead.length > 0) return deny(request, now, blockers, ahead, request.fair)
    const granted = keyData(key)
    const fence = nextFence(key)
    granted.holders.set(holder, { exclusive: 1, shared: 0, permits: 0, fence, expiresAt: now + request.leaseMs })
    removeFromQueue(granted, holder)
    return { _tag: "Granted", fence, count: 1 }
  }

  const acquireShared = (request: LockBackend.AcquireRequest, now: number): AcquireOutcome => {
    const { holder, key, limit, permits } = request
    const data = keys.get(key)
    if (data?.limit !== undefined && data.limit !== limit) {
      return new LockError.InvalidLockOptions({
        field: "limit",
        reason: `"${key}" is held with limit ${data.limit}, the request names limit ${limit}`
      })
    }
    if (permits > limit) {
      // Could never be granted: report it instead of letting the caller wait forever.
      return new LockError.InvalidLockOptions({
        field: "permits",
        reason: `${permits} permits exceed the limit ${limit} of "${key}"`
      })
    }
    const own = data?.holders.get(holder)
    if (data !== undefined && own !== undefined && own.shared > 0) {
      // Re-entry keeps the permits of the first shared grant.
      own.shared += 1
      extend(own, now, request.leaseMs)
      removeFromQueue(data, holder)
      return { _tag: "Granted", fence: own.fence, count: own.shared }
    }
    const blockers: Array<Hold> = []
    const sharedHolds: Array<Hold> = []
    let used = 0
    if (data !== undefined) {
      for (const [other, hold] of data.holders) {
        if (other === holder) continue
        if (hold.exclusive > 0) blockers.push(hold)
        if (hold.shared > 0) {
          used += hold.permits
          sharedHolds.push(hold)
        }
      }
    }
    // Any shared holder leaving may free enough permits.
    if (used + permits > limit) blockers.push(...sharedHolds)
    // A current holder (a writer downgrading) skips the queue: queuing behind waiters that wait for
    // its own write lock would deadlock.
    const queued = request.fair && own === undefined
    const ahead = queued ? queueAhead(data, holder) : []
    if (blockers.length > 0 || ahead.length > 0) return deny(request, now, blockers, ahead, queued)
    const granted = keyData(key)
    granted.limit = limit
    removeFromQueue(granted, holder)
    if (own !== undefined) {
      own.shared = 1
      own.permits = permits
      extend(own, now, request.leaseMs)
      return { _tag: "Granted", fence: own.fence, count: 1 }
    }
    const fence = nextFence(key)
    granted.holders.set(holder, { exclusive: 0, shared: 1, permits, fence, expiresAt: now + request.leaseMs })
    return { _tag: "Granted", fence, count: 1 }
  }

  const acquire: LockBackend.Service["acquire"] = (request) =>
    atomically((now) => {
      const dropped = prune(request.key, now)
      const outcome = request.mode === "exclusive" ? acquireExclusive(request, now) : acquireShared(request, now)
      // A shared grant passes the wake-up on so several readers / permit takers can enter after
      // one release; the requester itself is awake already.
      const sharedGrant = request.mode === "shared" && outcome._tag === "Granted"
      if (dropped || sharedGrant) wake(request.key, request.holder)
      tidy(request.key)
      return outcome._tag === "Granted" || outcome._tag === "Denied" ? Effect.succeed(outcome) : Effect.fail(outcome)
    })

  const release: LockBackend.Service["release"] = ({ holder, key, mode }) =>
    atomically((now) => {
      const dropped = prune(key, now)
      const data = keys.get(key)
      const hold = data?.holders.get(holder)
      const count = hold === undefined ? 0 : mode === "exclusive" ? hold.exclusive : hold.shared
      if (data === undefined || hold === undefined || count === 0) {
        if (dropped) wake(key)
        tidy(key)
        return Effect.fail(new LockError.NotHeld({ key, holder }))
      }
      const remaining = count - 1
      if (mode === "exclusive") hold.exclusive = remaining
      else hold.shared = remaining
      if (remaining === 0 && mode === "shared") hold.permits = 0
      if (hold.exclusive === 0 && hold.shared === 0) data.holders.delete(holder)
      if (dropped || remaining === 0) wake(key)
      tidy(key)
      return Effect.succeed(remaining)
    })

  const renew: LockBackend.Service["renew"] = (requests) =>
    atomically((now) => {
      const touched = new Set<string>()
      const toWake = new Set<string>()
      const results = requests.map(({ holder, key, leaseMs }) => {
        if (!touched.has(key)) {
          touched.add(key)
          if (prune(key, now)) toWake.add(key)
        }
        const hold = keys.get(key)?.holders.get(holder)
        if (hold === undefined) return false
        extend(hold, now, leaseMs)
        return true
      })
      for (const key of toWake) wake(key)
      for (const key of touched) tidy(key)
      return Effect.succeed(results)
    })

  const inspect: LockBackend.Service["inspect"] = (key) =>
    atomically((now) => {
      if (prune(key, now)) wake(key)
      tidy(key)
      const data = keys.get(key)
      return Effect.succeed<LockBackend.KeyState>({
        key,
        fence: fences.get(key) ?? 0,
        limit: data?.limit,
        holders: data === undefined ? [] : [...data.holders].map(([holder, hold]) => ({
          holder,
          exclusive: hold.exclusive,
          shared: hold.shared,
          permits: hold.permits,
          fence: hold.fence,
          ttlMs: hold.expiresAt - now
        })),
        queue: data === undefined ? [] : data.queue.map((w) => ({ holder: w.holder, ttlMs: w.expiresAt - now }))
      })
    })

  const forceRelease: LockBackend.Service["forceRelease"] = (key) =>
    atomically((now) => {
      const dropped = prune(key, now)
      const data = keys.get(key)
      const held = data !== undefined && data.holders.size > 0
      data?.holders.clear()
      if (dropped || held) wake(key)
      tidy(key)
      return Effect.succeed(held)
    })

  const cancel: LockBackend.Service["cancel"] = (key, holder) =>
    atomically((now) => {
      const dropped = prune(key, now)
      const data = keys.get(key)
      const headBefore = data?.queue[0]?.holder
      if (data !== undefined) removeFromQueue(data, holder)
      // The canceller is leaving, so it is not the one to wake.
      if (dropped || data?.queue[0]?.holder !== headBefore) wake(key, holder)
      tidy(key)
      return Effect.void
    })

  const unsubscribe = (sub: Sub, exit: Exit.Exit<unknown, unknown>): void => {
    sub.closed = true
    const subs = subscriptions.get(sub.key)
    subs?.delete(sub)
    if (subs?.size === 0) subscriptions.delete(sub.key)
    // Never leave a fiber blocked on a closed subscription.
    for (const resume of sub.resumers) resume()
    sub.resumers.clear()
    // A waiter that gives up may have been woken already: hand the wake-up on so it is not lost.
    if (Exit.isFailure(exit)) wake(sub.key)
  }

  const awaitSignal = (sub: Sub): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (sub.signalled || sub.closed) {
        sub.signalled = false
        return Effect.void
      }
      return Effect.async<void>((resume) => {
        // The signal is consumed only when this fiber actually resumes; until then the
        // subscription counts as signalled, so a further wake-up goes to another subscriber.
        const resumer = () => resume(Effect.sync(() => {
          sub.signalled = false
        }))
        sub.resumers.add(resumer)
        return Effect.sync(() => {
          sub.resumers.delete(resumer)
        })
      })
    })

  const subscribe = (
    key: string,
    holder: string,
    mode: LockBackend.HoldMode
  ): Effect.Effect<LockBackend.Subscription, never, Scope.Scope> =>
    Effect.acquireRelease(
      Effect.sync(() => {
        const sub: Sub = { key, holder, mode, signalled: false, closed: false, resumers: new Set() }
        let subs = subscriptions.get(key)
        if (subs === undefined) {
          subs = new Set()
          subscriptions.set(key, subs)
        }
        subs.add(sub)
        return sub
      }),
      (sub, exit) => Effect.sync(() => unsubscribe(sub, exit))
    ).pipe(Effect.map((sub): LockBackend.Subscription => ({ await: awaitSignal(sub) })))

  return {
    service: { clientId, acquire, release, renew, inspect, forceRelease, cancel, subscribe },
    sizes: () => {
      let subs = 0
      for (const set of subscriptions.values()) subs += set.size
      return { keys: keys.size, subscribedKeys: subscriptions.size, subscriptions: subs, fences: fences.size }
    }
  }
}
