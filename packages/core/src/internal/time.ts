/** The clock readings and allowances every lock, waiter and keeper times itself by. */
import { Clock, Context, DefaultServices, Effect } from "effect"

/** Monotonic milliseconds from Effect's Clock (hrtime-based live, driven by TestClock in tests). */
export const monotonicMillis = Effect.map(Clock.currentTimeNanos, (nanos) => Number(nanos) / 1_000_000)

/**
 * Time given away on every local deadline: the backend's clock may run faster than ours, and a
 * timer may fire late. 1% of the lease plus 5 ms, as Redisson's RedLock allows for clock drift.
 */
export const driftMs = (leaseMs: number) => Math.floor(leaseMs / 100) + 5

/** The live clock: timers of our own run only on it (a TestClock drives the others). */
export const liveClock = Context.get(DefaultServices.liveServices, Clock.Clock)

/** Longest single sleep: Effect's clock never fires a timer set further out than 2^31 - 1 ms. */
export const maxSleepMs = 2 ** 31 - 1
