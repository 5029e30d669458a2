/**
 * What every backend keeps besides its state: whether it is open, the errors it answers with,
 * and the signals its waiters block on. One implementation, so a fix here is a fix everywhere.
 */
import { constVoid } from "effect/Function"
import * as Effect from "effect/Effect"
import type { Lifecycle, LifecycleOptions, WaiterSignal } from "../BackendKit.js"
import { subscriptionOf } from "../LockBackend.js"
import { BackendError, backendClosed } from "../LockError.js"

const messageOf = (cause: unknown): string => (cause instanceof Error ? cause.message : String(cause))

/** @internal */
export const makeLifecycle = (options: LifecycleOptions): Lifecycle => {
  const { backend, endpoint } = options
  const detailOf = options.detailOf ?? messageOf
  let closed = false
  /** The signals of live subscriptions: woken at close, so no waiter blocks on a closed backend. */
  const open = new Set<WaiterSignal>()

  const closedError = (operation: string): BackendError => backendClosed({ operation, backend, endpoint })

  const whileOpen = <A, E, R>(operation: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | BackendError, R> =>
    Effect.suspend((): Effect.Effect<A, E | BackendError, R> => (closed ? Effect.fail(closedError(operation)) : effect))

  // a call still under way when the backend closes fails as closed: its connection may be gone
  // under it, and what it ran into is the close, not an outage
  const failure = (operation: string) => (cause: unknown): BackendError =>
    closed ? closedError(operation) : new BackendError({ operation, cause, endpoint, detail: detailOf(cause) })

  const waiterSignal = (onTake?: () => void): WaiterSignal => {
    let pending = false
    let signalClosed = false
    const resumers = new Set<() => void>()
    const take = (): boolean => {
      if (!pending) return false
      pending = false
      onTake?.()
      return true
    }
    const flush = () => {
      const waiting = [...resumers]
      resumers.clear()
      for (const resume of waiting) resume()
    }
    // the wake-up is taken when the waiting fiber resumes, not when it is woken: until then it
    // counts as pending, so a backend choosing whom to wake next passes this one by
    const resumed = Effect.sync(take)
    const signal: WaiterSignal = {
      wake: () => {
        pending = true
        flush()
      },
      pending: () => pending,
      take,
      isClosed: () => signalClosed || closed,
      close: () => {
        if (signalClosed) return
        signalClosed = true
        open.delete(signal)
        flush()
      },
      subscription: subscriptionOf((wake) => {
        if (pending || signalClosed || closed) {
          take()
          wake(Effect.void)
          return constVoid
        }
        const resumer = () => wake(resumed)
        resumers.add(resumer)
        return () => void resumers.delete(resumer)
      })
    }
    open.add(signal)
    return signal
  }

  const close = (): void => {
    if (closed) return
    closed = true
    for (const signal of [...open]) signal.close()
  }

  return {
    backend,
    endpoint,
    isClosed: () => closed,
    closedError,
    whileOpen,
    failure,
    waiterSignal,
    close,
    closeWithScope: Effect.addFinalizer(() => Effect.sync(close))
  }
}

/** @internal */
export const endpointName = (system: string, address?: string | undefined, path?: string | undefined): string =>
  address === undefined || address === ""
    ? system
    : path === undefined || path === ""
    ? `${system} ${address}`
    : `${system} ${address}/${path}`
