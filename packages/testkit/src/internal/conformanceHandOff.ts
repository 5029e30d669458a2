import { assert } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Layer, Option } from "effect"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { Harness } from "../Conformance.js"

// Hand-off: a release lets its waiter in at once, on every waiting path. The waiters look again
// on their own only every 20 s (a fair waiter every 20 s / 3) and the holders' leases are the
// 30 s watchdog's, so a release whose wake-up is missed shows as a grant seconds late; on
// TestClock, which stands still, as none at all.

/** The two sides of a hand-off. */
export interface HandOff {
  /** Holds, runs `body`, then releases. */
  readonly hold: (body: Effect.Effect<void>) => Effect.Effect<void, unknown>
  /** Waits until it is let in, then runs `body` (which marks the moment). */
  readonly wait: (body: Effect.Effect<void>) => Effect.Effect<void, unknown>
}

export const waiterTimeout = Duration.seconds(20)
const waiterTimeoutMs = Duration.toMillis(waiterTimeout)
/** Real time on either clock: the gap measured is the backend's, not the Clock's. */
const realNow = Effect.sync(() => performance.now())

/** The hand-off check on the harness's backend (see `Kit.handOff`). */
export const check = (harness: Harness) => {
  const live = harness.clock === "live"
  const handOffMs = harness.handOffMs ?? 500
  return (label: string, make: Effect.Effect<HandOff, unknown, LockBackend>): Effect.Effect<void, unknown> =>
    Effect.gen(function*() {
      // the waiter is waiting once a look at the backend made after it subscribed found it blocked
      const seen = { subscribed: 0, blocked: 0 }
      const blocked = (yes: boolean) =>
        Effect.sync(() => {
          if (yes && seen.subscribed > 0) seen.blocked++
        })
      const subscribed = Effect.sync(() => void seen.subscribed++)
      const watched = Layer.effect(
        LockBackend,
        Effect.map(LockBackend, (backend): Service => ({
          ...backend,
          acquire: (r) => Effect.tap(backend.acquire(r), (result) => blocked(result._tag === "Denied")),
          latchCount: (k) => Effect.tap(backend.latchCount(k), (n) => blocked(n > 0)),
          subscribe: (k, h, m) => Effect.zipLeft(backend.subscribe(k, h, m), subscribed),
          latchSubscribe: (k, w) => Effect.zipLeft(backend.latchSubscribe(k, w), subscribed)
        }))
      ).pipe(Layer.provide(harness.layer))
      yield* Effect.gen(function*() {
        const { hold, wait } = yield* make
        // each side once alone first: loading scripts or statements is not part of a hand-off
        yield* hold(Effect.void)
        yield* wait(Effect.void)
        const holding = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        // daemons, let go of (not awaited) once the check is done: a waiter the release missed may
        // be stuck where no interruption reaches it, and the check must report, not hang
        const holder = yield* Effect.forkDaemon(hold(Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(release))))
        let grantedAt: number | undefined
        const waiter = yield* Effect.forkDaemon(
          Effect.zipRight(Deferred.await(holding), wait(Effect.sync(() => void (grantedAt = performance.now()))))
        )
        yield* Effect.gen(function*() {
          yield* Effect.raceFirst(
            Deferred.await(holding),
            Effect.zipRight(Fiber.join(holder), Effect.dieMessage(`${label}: the holder ended without holding`))
          )
          const step = live ? Effect.sleep(2) : Effect.yieldNow()
          const waitingFrom = yield* realNow
          while (seen.blocked === 0) {
            if (Option.isSome(yield* Fiber.poll(waiter))) {
              yield* Fiber.join(waiter)
              assert.fail(`${label}: the waiter was let in while the holder held`)
            }
            assert.isBelow((yield* realNow) - waitingFrom, 10_000, `${label}: the waiter never started waiting`)
            yield* step
          }
          const releasedAt = yield* realNow
          yield* Deferred.succeed(release, undefined)
          if (live) {
            // long enough to see the waiter let in by its own retry, had the release woken nothing
            yield* Effect.ignore(Effect.timeout(Fiber.await(waiter), waiterTimeoutMs + 10_000))
          } else {
            // the clock stands still: nothing but the release's wake-up can let the waiter in
            while (Option.isNone(yield* Fiber.poll(waiter)) && (yield* realNow) - releasedAt <= handOffMs) {
              yield* Effect.yieldNow()
            }
          }
          if (grantedAt === undefined) {
            if (Option.isSome(yield* Fiber.poll(waiter))) yield* Fiber.join(waiter)
            const waited = ((yield* realNow) - releasedAt).toFixed(0)
            return assert.fail(
              live
                ? `${label}: the waiter was not let in ${waited} ms after the release (on its own it looks again after ${waiterTimeoutMs} ms)`
                : `${label}: the waiter was not let in ${waited} ms after the release, the clock standing still: nothing but the release's wake-up could let it in`
            )
          }
          const gap = grantedAt - releasedAt
          assert.isAtMost(
            gap,
            handOffMs,
            `${label}: the waiter was let in ${gap.toFixed(1)} ms after the release, over the ${handOffMs} ms bound ` +
              `(on its own it looks again after ${waiterTimeoutMs} ms, a fair waiter after a third of that)`
          )
          yield* Fiber.join(waiter)
          yield* Fiber.join(holder)
        }).pipe(Effect.ensuring(Effect.zipRight(Fiber.interruptFork(waiter), Fiber.interruptFork(holder))))
      }).pipe(Effect.provide(watched))
    })
}
