import { assert } from "@effect/vitest"
import type { Scope } from "effect"
import { Cause, Deferred, Duration, Effect, Exit, Fiber, Layer, Option, TestClock } from "effect"
import type { Lease } from "@lockstep/core/Lease"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import type { KeyState, Service } from "@lockstep/core/LockBackend"
import type { Harness } from "../Conformance.js"
import type * as FaultyBackend from "../FaultyBackend.js"
import * as History from "../History.js"
import * as HandOffCheck from "./conformanceHandOff.js"
import type { HandOff } from "./conformanceHandOff.js"

/** How a scenario is registered: `it.effect` on `TestClock`, `it.live` on a live clock. */
export type TestFn = (name: string, self: () => Effect.Effect<void, unknown, never>, timeout?: number) => void

export const range = (n: number) => Array.from({ length: n }, (_, i) => i)

/** Counts backend calls by operation, to prove what was (not) sent. */
export const counting = (layer: Layer.Layer<LockBackend>) => {
  const calls = new Map<string, number>()
  const count = (op: string) => Effect.sync(() => calls.set(op, (calls.get(op) ?? 0) + 1))
  const wrapped = Layer.effect(
    LockBackend,
    Effect.map(LockBackend, (backend): Service => ({
      ...backend,
      acquire: (r) => Effect.zipRight(count("acquire"), backend.acquire(r)),
      release: (r) => Effect.zipRight(count("release"), backend.release(r)),
      renew: (r) => Effect.zipRight(count("renew"), backend.renew(r)),
      inspect: (k) => Effect.zipRight(count("inspect"), backend.inspect(k)),
      forceRelease: (r) => Effect.zipRight(count("forceRelease"), backend.forceRelease(r)),
      cancel: (r) => Effect.zipRight(count("cancel"), backend.cancel(r)),
      subscribe: (k, h, m) => Effect.zipRight(count("subscribe"), backend.subscribe(k, h, m))
    }))
  ).pipe(Layer.provide(layer))
  return { layer: wrapped, calls: (op: string) => calls.get(op) ?? 0, total: () => [...calls.values()].reduce((a, b) => a + b, 0) }
}

/** Tracks who is inside a critical section and records every invariant breach. */
export const occupancy = (limit: number) => {
  const state = { exclusive: 0, permits: 0, holders: 0, maxHolders: 0, maxPermits: 0, violations: [] as Array<string> }
  return {
    state,
    enter: (lease: Lease) =>
      Effect.sync(() => {
        if (lease.mode === "exclusive") {
          if (state.exclusive > 0 || state.permits > 0) state.violations.push(`exclusive grant to ${lease.holder} while occupied`)
          state.exclusive++
        } else {
          if (state.exclusive > 0) state.violations.push(`shared grant to ${lease.holder} while a writer is inside`)
          state.permits += lease.permits
          if (state.permits > limit) state.violations.push(`${state.permits} permits taken, limit ${limit}`)
        }
        state.holders++
        state.maxHolders = Math.max(state.maxHolders, state.holders)
        state.maxPermits = Math.max(state.maxPermits, state.permits)
      }),
    leave: (lease: Lease) =>
      Effect.sync(() => {
        if (lease.mode === "exclusive") state.exclusive--
        else state.permits -= lease.permits
        state.holders--
      })
  }
}

export const assertStrictlyIncreasing = (fences: ReadonlyArray<number>) => {
  for (let i = 1; i < fences.length; i++) {
    assert.isTrue(fences[i]! > fences[i - 1]!, `fence ${fences[i]} after ${fences[i - 1]}`)
  }
}

export const failureOf = <A, E>(exit: Exit.Exit<A, E>): Option.Option<E> =>
  Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()

/** Runs a scenario on `layer`, often the harness's backend with a fault in front of it. */
export const onLayer = <ROut>(layer: Layer.Layer<ROut>) => <A, E>(self: Effect.Effect<A, E, ROut>) => Effect.provide(self, layer)

