/**
 * The backend's state, the context every operation takes, and the one way an operation runs:
 * `atomically`, on the clock's time, with the idle keys of the whole backend swept now and then.
 */
import { Clock, Context, Effect } from "effect"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import { makeLifecycle } from "@lockstep/core/BackendKit"
import type * as LockError from "@lockstep/core/LockError"
import { dropExpired, forgetUnused, type Keys } from "./keys.js"
import type { Latches } from "./latches.js"
import { type Subscribers, wakeNext } from "./wakeups.js"

export interface MemoryState {
  /** Open until the layer that made the backend ends: then every call fails, nothing is kept. */
  readonly lifecycle: Lifecycle
  readonly keys: Keys
  readonly subscriptions: Subscribers
  readonly latches: Latches
  readonly latchSubscriptions: Subscribers
  /** Operations run so far: every `sweepEvery`-th sweeps the whole backend. */
  operations: number
}

export const makeState = (): MemoryState => ({
  lifecycle: makeLifecycle({ backend: "memory backend" }),
  keys: new Map(),
  subscriptions: new Map(),
  latches: new Map(),
  latchSubscriptions: new Map(),
  operations: 0
})

/** Every this many operations, idle keys of the whole backend are swept. */
const sweepEvery = 1024

/** Collects keys nobody touched since their holds and memories expired. */
const sweep = (state: MemoryState, now: number): void => {
  for (const key of [...state.keys.keys()]) {
    if (dropExpired(state.keys, key, now)) wakeNext(state, key)
    forgetUnused(state.keys, key, now)
  }
}

/**
 * Runs `operation`'s state transition `f` at the clock's time now, or fails with the closed error.
 * `f` reads and changes the state in one synchronous block: JS is single-threaded, so each
 * operation is atomic.
 */
export const atomically = <A, E>(
  state: MemoryState,
  operation: string,
  f: (now: number) => Effect.Effect<A, E>
): Effect.Effect<A, E | LockError.BackendError> =>
  // monotonic: a wall-clock step must not expire leases early
  Effect.withFiberRuntime((fiber): Effect.Effect<A, E | LockError.BackendError> => {
    if (state.lifecycle.isClosed()) return Effect.fail(state.lifecycle.closedError(operation))
    const now = Number(Context.get(fiber.currentDefaultServices, Clock.Clock).unsafeCurrentTimeNanos()) / 1_000_000
    if (++state.operations % sweepEvery === 0) sweep(state, now)
    return f(now)
  })
