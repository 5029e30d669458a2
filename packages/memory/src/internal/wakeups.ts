/**
 * Subscriptions and wake-ups: the waiters of each key (and of each latch), the signal each one's
 * fibers await, and whom a change of a key wakes. A lock's change wakes as few waiters as can
 * win (see `wakeNext`); a latch's wakes them all.
 */
import type { Scope } from "effect"
import { Effect, Exit } from "effect"
import type { Lifecycle, WaiterSignal } from "@lockstep/core/BackendKit"
import type * as LockBackend from "@lockstep/core/LockBackend"
import type * as LockError from "@lockstep/core/LockError"
import type { MemoryState } from "./state.js"

/** One subscription: a holder waiting on a key (or a latch), and the signal its fibers await. */
export class Subscriber {
  readonly key: string
  readonly holder: string
  readonly mode: LockBackend.HoldMode
  /**
   * Pending while a wake-up was delivered and the subscriber's fiber has not yet resumed with it
   * (see `BackendKit.WaiterSignal`): a wake-up pending there is on its way, so the next goes to
   * another subscriber.
   */
  readonly signal: WaiterSignal
  /** A wake-up was taken and no attempt of the holder has used it yet. */
  woken = false
  /** What the holder's last attempt asked for (shared): how many permits, of what limit. */
  permits = 1
  limit: number | undefined = undefined

  constructor(lifecycle: Lifecycle, key: string, holder: string, mode: LockBackend.HoldMode) {
    this.key = key
    this.holder = holder
    this.mode = mode
    this.signal = lifecycle.waiterSignal(() => {
      this.woken = true
    })
  }
}

/** The subscribers of each key, in arrival order (a `Set` iterates in insertion order). */
export type Subscribers = Map<string, Set<Subscriber>>

/**
 * Wakes ONE subscriber of the key without a pending wake-up, preferring the fair-queue head's
 * subscriber; for a shared waiter, every shared waiter the freed permits fit. `except` skips a
 * holder that needs no wake-up (the one just granted, or one leaving).
 */
export const wakeNext = (state: MemoryState, key: string, except?: string): void => {
  const subscribers = state.subscriptions.get(key)
  if (subscribers === undefined) return
  const data = state.keys.get(key)
  const head = data?.queue[0]?.holder
  let chosen: Subscriber | undefined
  for (const subscriber of subscribers) {
    if (subscriber.signal.pending() || subscriber.holder === except) continue
    if (subscriber.holder === head) {
      chosen = subscriber
      break
    }
    chosen ??= subscriber
    if (head === undefined) break
  }
  if (chosen === undefined) return
  if (chosen.mode !== "shared") return chosen.signal.wake()
  // freed permits may fit several shared waiters, and a denied one would not pass the wake-up
  // on: wake those they fit, less what the waiters already woken (and yet to try) will take
  const limit = chosen.limit ?? data?.limit ?? Infinity
  let room = limit
  if (data !== undefined) for (const hold of data.holders.values()) if (hold.shared > 0) room -= hold.permits
  for (const subscriber of subscribers) {
    if (subscriber.mode === "shared" && (subscriber.signal.pending() || subscriber.woken) && subscriber.holder !== except) {
      room -= subscriber.permits
    }
  }
  for (const subscriber of [chosen, ...subscribers]) {
    if (room <= 0) return
    if (subscriber.signal.pending() || subscriber.mode !== "shared" || subscriber.holder === except || subscriber.permits > room) {
      continue
    }
    subscriber.signal.wake()
    room -= subscriber.permits
  }
}

/** Wakes every subscriber in `subscribers`. */
export const wakeAll = (subscribers: Set<Subscriber> | undefined): void => {
  if (subscribers !== undefined) for (const subscriber of subscribers) subscriber.signal.wake()
}

/**
 * Notes an attempt of `request.holder`: the wake-up it was woken for is used (it no longer needs
 * handing on), and what it asked for is what a later wake-up must find room for.
 */
export const noteAttempt = (state: MemoryState, request: LockBackend.AcquireRequest): void => {
  const subscribers = state.subscriptions.get(request.key)
  if (subscribers === undefined) return
  for (const subscriber of subscribers) {
    if (subscriber.holder !== request.holder) continue
    subscriber.woken = false
    subscriber.permits = request.permits
    subscriber.limit = request.limit
  }
}

/**
 * A subscription in `table` (locks' or latches'), failing as `operation` when the backend is
 * closed. When its scope ends it leaves the table, its awaiting fibers resume, then `onClose` runs.
 */
export const subscribeIn = (
  state: MemoryState,
  table: Subscribers,
  operation: string,
  key: string,
  holder: string,
  mode: LockBackend.HoldMode,
  onClose: (state: MemoryState, exit: Exit.Exit<unknown, unknown>, subscriber: Subscriber) => void
): Effect.Effect<LockBackend.Subscription, LockError.BackendError, Scope.Scope> =>
  Effect.acquireRelease(
    state.lifecycle.whileOpen(
      operation,
      Effect.sync(() => {
        const subscriber = new Subscriber(state.lifecycle, key, holder, mode)
        let subscribers = table.get(key)
        if (subscribers === undefined) {
          subscribers = new Set()
          table.set(key, subscribers)
        }
        subscribers.add(subscriber)
        return subscriber
      })
    ),
    (subscriber, exit) =>
      Effect.sync(() => {
        const subscribers = table.get(key)
        subscribers?.delete(subscriber)
        if (subscribers?.size === 0) table.delete(key)
        // Never leave a fiber blocked on a closed subscription.
        subscriber.signal.close()
        onClose(state, exit, subscriber)
      })
  ).pipe(Effect.map((subscriber) => subscriber.signal.subscription))

/**
 * A lock waiter that gives up with a wake-up it did not use (still pending, or taken by no
 * attempt since) hands it on so it is not lost. Handing on more would wake a waiter per failed
 * waiter: a chain that, under failures, feeds itself.
 */
export const handOnUnused = (state: MemoryState, exit: Exit.Exit<unknown, unknown>, subscriber: Subscriber): void => {
  if (Exit.isFailure(exit) && (subscriber.signal.pending() || subscriber.woken)) wakeNext(state, subscriber.key)
}