/** Every operation that changes a backend's state: the ones a fault may deliver twice. */
export const everyOperation: ReadonlyArray<FaultyBackend.Operation> = [
  "acquire",
  "release",
  "renew",
  "cancel",
  "forceRelease",
  "latchSetCount",
  "latchCountDown"
]

/** What `occupancy` saw over a `contend` run, and the fences granted in order. */
export interface Contention {
  readonly exclusive: number
  readonly permits: number
  readonly holders: number
  readonly maxHolders: number
  readonly maxPermits: number
  readonly violations: ReadonlyArray<string>
  readonly fences: ReadonlyArray<number>
}

/** A lease held by a fiber of its own (see `Kit.hold`). */
export interface HeldLease<E> {
  readonly lease: Lease
  readonly fiber: Fiber.RuntimeFiber<void, E>
  readonly release: Effect.Effect<void, E>
}

/** What the scenarios share: the harness, the clock's helpers, and the ways to reach the backend. */
export interface Kit {
  readonly harness: Harness
  readonly live: boolean
  /** Registers a scenario every backend runs. */
  readonly test: TestFn
  /** Scenarios that need more than exclusive, non-fair locks: only for backends that support every kind. */
  readonly everyKind: TestFn
  /** Lets other fibers (and, live, the backend's round trips) make progress. */
  readonly settle: Effect.Effect<void>
  /** Moves past `ms`: live, a margin more of real time; otherwise `TestClock` time. */
  readonly advance: (ms: number) => Effect.Effect<void>
  /** Lets `ms` pass: real time live, TestClock time otherwise. */
  readonly elapse: (ms: number) => Effect.Effect<void>
  /**
   * A short lease or watchdog for the expiry tests. Live, a longer one: a loaded 2-core machine
   * may stall the event loop for a few hundred milliseconds.
   */
  readonly shortMs: number
  readonly short: Duration.Duration
  /** A wait that only a wake-up can end in time (the holders' leases are far longer). */
  readonly promptly: <A, E, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<A, E | Error, R>
  readonly freshKey: (label: string) => Effect.Effect<string>
  readonly inspect: (key: string) => Effect.Effect<KeyState, BackendError, LockBackend>
  readonly assertFree: (key: string) => Effect.Effect<void, BackendError, LockBackend>
  /**
   * Holds a lease in a fiber of its own until `release` runs. Call it from a fiber that holds
   * nothing, so the holder is a different identity.
   */
  readonly hold: <E, R>(acquire: Effect.Effect<Lease, E, R>) => Effect.Effect<HeldLease<E>, never, Exclude<R, Scope.Scope>>
  readonly withBackend: <A, E>(self: Effect.Effect<A, E, LockBackend>) => Effect.Effect<A, E>
  /**
   * Runs `self` on a backend whose every grant and release is recorded (as the lock API sees
   * them: above any fault `layer` injects), then checks the history.
   */
  readonly withHistory: <A, E>(self: Effect.Effect<A, E, LockBackend>, layer?: Layer.Layer<LockBackend>) => Effect.Effect<A, E>
  /** `workers` fibers each take a lease and hold it for `holdFor`; returns what the occupancy saw and the fences. */
  readonly contend: <E>(
    workers: number,
    limit: number,
    take: (worker: number) => Effect.Effect<Lease, E, Scope.Scope>,
    holdFor?: Effect.Effect<void>
  ) => Effect.Effect<Contention, E>
  /**
   * How long a waiter of the hand-off checks goes without looking again on its own (the
   * `waiterTimeout` of its locks, the `recheck` of its latch): far longer than any hand-off.
   */
  readonly waiterTimeout: Duration.Duration
  /**
   * Checks one hand-off: the handles `make` builds (on a backend that tells when the waiter is
   * waiting), a holder holding, a waiter waiting, the holder releasing; fails unless the waiter
   * is let in within the harness's hand-off bound of the release.
   */
  readonly handOff: (label: string, make: Effect.Effect<HandOff, unknown, LockBackend>) => Effect.Effect<void, unknown>
}

