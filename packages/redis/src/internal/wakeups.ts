import type { Exit, Scope } from "effect"
import { Effect } from "effect"
import type { HoldMode, Subscription } from "@lockstep/core/LockBackend"

/** One waiting acquisition in this process. */
interface Waiter {
  readonly holder: string
  readonly mode: HoldMode
  /** A wake-up delivered while no fiber was suspended in `await`. */
  pending: boolean
  readonly resumers: Set<() => void>
}

interface Channel {
  readonly waiters: Set<Waiter>
  /** Completes when the server confirmed the subscription. */
  readonly ready: Promise<unknown>
}

/** What the hub needs from the subscriber connection. */
export interface SubscriberConnection {
  readonly subscribe: (channel: string) => Promise<unknown>
  readonly unsubscribe: (channel: string) => Promise<unknown>
}

/**
 * Routes release notifications from the backend's single subscriber connection to the waiters of
 * this process. Channels are reference-counted: subscribed for the first waiter of a key and
 * unsubscribed when its last waiter leaves. A notification wakes one waiter: the named holder for
 * a fair queue's head, otherwise the longest-waiting one without a pending wake-up.
 */
export const makeWakeups = (connection: SubscriberConnection, subscribeTimeout: (p: Promise<unknown>) => Effect.Effect<void, unknown>) => {
  const channels = new Map<string, Channel>()

  const deliver = (waiter: Waiter) => {
    const resume = waiter.resumers.values().next()
    if (resume.done === true) {
      waiter.pending = true
    } else {
      for (const r of waiter.resumers) r()
      waiter.resumers.clear()
    }
  }

  /**
   * Wakes the longest-waiting waiter without a pending wake-up; if it asks for a shared hold,
   * every shared waiter, since freed capacity may fit several and a denied one passes nothing on.
   */
  const wakeOne = (name: string) => {
    const channel = channels.get(name)
    if (channel === undefined) return
    for (const waiter of channel.waiters) {
      if (waiter.pending) continue
      deliver(waiter)
      if (waiter.mode === "shared") {
        for (const other of channel.waiters) if (!other.pending && other.mode === "shared") deliver(other)
      }
      return
    }
  }

  const onMessage = (name: string, message: string) => {
    const channel = channels.get(name)
    if (channel === undefined) return
    if (message !== "0") {
      for (const waiter of channel.waiters) {
        if (waiter.holder === message) return deliver(waiter)
      }
      // the fair queue's head waits elsewhere; no one here may take the lock before it
      return
    }
    wakeOne(name)
  }

  /** After a reconnect, notifications may have been missed: every waiter retries. */
  const wakeAll = () => {
    for (const channel of channels.values()) for (const waiter of channel.waiters) deliver(waiter)
  }

  const subscribe = (name: string, holder: string, mode: HoldMode): Effect.Effect<Subscription, unknown, Scope.Scope> =>
    Effect.acquireRelease(
      Effect.suspend(() => {
        let channel = channels.get(name)
        if (channel === undefined) {
          const ready = connection.subscribe(name)
          // the failure is reported to the subscribing waiter below
          ready.catch(() => undefined)
          channel = { waiters: new Set(), ready }
          channels.set(name, channel)
        }
        const waiter: Waiter = { holder, mode, pending: false, resumers: new Set() }
        channel.waiters.add(waiter)
        const current = channel
        return Effect.as(
          Effect.onError(subscribeTimeout(current.ready), () => Effect.sync(() => leave(name, current, waiter))),
          { channel: current, waiter }
        )
      }),
      ({ channel, waiter }, exit: Exit.Exit<unknown, unknown>) =>
        Effect.sync(() => {
          leave(name, channel, waiter)
          // a waiter leaving without a grant passes any wake-up on
          if (exit._tag === "Failure") wakeOne(name)
        })
    ).pipe(
      Effect.map(({ waiter }): Subscription => ({
        await: Effect.async<void>((resume) => {
          if (waiter.pending) {
            waiter.pending = false
            return resume(Effect.void)
          }
          const resumer = () => resume(Effect.void)
          waiter.resumers.add(resumer)
          return Effect.sync(() => void waiter.resumers.delete(resumer))
        })
      }))
    )

  const leave = (name: string, channel: Channel, waiter: Waiter) => {
    if (!channel.waiters.delete(waiter)) return
    if (channel.waiters.size === 0 && channels.get(name) === channel) {
      channels.delete(name)
      connection.unsubscribe(name).catch(() => undefined)
    }
  }

  return {
    subscribe,
    onMessage,
    wakeAll,
    /** After a shared grant, the next waiter may fit too. */
    wakeNext: (name: string) => wakeOne(name),
    channelCount: () => channels.size
  }
}
