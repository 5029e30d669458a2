import type { Scope } from "effect"
import { Clock, Context, Effect, Either, Exit } from "effect"
import { constVoid } from "effect/Function"
import * as LockBackend from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"
import * as Rules from "@lockstep/core/Rules"
import { makeRemembered, type Remembered } from "./remembered.js"

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

/**
 * A key's state. It exists while the key has holders or queue entries, and after that for as long
 * as it remembers ended holders or a fence it must not reissue.
 */
interface KeyData {
  readonly holders: Map<string, Hold>
  /** The shared limit, defined while some holder holds the key in shared mode. */
  limit: number | undefined
  queue: Array<Waiter>
  /**
   * Holders that ended (and `Rules.forceReleaseIds` of applied forced releases), until a time each:
   * late copies of their operations change nothing and answer as the first did.
   */
  readonly ended: Remembered
  /**
   * Holders whose release was answered NotHeld (`Rules.endedUnheld`'s entries, kept apart under the
   * holder's own id), until a time each; made when the first is (rare: every acquisition of a new
   * holder would otherwise look for it in a second table).
   */
  notHeld: Remembered | undefined
  /** The last fence issued, and until when it must be remembered (0 once it may be forgotten). */
  fence: number
  fenceUntil: number
}

interface Sub {
  readonly key: string
  readonly holder: string
  readonly mode: LockBackend.HoldMode
  /** A wake-up was delivered and the subscriber has not yet consumed it. */
  signalled: boolean
  /** A wake-up was consumed and no attempt of the holder has used it yet. */
  woken: boolean
  /** What the holder's last attempt asked for (shared): how many permits, of what limit. */
  permits: number
  limit: number | undefined
  closed: boolean
  /** Fibers currently suspended in `await`. */
  readonly resumers: Set<() => void>
}

/** A latch's count, and the ids of the calls applied to it, until a time each. */
interface Latch {
  count: number
  readonly applied: Remembered
}

type AcquireOutcome =
  | LockBackend.AcquireResult
  | LockError.InvalidLockOptions
  | LockError.LockUpgradeNotSupported
  | LockError.NotHeld

/** Sizes of the backend's internal maps; used by tests to check nothing leaks. */
export interface Sizes {
  readonly keys: number
  readonly subscribedKeys: number
  readonly subscriptions: number
  /** Keys that remember a fence. */
  readonly fences: number
  /** Remembered ended holders and forced releases, over all keys. */
  readonly ended: number
}

/** @internal */
export interface MemoryBackendInternal {
  readonly service: LockBackend.Service
  readonly close: () => void
  readonly sizes: () => Sizes
}

/** Every this many operations, idle keys of the whole backend are swept. */
const sweepEvery = 1024

