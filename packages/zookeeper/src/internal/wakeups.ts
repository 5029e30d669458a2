/**
 * Waking this process's waiters. A waiter's attempt watches what blocks it (ZooKeeper calls back
 * once, when the node changes or goes): a writer the node just before its own, a reader the
 * nearest writer before it or, blocked by permits, the nodes before it; a latch's waiter the
 * latch's node. Each waiter blocks on a `WaiterSignal` of the backend's lifecycle, so the close
 * wakes every one of them, and their next attempt fails as closed.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import type { Lifecycle, WaiterSignal } from "@lockstep/core/BackendKit"
import type { LockBackend } from "@lockstep/core"
import * as Zk from "node-zookeeper-client"
import type { Session } from "./session.js"

export interface Wakeups {
  /** Wakes the waiter `id` (or leaves the wake-up pending for its next wait); none: nothing. */
  readonly wake: (id: string) => void
  /**
   * Wakes `id` when the node at `path` changes: on its deletion, or also on a rewrite if
   * `onRewrite`. Only arms this process's side: the caller sends a request with `watcher`.
   */
  readonly watch: (path: string, id: string, onRewrite: boolean) => void
  /** The one watcher function for every node, to pass with a request (the client registers it once per node). */
  readonly watcher: (event: Zk.Event) => void
  /** Whether `id` is subscribed: somebody waits for it. */
  readonly isWaiting: (id: string) => boolean
  /** The subscription of waiter `id`; `leave`: what its leaving undoes (its place in the queue), best-effort. */
  readonly subscribe: (id: string, leave: Effect.Effect<void>) => Effect.Effect<LockBackend.Subscription, never, Scope.Scope>
}

export const makeWakeups = (session: Session, lifecycle: Lifecycle): Wakeups => {
  const waiters = new Map<string, WaiterSignal>()
  /**
   * Which waiters a watched node's change wakes: each with whether a rewrite of the node (a
   * heartbeat, a renewal, a holder confirmed, a writer keeping only its read lock) may let it
   * in. Only its deletion lets a writer in: for a writer, a rewrite re-arms the watch.
   */
  const watching = new Map<string, Map<string, boolean>>()

  const wake = (id: string) => waiters.get(id)?.wake()

  const watch = (path: string, id: string, onRewrite: boolean) => {
    let ids = watching.get(path)
    if (ids === undefined) {
      ids = new Map()
      watching.set(path, ids)
    }
    ids.set(id, onRewrite)
  }

  const watcher = (event: Zk.Event) => {
    const path = event.getPath()
    const ids = watching.get(path)
    if (ids === undefined) return
    watching.delete(path)
    const rewritten = event.getType() === Zk.Event.NODE_DATA_CHANGED
    const rearm: Array<string> = []
    for (const [id, onRewrite] of ids) {
      if (!rewritten || onRewrite) wake(id)
      else if (waiters.has(id)) rearm.push(id) // a waiter that left needs no watch
    }
    if (rearm.length === 0 || lifecycle.isClosed()) return
    for (const id of rearm) watch(path, id, false)
    // the node went before the watch was set again: its writers wake and try
    const gone = () => {
      for (const id of rearm) {
        watching.get(path)?.delete(id)
        wake(id)
      }
    }
    try {
      session.client().exists(path, watcher, (error, stat) => {
        if (error || !stat) gone()
      })
    } catch {
      gone()
    }
  }

  const subscribe = (id: string, leave: Effect.Effect<void>) =>
    Effect.map(
      Effect.acquireRelease(
        Effect.sync(() => {
          const signal = lifecycle.waiterSignal()
          waiters.set(id, signal)
          return signal
        }),
        (signal) =>
          Effect.suspend(() => {
            signal.close()
            // a later subscription of the same waiter replaced this one: it stays
            if (waiters.get(id) !== signal) return Effect.void
            waiters.delete(id)
            return leave
          })
      ),
      (signal) => signal.subscription
    )

  return { wake, watch, watcher, isWaiting: (id) => waiters.has(id), subscribe }
}
