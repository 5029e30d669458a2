import { Duration, Effect, GlobalValue } from "effect"
import type { Service } from "../LockBackend.js"
import type { BackendError } from "../LockError.js"
import { InvalidLockOptions, LockTimeout } from "../LockError.js"
import { monotonicMillis } from "./time.js"
import { awaitWakeUp } from "./wakeUp.js"

/** A latch handle: its key, the backend it lives on, and how often a waiter re-reads the count. */
export interface LatchSpec {
  readonly backend: Service
  readonly key: string
  readonly recheckMs: number
}

const waiterCounter = GlobalValue.globalValue(Symbol.for("@lockstep/core/latchWaiterCounter"), () => ({ next: 0 }))

/** A count a latch can be set to: a positive safe integer. */
export const validCount = (count: number): Effect.Effect<number, InvalidLockOptions> =>
  Number.isSafeInteger(count) && count > 0
    ? Effect.succeed(count)
    : Effect.fail(new InvalidLockOptions({ field: "count", reason: `a latch count is a positive integer, got ${count}` }))

/**
 * Waits until the latch's count is 0 (at once if it is): subscribe, then read the count; sleep
 * until a wake-up (the count reached 0, or was set anew), the recheck period or the deadline;
 * read again. The recheck bounds the wait a lost wake-up can cause.
 */
export const awaitZero = (
  spec: LatchSpec,
  /** `Infinity`: no limit. */
  timeoutMs: number
): Effect.Effect<void, BackendError | InvalidLockOptions | LockTimeout> =>
  Effect.gen(function*() {
    const startedAt = yield* monotonicMillis
    const deadline = startedAt + timeoutMs
    const subscription = yield* spec.backend.latchSubscribe(spec.key, `${spec.backend.clientId}:latch:${++waiterCounter.next}`)
    while (true) {
      if ((yield* spec.backend.latchCount(spec.key)) === 0) return
      const now = yield* monotonicMillis
      if (now >= deadline) {
        return yield* new LockTimeout({ key: spec.key, timeout: Duration.millis(timeoutMs) })
      }
      yield* awaitWakeUp(subscription, spec.recheckMs, deadline - now)
    }
  }).pipe(Effect.scoped)
