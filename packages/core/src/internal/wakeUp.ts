/** How a waiter sleeps between two looks at the backend. */
import { Effect } from "effect"
import type { Subscription } from "../LockBackend.js"
import { liveClock, maxSleepMs } from "./time.js"

/**
 * Waits for the subscription's next wake-up, or at most the least of `bounds` (ms; at least 1,
 * at most `maxSleepMs`): what every waiter does between two looks at the backend. Interruptible
 * as the caller's region is. Where it races two fibers (a subscription without a callback, or a
 * clock other than the live one), both sides are interruptible whatever that region is: the race
 * ends only once the loser is interrupted, and an uninterruptible sleep would hold a woken waiter
 * until the bound.
 */
export const awaitWakeUp = (subscription: Subscription, ...bounds: ReadonlyArray<number>): Effect.Effect<void> => {
  const ms = Math.max(1, Math.ceil(Math.min(...bounds, maxSleepMs)))
  const onWake = subscription.unsafeOnWake
  return Effect.clockWith((clock) =>
    onWake === undefined || clock !== liveClock
      ? Effect.raceFirst(Effect.interruptible(subscription.await), Effect.interruptible(Effect.sleep(ms)))
      // on the live clock, a callback and a timer of our own: a race would fork a fiber for each
      // side (every waiter's every wake-up)
      : Effect.async<void>((resume) => {
        // the callback may run at once (a wake-up was pending), before the timer exists
        const wait: { done: boolean; timer?: ReturnType<typeof setTimeout> } = { done: false }
        const unregister = onWake((resumed) => {
          if (wait.done) return
          wait.done = true
          clearTimeout(wait.timer)
          resume(resumed)
        })
        if (wait.done) return
        wait.timer = setTimeout(() => {
          wait.done = true
          unregister()
          resume(Effect.void)
        }, ms)
        return Effect.sync(() => {
          wait.done = true
          clearTimeout(wait.timer)
          unregister()
        })
      })
  )
}
