/**
 * The memory backend assembled: its state (state.ts), the lock operations (locks.ts, judged by
 * acquisition.ts on the key state of keys.ts), the latches (latches.ts) and the subscriptions
 * that wake their waiters (wakeups.ts).
 */
import type * as LockBackend from "@lockstep/core/LockBackend"
import * as latches from "./latches.js"
import * as locks from "./locks.js"
import { makeState, type MemoryState } from "./state.js"

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

/**
 * Ends the backend: later calls fail as closed, waiters blocked in a subscription go on (to
 * fail), and the state is dropped.
 */
const close = (state: MemoryState): void => {
  if (state.lifecycle.isClosed()) return
  // closes the signal of every open subscription, locks' and latches'
  state.lifecycle.close()
  state.subscriptions.clear()
  state.latchSubscriptions.clear()
  state.keys.clear()
  state.latches.clear()
}

const sizesOf = (state: MemoryState): Sizes => {
  let subscriptions = 0
  for (const set of state.subscriptions.values()) subscriptions += set.size
  let fences = 0
  let ended = 0
  for (const data of state.keys.values()) {
    if (data.fence > 0) fences++
    ended += data.ended.size() + (data.notHeld?.size() ?? 0)
  }
  return { keys: state.keys.size, subscribedKeys: state.subscriptions.size, subscriptions, fences, ended }
}

/** @internal */
export const unsafeMake = (clientId: string): MemoryBackendInternal => {
  const state = makeState()
  return {
    close: () => close(state),
    service: {
      clientId,
      acquire: (request) => locks.acquire(state, request),
      release: (request) => locks.release(state, request),
      renew: (requests) => locks.renew(state, requests),
      inspect: (key) => locks.inspect(state, key),
      forceRelease: (request) => locks.forceRelease(state, request),
      raiseFence: (request) => locks.raiseFence(state, request),
      cancel: (request) => locks.cancel(state, request),
      subscribe: (key, holder, mode) => locks.subscribe(state, key, holder, mode),
      latchSetCount: (request) => latches.latchSetCount(state, request),
      latchCountDown: (request) => latches.latchCountDown(state, request),
      latchCount: (key) => latches.latchCount(state, key),
      latchSubscribe: (key, waiter) => latches.latchSubscribe(state, key, waiter)
    },
    sizes: () => sizesOf(state)
  }
}