export const make = (harness: Harness, test: TestFn): Kit => {
  const live = harness.clock === "live"
  const everyKind: TestFn = harness.kinds === "exclusive" ? () => undefined : test
  const settle = live ? Effect.sleep("40 millis") : Effect.repeatN(Effect.yieldNow(), 40)
  const advance = (ms: number) => (live ? Effect.sleep(ms + 30) : TestClock.adjust(ms))
  const shortMs = live ? 900 : 300
  const short = Duration.millis(shortMs)
  const promptly = <A, E, R>(self: Effect.Effect<A, E, R>) => (live ? Effect.timeoutFail(self, { duration: "3 seconds", onTimeout: () => new Error("no wake-up within 3 seconds") }) : self)
  const freshKey = (label: string) => Effect.sync(() => `lockstep-conformance-${label}-${crypto.randomUUID()}`)
  const inspect = (key: string) => Effect.flatMap(LockBackend, (backend) => backend.inspect(key))
  const assertFree = (key: string) =>
    Effect.gen(function*() {
      const state = yield* inspect(key)
      assert.deepStrictEqual(state.holders, [], `holders left on ${key}`)
      assert.deepStrictEqual(state.queue, [], `queue entries left on ${key}`)
    })
  const hold = <E, R>(acquire: Effect.Effect<Lease, E, R>) =>
    Effect.gen(function*() {
      const granted = yield* Deferred.make<Lease>()
      const done = yield* Deferred.make<void>()
      // a daemon: it outlives a forked caller that returns once the lease is granted
      const fiber = yield* Effect.forkDaemon(
        Effect.scoped(Effect.flatMap(acquire, (lease) => Effect.zipRight(Deferred.succeed(granted, lease), Deferred.await(done))))
      )
      const lease = yield* Deferred.await(granted)
      return { lease, fiber, release: Effect.zipRight(Deferred.succeed(done, undefined), Fiber.join(fiber)) }
    })
  const withBackend = <A, E>(self: Effect.Effect<A, E, LockBackend>) => Effect.provide(self, harness.layer)
  const withHistory = <A, E>(self: Effect.Effect<A, E, LockBackend>, layer: Layer.Layer<LockBackend> = harness.layer) =>
    Effect.gen(function*() {
      const history = yield* History.make
      const recorded = Layer.effect(LockBackend, Effect.map(LockBackend, (backend) => History.instrument(history, backend)))
      const result = yield* Effect.provide(self, Layer.provide(recorded, layer))
      const events = yield* history.events
      assert.isAbove(events.filter((e) => e._tag === "Grant").length, 0, "nothing was recorded")
      assert.deepStrictEqual((yield* history.check).map(History.formatViolation), [])
      return result
    })
  const contend = <E>(
    workers: number,
    limit: number,
    take: (worker: number) => Effect.Effect<Lease, E, Scope.Scope>,
    holdFor: Effect.Effect<void> = settle
  ) =>
    Effect.gen(function*() {
      const inside = occupancy(limit)
      const fences: Array<number> = []
      yield* Effect.forEach(range(workers), (worker) =>
        Effect.scoped(Effect.gen(function*() {
          const lease = yield* take(worker)
          fences.push(lease.fence)
          yield* inside.enter(lease)
          yield* holdFor
          yield* inside.leave(lease)
        })), { concurrency: "unbounded", discard: true })
      assert.deepStrictEqual(inside.state.violations, [])
      return { ...inside.state, fences }
    })

  return {
    harness,
    live,
    test,
    everyKind,
    settle,
    advance,
    elapse: (ms) => (live ? Effect.sleep(ms) : TestClock.adjust(ms)),
    shortMs,
    short,
    promptly,
    freshKey,
    inspect,
    assertFree,
    hold,
    withBackend,
    withHistory,
    contend,
    waiterTimeout: HandOffCheck.waiterTimeout,
    handOff: HandOffCheck.check(harness)
  }
}