/** @internal */
export const unsafeMake = (clientId: string): MemoryBackendInternal => {
  const keys = new Map<string, KeyData>()
  // Per key, in arrival order (Set iteration order is insertion order).
  const subscriptions = new Map<string, Set<Sub>>()
  const latches = new Map<string, Latch>()
  const latchSubscriptions = new Map<string, Set<Sub>>()
  let operations = 0
  /** Set once the layer that made the backend ended: every call fails, nothing is kept. */
  let closed = false

  // All operations read time synchronously from Effect's Clock and apply their whole state
  // transition in one synchronous block: JS is single-threaded, so each operation is atomic.
  const atomically = <A, E>(
    operation: string,
    f: (now: number) => Effect.Effect<A, E>
  ): Effect.Effect<A, E | LockError.BackendError> =>
    // monotonic: a wall-clock step must not expire leases early
    Effect.withFiberRuntime((fiber): Effect.Effect<A, E | LockError.BackendError> => {
      if (closed) return Effect.fail(LockError.backendClosed({ operation, backend: "memory backend" }))
      const now = Number(Context.get(fiber.currentDefaultServices, Clock.Clock).unsafeCurrentTimeNanos()) / 1_000_000
      if (++operations % sweepEvery === 0) sweep(now)
      return f(now)
    })

  /** Drops expired holders and queue entries; `true` if a holder or waiter was dropped. */
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
    // a new queue only when an entry expired: this runs on every operation on the key
    for (const waiter of data.queue) {
      if (waiter.expiresAt <= now) {
        data.queue = data.queue.filter((w) => w.expiresAt > now)
        dropped = true
        break
      }
    }
    data.ended.forget(now)
    data.notHeld?.forget(now)
    return dropped
  }

  /** Whether `id` ended (or a forced release `id` was applied) recently enough to be remembered. */
  const hasEnded = (data: KeyData | undefined, id: string, now: number): boolean =>
    data?.ended.has(id, now) === true

  /** Forgets the limit once no shared holder is left, and the whole key once nothing of it is needed. */
  const tidy = (key: string, now: number): void => {
    const data = keys.get(key)
    if (data === undefined) return
    if (
      data.holders.size === 0 && data.queue.length === 0 && data.ended.size() === 0 &&
      (data.notHeld === undefined || data.notHeld.size() === 0) && data.fenceUntil <= now
    ) {
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

  /** Collects keys nobody touched since their holds and memories expired. */
  const sweep = (now: number): void => {
    for (const key of [...keys.keys()]) {
      if (prune(key, now)) wake(key)
      tidy(key, now)
    }
  }

  const keyData = (key: string): KeyData => {
    let data = keys.get(key)
    if (data === undefined) {
      data = { holders: new Map(), limit: undefined, queue: [], ended: makeRemembered(), notHeld: undefined, fence: 0, fenceUntil: 0 }
      keys.set(key, data)
    }
    return data
  }

  /**
   * Greater than every fence issued on the key, and never below the clock in microseconds. The
   * fence is remembered for a lease, and until the clock has passed it: a grant after that starts
   * from the clock and still issues a greater one.
   */
  const nextFence = (data: KeyData, now: number, leaseMs: number): number => {
    data.fence = Rules.nextFence(data.fence, now)
    data.fenceUntil = Rules.fenceRememberedUntil(data.fenceUntil, data.fence, now, leaseMs)
    return data.fence
  }

  /** Whether `holder`'s release was answered NotHeld recently enough to be remembered. */
  const wasNotHeld = (data: KeyData | undefined, holder: string, now: number): boolean =>
    data?.notHeld !== undefined && data.notHeld.has(holder, now)

  /** Remembers that `holder`'s release was answered NotHeld. */
  const rememberNotHeld = (data: KeyData, holder: string, until: number): void => {
    data.notHeld ??= makeRemembered()
    data.notHeld.set(holder, until)
  }
  /** Remembers that `id` ended, so late copies of its operations change nothing. */
  const remember = (data: KeyData, id: string, until: number): void => {
    data.ended.set(id, until)
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
    if (chosen.mode !== "shared") return signal(chosen)
    // freed permits may fit several shared waiters, and a denied one would not pass the wake-up
    // on: wake those they fit, less what the waiters already woken (and yet to try) will take
    const data = keys.get(key)
    const limit = chosen.limit ?? data?.limit ?? Infinity
    let room = limit
    if (data !== undefined) for (const hold of data.holders.values()) if (hold.shared > 0) room -= hold.permits
    for (const sub of subs) {
      if (sub.mode === "shared" && (sub.signalled || sub.woken) && sub.holder !== except) room -= sub.permits
    }
    for (const sub of [chosen, ...subs]) {
      if (room <= 0) return
      if (sub.signalled || sub.mode !== "shared" || sub.holder === except || sub.permits > room) continue
      signal(sub)
      room -= sub.permits
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

  /** Live holds of others that keep `request` out by the mode rules. */
  const blockersOf = (data: KeyData | undefined, request: LockBackend.AcquireRequest): Array<Hold> => {
    const blockers: Array<Hold> = []
    if (data === undefined) return blockers
    if (request.mode === "exclusive") {
      for (const [other, hold] of data.holders) if (other !== request.holder) blockers.push(hold)
      return blockers
    }
    const sharedHolds: Array<Hold> = []
    let used = 0
    for (const [other, hold] of data.holders) {
      if (other === request.holder) continue
      if (hold.exclusive > 0) blockers.push(hold)
      if (hold.shared > 0) {
        used += hold.permits
        sharedHolds.push(hold)
      }
    }
    // Any shared holder leaving may free enough permits.
    if (used + request.permits > request.limit) blockers.push(...sharedHolds)
    return blockers
  }

  const acquireOnce = (request: LockBackend.AcquireRequest, now: number): AcquireOutcome => {
    const { holder, key, limit, mode, permits } = request
    const data = keys.get(key)
    if (mode === "shared") {
      if (data?.limit !== undefined && data.limit !== limit) {
        return Rules.limitMismatch(key, data.limit, limit)
      }
      if (permits > limit) {
        // Could never be granted: report it instead of letting the caller wait forever.
        return Rules.permitsExceedLimit(key, permits, limit)
      }
    }
    const own = data?.holders.get(holder)
    if (data !== undefined && own !== undefined) {
      const count = mode === "exclusive" ? own.exclusive : own.shared
      if (count > 0) {
        // Re-entry, or a copy of one already applied: the count becomes the requested one.
        if (mode === "exclusive") own.exclusive = request.count
        else own.shared = request.count
        extend(own, now, request.leaseMs)
        removeFromQueue(data, holder)
        return { _tag: "Granted", fence: own.fence, count: request.count }
      }
      if (mode === "exclusive") return new LockError.LockUpgradeNotSupported({ key, holder })
      // A writer taking the read lock: a current holder skips the queue, which would deadlock.
      const blockers = blockersOf(data, request)
      if (blockers.length > 0) return deny(request, now, blockers, [], false)
      own.shared = request.count
      own.permits = permits
      data.limit = limit
      extend(own, now, request.leaseMs)
      removeFromQueue(data, holder)
      return { _tag: "Granted", fence: own.fence, count: request.count }
    }
    // Not a holder: a re-entry whose hold is gone, or a late copy from a holder that ended.
    if (request.count > 1 || hasEnded(data, holder, now) || wasNotHeld(data, holder, now)) {
      return new LockError.NotHeld({ key, holder })
    }
    const blockers = blockersOf(data, request)
    const ahead = request.fair ? queueAhead(data, holder) : []
    if (blockers.length > 0 || ahead.length > 0) return deny(request, now, blockers, ahead, request.fair)
    const granted = keyData(key)
    const fence = nextFence(granted, now, request.leaseMs)
    granted.holders.set(holder, {
      exclusive: mode === "exclusive" ? 1 : 0,
      shared: mode === "shared" ? 1 : 0,
      permits: mode === "shared" ? permits : 0,
      fence,
      expiresAt: now + request.leaseMs
    })
    if (mode === "shared") granted.limit = limit
    removeFromQueue(granted, holder)
    return { _tag: "Granted", fence, count: 1 }
  }

  const acquire: LockBackend.Service["acquire"] = (request) =>
    atomically("acquire", (now) => {
      const dropped = prune(request.key, now)
      const outcome = acquireOnce(request, now)
      // this attempt is what a wake-up of the holder was for: it no longer needs handing on
      const subs = subscriptions.get(request.key)
      if (subs !== undefined) {
        for (const sub of subs) {
          if (sub.holder !== request.holder) continue
          sub.woken = false
          sub.permits = request.permits
          sub.limit = request.limit
        }
      }
      // A shared grant passes the wake-up on so several readers / permit takers can enter after
      // one release; the requester itself is awake already.
      const sharedGrant = request.mode === "shared" && outcome._tag === "Granted"
      if (dropped || sharedGrant) wake(request.key, request.holder)
      tidy(request.key, now)
      return outcome._tag === "Granted" || outcome._tag === "Denied" ? Effect.succeed(outcome) : Effect.fail(outcome)
    })

  const release: LockBackend.Service["release"] = ({ count, holder, key, leaseMs, mode }) =>
    atomically("release", (now) => {
      const dropped = prune(key, now)
      const data = keys.get(key)
      const hold = data?.holders.get(holder)
      let outcome: Effect.Effect<number, LockError.NotHeld>
      let woken = dropped
      if (data === undefined || hold === undefined) {
        // a copy of a last release succeeds again, a copy of a NotHeld answers NotHeld again; the
        // holder is remembered as ended either way, so a late copy of its acquisition grants nothing
        const released = hasEnded(data, holder, now)
        outcome = released ? Effect.succeed(0) : Effect.fail(new LockError.NotHeld({ key, holder }))
        if (released) remember(keyData(key), holder, now + leaseMs)
        else rememberNotHeld(keyData(key), holder, now + leaseMs)
      } else {
        const current = mode === "exclusive" ? hold.exclusive : hold.shared
        // a count below the caller's: a copy of a release already applied
        const remaining = current >= count ? count - 1 : current
        if (mode === "exclusive") hold.exclusive = remaining
        else hold.shared = remaining
        if (mode === "shared" && remaining === 0) hold.permits = 0
        if (current > 0 && remaining === 0) woken = true
        if (hold.exclusive === 0 && hold.shared === 0) {
          data.holders.delete(holder)
          remember(data, holder, now + leaseMs)
        }
        outcome = Effect.succeed(remaining)
      }
      if (woken) wake(key)
      tidy(key, now)
      return outcome
    })

  const renew: LockBackend.Service["renew"] = (requests) =>
    atomically("renew", (now) => {
      const touched = new Set<string>()
      const toWake = new Set<string>()
      const results = requests.map(({ holder, key, leaseMs }): LockBackend.RenewResult => {
        if (!touched.has(key)) {
          touched.add(key)
          if (prune(key, now)) toWake.add(key)
        }
        const hold = keys.get(key)?.holders.get(holder)
        if (hold === undefined) return Either.right(false)
        extend(hold, now, leaseMs)
        return Either.right(true)
      })
      for (const key of toWake) wake(key)
      for (const key of touched) tidy(key, now)
      return Effect.succeed(results)
    })

  const inspect: LockBackend.Service["inspect"] = (key) =>
    atomically("inspect", (now) => {
      if (prune(key, now)) wake(key)
      tidy(key, now)
      const data = keys.get(key)
      return Effect.succeed<LockBackend.KeyState>({
        key,
        fence: data !== undefined && data.fenceUntil > now ? data.fence : 0,
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

  const raiseFence: LockBackend.Service["raiseFence"] = ({ fence, key, leaseMs }) =>
    atomically("raiseFence", (now) => {
      const data = keyData(key)
      if (fence > data.fence) {
        data.fence = fence
        data.fenceUntil = Rules.fenceRememberedUntil(data.fenceUntil, fence, now, leaseMs)
      }
      return Effect.void
    })

  const forceRelease: LockBackend.Service["forceRelease"] = ({ id, key }) =>
    atomically("forceRelease", (now) => {
      const dropped = prune(key, now)
      const data = keys.get(key)
      // a copy answers as the first delivery did (after waking whoever an expiry let in)
      const [whenHeld, whenFree] = Rules.forceReleaseIds({ id, key })
      for (const [applied, answer] of [[whenHeld, true], [whenFree, false]] as const) {
        if (hasEnded(data, applied, now)) {
          if (dropped) wake(key)
          tidy(key, now)
          return Effect.succeed(answer)
        }
      }
      const target = keyData(key)
      const held = target.holders.size > 0
      // the dropped holders' late copies must not re-enter: remember them until they would have expired
      for (const [holder, hold] of target.holders) remember(target, holder, hold.expiresAt)
      target.holders.clear()
      remember(target, held ? whenHeld : whenFree, now + LockBackend.forceReleaseMemoryMs)
      if (dropped || held) wake(key)
      tidy(key, now)
      return Effect.succeed(held)
    })

  const cancel: LockBackend.Service["cancel"] = ({ holder, key, leaseMs }) =>
    atomically("cancel", (now) => {
      const dropped = prune(key, now)
      const data = keys.get(key)
      const headBefore = data?.queue[0]?.holder
      if (data !== undefined) removeFromQueue(data, holder)
      // a waiter that left must not be queued again by a late copy of one of its attempts
      if (data?.holders.has(holder) !== true) remember(keyData(key), holder, now + leaseMs)
      // The canceller is leaving, so it is not the one to wake.
      if (dropped || keys.get(key)?.queue[0]?.holder !== headBefore) wake(key, holder)
      tidy(key, now)
      return Effect.void
    })

  const consume = (sub: Sub) => {
    sub.woken ||= sub.signalled
    sub.signalled = false
  }

  const onSignal = (sub: Sub) => (wake: (resumed: Effect.Effect<void>) => void): () => void => {
    if (sub.signalled || sub.closed) {
      consume(sub)
      wake(Effect.void)
      return constVoid
    }
    // The signal is consumed only when the waiting fiber actually resumes; until then the
    // subscription counts as signalled, so a further wake-up goes to another subscriber.
    const resumer = () => wake(Effect.sync(() => consume(sub)))
    sub.resumers.add(resumer)
    return () => void sub.resumers.delete(resumer)
  }

  /** A subscription in `table` (locks' or latches'), closed with the scope; then `onClose` runs. */
  const subscribeIn = (
    table: Map<string, Set<Sub>>,
    key: string,
    holder: string,
    mode: LockBackend.HoldMode,
    onClose: (exit: Exit.Exit<unknown, unknown>, sub: Sub) => void
  ): Effect.Effect<LockBackend.Subscription, LockError.BackendError, Scope.Scope> =>
    Effect.acquireRelease(
      Effect.suspend(() => {
        if (closed) return Effect.fail(LockError.backendClosed({ operation: "subscribe", backend: "memory backend" }))
        const sub: Sub = {
          key,
          holder,
          mode,
          signalled: false,
          woken: false,
          permits: 1,
          limit: undefined,
          closed: false,
          resumers: new Set()
        }
        let subs = table.get(key)
        if (subs === undefined) {
          subs = new Set()
          table.set(key, subs)
        }
        subs.add(sub)
        return Effect.succeed(sub)
      }),
      (sub, exit) =>
        Effect.sync(() => {
          sub.closed = true
          const subs = table.get(key)
          subs?.delete(sub)
          if (subs?.size === 0) table.delete(key)
          // Never leave a fiber blocked on a closed subscription.
          for (const resume of sub.resumers) resume()
          sub.resumers.clear()
          onClose(exit, sub)
        })
    ).pipe(Effect.map((sub) => LockBackend.subscriptionOf(onSignal(sub))))

  const subscribe = (key: string, holder: string, mode: LockBackend.HoldMode) =>
    subscribeIn(subscriptions, key, holder, mode, (exit, sub) => {
      // A waiter that gives up with a wake-up it did not use (not consumed, or consumed by no
      // attempt since) hands it on so it is not lost. Handing on more would wake a waiter per
      // failed waiter: a chain that, under failures, feeds itself.
      if (Exit.isFailure(exit) && (sub.signalled || sub.woken)) wake(key)
    })

  /** The key's latch with the calls it no longer remembers dropped, or `undefined` (count 0, nothing remembered). */
  const liveLatch = (key: string, now: number): Latch | undefined => {
    const latch = latches.get(key)
    if (latch === undefined) return undefined
    latch.applied.forget(now)
    if (latch.count === 0 && latch.applied.size() === 0) {
      latches.delete(key)
      return undefined
    }
    return latch
  }

  const latchOf = (key: string): Latch => {
    let latch = latches.get(key)
    if (latch === undefined) {
      latch = { count: 0, applied: makeRemembered() }
      latches.set(key, latch)
    }
    return latch
  }

  /** A latch call on a key a lock holds (a live holder) is refused; it changes nothing of the lock. */
  const heldByLock = (key: string, now: number): LockError.InvalidLockOptions | undefined => {
    for (const hold of keys.get(key)?.holders.values() ?? []) {
      if (hold.expiresAt > now) {
        return Rules.notALatch(key)
      }
    }
    return undefined
  }

  /** Wakes every waiter of the latch. */
  const wakeLatch = (key: string): void => {
    for (const sub of latchSubscriptions.get(key) ?? []) signal(sub)
  }

  const latchSetCount: LockBackend.Service["latchSetCount"] = ({ count, id, key }) =>
    atomically("latchSetCount", (now) => {
      const refused = heldByLock(key, now)
      if (refused !== undefined) return Effect.fail(refused)
      const latch = liveLatch(key, now)
      if (latch?.applied.has(id, now) === true) return Effect.succeed(true)
      if (latch !== undefined && latch.count > 0) return Effect.succeed(false)
      const set = latchOf(key)
      set.count = count
      set.applied.set(id, now + LockBackend.latchCallMemoryMs)
      wakeLatch(key)
      return Effect.succeed(true)
    })

  const latchCountDown: LockBackend.Service["latchCountDown"] = ({ id, key }) =>
    atomically("latchCountDown", (now) => {
      const refused = heldByLock(key, now)
      if (refused !== undefined) return Effect.fail(refused)
      const latch = liveLatch(key, now)
      if (latch === undefined) return Effect.succeed(0)
      if (latch.applied.has(id, now) || latch.count === 0) return Effect.succeed(latch.count)
      latch.count--
      latch.applied.set(id, now + LockBackend.latchCallMemoryMs)
      if (latch.count === 0) wakeLatch(key)
      return Effect.succeed(latch.count)
    })

  const latchCount: LockBackend.Service["latchCount"] = (key) =>
    atomically("latchCount", (now) => {
      const refused = heldByLock(key, now)
      if (refused !== undefined) return Effect.fail(refused)
      return Effect.succeed(liveLatch(key, now)?.count ?? 0)
    })

  // every waiter of a latch is woken by the same signal: none has a wake-up to hand on
  const latchSubscribe: LockBackend.Service["latchSubscribe"] = (key, waiter) =>
    subscribeIn(latchSubscriptions, key, waiter, "shared", () => undefined)

  /** Ends the backend: later calls fail as closed, and waiters blocked in a subscription go on (to fail). */
  const close = (): void => {
    if (closed) return
    closed = true
    for (const table of [subscriptions, latchSubscriptions]) {
      for (const subs of table.values()) {
        for (const sub of subs) {
          sub.closed = true
          for (const resume of sub.resumers) resume()
          sub.resumers.clear()
        }
      }
      table.clear()
    }
    keys.clear()
    latches.clear()
  }

  return {
    close,
    service: {
      clientId,
      acquire,
      release,
      renew,
      inspect,
      forceRelease,
      raiseFence,
      cancel,
      subscribe,
      latchSetCount,
      latchCountDown,
      latchCount,
      latchSubscribe
    },
    sizes: () => {
      let subs = 0
      for (const set of subscriptions.values()) subs += set.size
      let fences = 0
      let ended = 0
      for (const data of keys.values()) {
        if (data.fence > 0) fences++
        ended += data.ended.size() + (data.notHeld?.size() ?? 0)
      }
      return { keys: keys.size, subscribedKeys: subscriptions.size, subscriptions: subs, fences, ended }
    }
  }
}
