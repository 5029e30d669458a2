import { assert } from "@effect/vitest"
import { Cause, Deferred, Duration, Effect, Either, Exit, Fiber, FiberRef, Layer, Option, Runtime, Scope, TestClock } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import type { Lease } from "@lockstep/core/Lease"
import * as Lock from "@lockstep/core/Lock"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { LockError } from "@lockstep/core/LockError"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import * as Semaphore from "@lockstep/core/Semaphore"
import type { Harness } from "../Conformance.js"
import * as FaultyBackend from "../FaultyBackend.js"
import * as History from "../History.js"
import * as ModelCheck from "../ModelCheck.js"
import * as LatchConformance from "./latchConformance.js"
import * as MultiLockConformance from "./multiLockConformance.js"
import type { HandOff } from "./multiLockConformance.js"

type TestFn = (name: string, self: () => Effect.Effect<void, unknown, never>, timeout?: number) => void

/** Counts backend calls by operation, to prove what was (not) sent. */
const counting = (layer: Layer.Layer<LockBackend>) => {
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
const occupancy = (limit: number) => {
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

const range = (n: number) => Array.from({ length: n }, (_, i) => i)

const assertStrictlyIncreasing = (fences: ReadonlyArray<number>) => {
  for (let i = 1; i < fences.length; i++) {
    assert.isTrue(fences[i]! > fences[i - 1]!, `fence ${fences[i]} after ${fences[i - 1]}`)
  }
}

const failureOf = <A, E>(exit: Exit.Exit<A, E>): Option.Option<E> =>
  Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()

export const register = (harness: Harness, test: TestFn): void => {
  const live = harness.clock === "live"
  /** Scenarios that need more than exclusive, non-fair locks: only for backends that support every kind. */
  const everyKind: TestFn = harness.kinds === "exclusive" ? () => undefined : test
  /** Lets other fibers (and, live, the backend's round trips) make progress. */
  const settle = live ? Effect.sleep("40 millis") : Effect.repeatN(Effect.yieldNow(), 40)
  const advance = (ms: number) => (live ? Effect.sleep(ms + 30) : TestClock.adjust(ms))
  /**
   * A short lease or watchdog for the expiry tests. Live, a longer one: a loaded 2-core machine
   * may stall the event loop for a few hundred milliseconds.
   */
  const shortMs = live ? 900 : 300
  const short = Duration.millis(shortMs)
  /** A wait that only a wake-up can end in time (the holders' leases are far longer). */
  const promptly = <A, E, R>(self: Effect.Effect<A, E, R>) => (live ? Effect.timeoutFail(self, { duration: "3 seconds", onTimeout: () => new Error("no wake-up within 3 seconds") }) : self)
  const freshKey = (label: string) => Effect.sync(() => `lockstep-conformance-${label}-${crypto.randomUUID()}`)
  const inspect = (key: string) => Effect.flatMap(LockBackend, (backend) => backend.inspect(key))
  const assertFree = (key: string) =>
    Effect.gen(function*() {
      const state = yield* inspect(key)
      assert.deepStrictEqual(state.holders, [], `holders left on ${key}`)
      assert.deepStrictEqual(state.queue, [], `queue entries left on ${key}`)
    })
  /**
   * Holds a lease in a fiber of its own until `release` runs. Call it from a fiber that holds
   * nothing, so the holder is a different identity.
   */
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
  /**
   * Runs `self` on a backend whose every grant and release is recorded (as the lock API sees
   * them: above any fault `layer` injects), then checks the history.
   */
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

  /** `workers` fibers each take a lease and hold it for `holdFor`; returns what the occupancy saw and the fences. */
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

  // ---------------------------------------------------------------------------------------------
  // Hand-off: a release lets its waiter in at once, on every waiting path. The waiters look again
  // on their own only every 20 s (a fair waiter every 20 s / 3) and the holders' leases are the
  // 30 s watchdog's, so a release whose wake-up is missed shows as a grant seconds late; on
  // TestClock, which stands still, as none at all.

  const waiterTimeout = Duration.seconds(20)
  const waiterTimeoutMs = Duration.toMillis(waiterTimeout)
  const handOffMs = harness.handOffMs ?? 500
  /** Real time on either clock: the gap measured is the backend's, not the Clock's. */
  const realNow = Effect.sync(() => performance.now())
  const handOff = (label: string, make: Effect.Effect<HandOff, unknown, LockBackend>): Effect.Effect<void, unknown> =>
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

  test("hand-off: a Lock waiter is let in at the release, not at its own retry", () =>
    handOff("Lock", Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("hand-off-lock"), { waiterTimeout })
      const take = (body: Effect.Effect<void>) => Lock.withLock(body, lock)
      return { hold: take, wait: take }
    })), 60_000)

  everyKind("hand-off: a FairLock waiter is let in at the release, not at its own retry", () =>
    handOff("FairLock", Effect.gen(function*() {
      const lock = yield* FairLock.make(yield* freshKey("hand-off-fair"), { waiterTimeout })
      const take = (body: Effect.Effect<void>) => Lock.withLock(body, lock)
      return { hold: take, wait: take }
    })), 60_000)

  everyKind("hand-off: a reader waiting for a writer is let in at the writer's release", () =>
    handOff("ReadWriteLock read after write", Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("hand-off-read"), { waiterTimeout })
      return { hold: (body) => Lock.withLock(body, rw.write), wait: (body) => Lock.withLock(body, rw.read) }
    })), 60_000)

  everyKind("hand-off: a writer waiting for a reader is let in at the reader's release", () =>
    handOff("ReadWriteLock write after read", Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("hand-off-write"), { waiterTimeout })
      return { hold: (body) => Lock.withLock(body, rw.read), wait: (body) => Lock.withLock(body, rw.write) }
    })), 60_000)

  everyKind("hand-off: a Semaphore waiter for permits is let in when they are released", () =>
    handOff("Semaphore", Effect.gen(function*() {
      const sem = yield* Semaphore.make(yield* freshKey("hand-off-sem"), { limit: 3, waiterTimeout })
      // two of three permits held: a waiter for two fits only once they are back
      const take = (body: Effect.Effect<void>) => Semaphore.withPermits(body, sem, { permits: 2 })
      return { hold: take, wait: take }
    })), 60_000)

  test("60 fibers contend for one Lock: mutual exclusion, increasing fences", () =>
    withHistory(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("mutex"))
      const { fences } = yield* contend(60, 1, () => Lock.acquire(lock), Effect.yieldNow())
      assert.strictEqual(fences.length, 60)
      assertStrictlyIncreasing(fences)
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

  test("a raised fence floor puts every later fence above it; a lower raise or a copy changes nothing", () =>
    withBackend(Effect.gen(function*() {
      const backend = yield* LockBackend
      const lock = yield* Lock.make(yield* freshKey("floor"))
      const first = (yield* Effect.scoped(Lock.acquire(lock))).fence
      // far above anything the backend's clock would give for a long while
      const floor = first + 3_600_000_000
      yield* backend.raiseFence({ key: lock.key, fence: floor, leaseMs: 30_000 })
      yield* backend.raiseFence({ key: lock.key, fence: floor, leaseMs: 30_000 })
      const second = (yield* Effect.scoped(Lock.acquire(lock))).fence
      assert.isAbove(second, floor)
      assert.isAtMost(second, floor + 1, "a copy of the raise moved the floor again")
      yield* backend.raiseFence({ key: lock.key, fence: first, leaseMs: 30_000 })
      const third = (yield* Effect.scoped(Lock.acquire(lock))).fence
      assert.strictEqual(third, second + 1)
      assert.strictEqual((yield* backend.inspect(lock.key)).fence, third)
    })))

  everyKind("FairLock grants in arrival order", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("fair")
      const lock = yield* FairLock.make(key)
      const first = yield* hold(Lock.acquire(lock))
      const order: Array<number> = []
      const waiters: Array<Fiber.RuntimeFiber<void, LockError>> = []
      for (const i of range(8)) {
        waiters.push(yield* Effect.fork(Effect.scoped(Effect.zipRight(Lock.acquire(lock), Effect.sync(() => void order.push(i))))))
        // the next waiter arrives only once this one is queued
        yield* inspect(key).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (s) => s.queue.length === i + 1 }))
      }
      yield* first.release
      yield* Fiber.joinAll(waiters)
      assert.deepStrictEqual(order, range(8))
      yield* assertFree(key)
    })))

  everyKind("ReadWriteLock: readers share, writers exclude everyone", () =>
    withHistory(Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("rw"))
      const seen = yield* contend(30, Infinity, (i) => Lock.acquire(i % 5 === 0 ? rw.write : rw.read))
      assert.isAbove(seen.maxHolders, 1, "readers never shared the lock")
      assert.isFalse(yield* Lock.isLocked(rw.read))
      assert.isFalse(yield* Lock.isLocked(rw.write))
    })))

  everyKind("Semaphore: permits never above the limit", () =>
    withHistory(Effect.gen(function*() {
      const sem = yield* Semaphore.make(yield* freshKey("sem"), { limit: 3 })
      const seen = yield* contend(30, 3, (i) => Semaphore.acquire(sem, { permits: 1 + (i % 3) }))
      assert.isAbove(seen.maxHolders, 1, "permits were never shared")
      assert.strictEqual(yield* Semaphore.available(sem), 3)
    })))

  test("a release wakes a waiter at once (no polling)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("wake"))
      const first = yield* hold(Lock.acquire(lock))
      const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)))
      yield* first.release
      // the holder's lease is 30 s: only a wake-up can end this wait in time
      const lease = yield* Fiber.join(waiter).pipe(promptly)
      assert.isAbove(lease.fence, first.lease.fence)
    })))

  test("a fixed lease expires; lost fails with LockLost(DeadlinePassed)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("lease"), { lease: short })
      const first = yield* hold(Lock.acquire(lock))
      const lost = yield* Effect.fork(Effect.flip(first.lease.lost))
      // a lease whose lost nobody asks for until after the loss
      const other = yield* hold(Lock.acquire(yield* Lock.make(yield* freshKey("lease-unasked"), { lease: short })))
      assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(lock))))
      yield* advance(shortMs)
      const error = yield* Fiber.join(lost)
      assert.strictEqual(error._tag, "LockLost")
      assert.strictEqual(error.reason, "DeadlinePassed")
      const late = yield* Effect.flip(other.lease.lost).pipe(promptly)
      assert.strictEqual(late.reason, "DeadlinePassed")
      yield* other.release
      const next = yield* Effect.scoped(Lock.tryAcquire(lock))
      assert.isTrue(Option.isSome(next))
      yield* first.release
    })))

  test("the watchdog keeps a lock alive across many lease periods", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("watchdog"), { watchdog: short })
      const first = yield* hold(Lock.acquire(lock))
      const lost = yield* Effect.fork(Effect.flip(first.lease.lost))
      for (const _ of range(30)) {
        yield* advance(shortMs / 3)
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(lock))), "lock taken while its watchdog runs")
      }
      assert.isTrue(Option.isNone(yield* Fiber.poll(lost)), "lease reported lost while renewed")
      yield* first.release
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

  test("losing the lease interrupts the body with LockLost(NotHeld)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("lost"), { watchdog: short })
      const interrupted = yield* Deferred.make<void>()
      const body = Effect.never.pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
      const fiber = yield* Effect.fork(Lock.withLock(body, lock))
      yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
      assert.isTrue(yield* Lock.forceUnlock(lock))
      yield* advance(shortMs)
      const exit = yield* Fiber.await(fiber)
      const error = failureOf(exit)
      assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "NotHeld", String(exit))
      assert.isTrue(yield* Deferred.isDone(interrupted), "body was not interrupted")
    })))

  test("a fixed lease running out interrupts the body with LockLost(DeadlinePassed)", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("deadline"), { lease: short })
      const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
      yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
      yield* advance(shortMs)
      const error = failureOf(yield* Fiber.await(fiber))
      assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "DeadlinePassed")
    })))

  everyKind("interruption at every step of acquire leaves nothing held or queued", () =>
    withBackend(Effect.gen(function*() {
      for (const steps of range(24)) {
        for (const kind of ["Lock", "FairLock", "Semaphore"] as const) {
          const key = yield* freshKey(`interrupt-${kind}-${steps}`)
          const acquire = kind === "Lock"
            ? Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l))
            : kind === "FairLock"
            ? Effect.flatMap(FairLock.make(key), (l) => Lock.acquire(l))
            : Effect.flatMap(Semaphore.make(key, { limit: 1 }), (s) => Semaphore.acquire(s))
          const stepOnce = live ? Effect.sleep(steps % 6) : Effect.yieldNow()
          // uncontended: the grant is either released on interruption or never made
          const alone = yield* Effect.fork(Effect.scoped(Effect.zipRight(acquire, Effect.never)))
          yield* Effect.repeatN(stepOnce, steps)
          yield* Fiber.interrupt(alone)
          yield* assertFree(key)
          // contended: the interrupted waiter leaves no queue entry and swallows no wake-up
          const first = yield* hold(acquire)
          const interrupted = yield* Effect.fork(Effect.scoped(acquire))
          const next = yield* Effect.fork(Effect.scoped(Effect.asVoid(acquire)))
          yield* Effect.repeatN(stepOnce, steps)
          yield* Fiber.interrupt(interrupted)
          yield* first.release
          yield* Fiber.join(next).pipe(promptly)
          yield* assertFree(key)
        }
      }
    })), 120_000)

  everyKind("a waiter times out with LockTimeout and leaves no queue entry", () =>
    withBackend(Effect.gen(function*() {
      for (const fair of [false, true]) {
        const key = yield* freshKey(`timeout-${fair}`)
        const lock = yield* (fair ? FairLock.make(key) : Lock.make(key))
        const first = yield* hold(Lock.acquire(lock))
        const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock, { timeout: "500 millis" })))
        yield* settle
        yield* advance(500)
        const error = failureOf(yield* Fiber.await(waiter))
        assert.isTrue(Option.isSome(error) && error.value._tag === "LockTimeout")
        assert.deepStrictEqual((yield* inspect(key)).queue, [])
        yield* first.release
        yield* assertFree(key)
      }
    })))

  test("re-entrancy is per fiber: the holder re-enters, fibers it forks and other fibers are excluded", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("reentrant"))
      const go = yield* Deferred.make<void>()
      // forked before the lock is taken: a different holder
      const other = yield* Effect.fork(
        Effect.zipRight(Deferred.await(go), Effect.scoped(Effect.map(Lock.tryAcquire(lock), Option.isSome)))
      )
      yield* Effect.scoped(Effect.gen(function*() {
        const outer = yield* Lock.acquire(lock)
        const inner = yield* Lock.acquire(lock)
        assert.strictEqual(inner.fence, outer.fence)
        assert.strictEqual(inner.holder, outer.holder)
        assert.strictEqual(yield* Lock.holdCount(lock), 2)
        // a fiber forked while holding does not hold the lock: it would run beside its parent
        const child = yield* Effect.fork(Effect.scoped(Effect.flatMap(Lock.tryAcquire(lock), (lease) =>
          Effect.map(Lock.holdCount(lock), (count) => [Option.isSome(lease), count] as const))))
        assert.deepStrictEqual(yield* Fiber.join(child), [false, 0])
        yield* Deferred.succeed(go, undefined)
        assert.isFalse(yield* Fiber.join(other), "another fiber entered a held lock")
        // nested withLock re-enters instead of deadlocking (its body runs in a raced fiber)
        assert.strictEqual(yield* Lock.holdCount(lock).pipe(Lock.withLock(lock), Lock.withLock(lock)), 4)
      }))
      assert.strictEqual(yield* Lock.holdCount(lock), 0)
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

  test("concurrent children each take the lock in turn: they never share their parent's critical section", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("children"))
      const inside = occupancy(1)
      const section = Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        yield* inside.enter(lease)
        yield* settle
        yield* inside.leave(lease)
      }))
      // the children start while the parent holds the lock: they wait, then enter one at a time
      yield* Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        yield* inside.enter(lease)
        const children = yield* Effect.fork(Effect.all(range(4).map(() => section), { concurrency: "unbounded" }))
        yield* settle
        yield* inside.leave(lease)
        return children
      })).pipe(Effect.flatMap((children) => Fiber.join(children).pipe(promptly)))
      assert.deepStrictEqual(inside.state.violations, [])
      assert.strictEqual(inside.state.maxHolders, 1)
    })))

  test("a lock acquired while building a layer is not held by the fibers later run on its runtime", () =>
    Effect.gen(function*() {
      const backend = yield* LockBackend
      const key = yield* freshKey("layer")
      const held = Layer.scopedDiscard(Effect.flatMap(Lock.make(key), (lock) => Lock.acquire(lock)))
      const runtime = yield* Layer.toRuntime(Layer.merge(held, Layer.succeed(LockBackend, backend)))
      const probe = Effect.scoped(Effect.flatMap(Lock.make(key), (lock) => Effect.map(Lock.tryAcquire(lock), Option.isSome)))
      const entered = yield* Effect.promise(() => Runtime.runPromise(runtime)(probe))
      assert.isFalse(entered, "a fiber of the runtime entered the lock its layer holds")
    }).pipe(Effect.scoped, withBackend))

  everyKind("ReadWriteLock: a writer may downgrade, a reader may not upgrade", () =>
    withBackend(Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("downgrade"))
      /** What a fiber with no holds of its own gets: [read granted, write granted]. */
      const outsider = Effect.gen(function*() {
        const go = yield* Deferred.make<void>()
        const fiber = yield* Effect.forkDaemon(Effect.zipRight(
          Deferred.await(go),
          Effect.all([
            Effect.scoped(Effect.map(Lock.tryAcquire(rw.read), Option.isSome)),
            Effect.scoped(Effect.map(Lock.tryAcquire(rw.write), Option.isSome))
          ])
        ))
        return Effect.zipRight(Deferred.succeed(go, undefined), Fiber.join(fiber))
      })
      const whileWriting = yield* outsider
      const afterDowngrade = yield* outsider
      yield* Effect.scoped(Effect.gen(function*() {
        const writeScope = yield* Scope.make()
        const write = yield* Scope.extend(Lock.acquire(rw.write), writeScope)
        const read = yield* Lock.acquire(rw.read)
        assert.strictEqual(read.fence, write.fence)
        assert.deepStrictEqual(yield* whileWriting, [false, false])
        yield* Scope.close(writeScope, Exit.void)
        // downgraded: still a reader, so other readers may enter and writers may not
        assert.strictEqual(yield* Lock.holdCount(rw.read), 1)
        assert.strictEqual(yield* Lock.holdCount(rw.write), 0)
        assert.deepStrictEqual(yield* afterDowngrade, [true, false])
      }))
      // upgrade fails fast instead of waiting for itself
      const upgrade = yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(rw.read)
        return yield* Effect.either(Lock.acquire(rw.write))
      }))
      assert.isTrue(Either.isLeft(upgrade) && upgrade.left._tag === "LockUpgradeNotSupported")
      assert.isFalse(yield* Lock.isLocked(rw.read))
      assert.isFalse(yield* Lock.isLocked(rw.write))
    })))

  everyKind("bad input fails with InvalidLockOptions naming the field, before any backend call", () =>
    Effect.gen(function*() {
      const backend = counting(harness.layer)
      const key = yield* freshKey("invalid")
      const field = <A, E extends { readonly _tag: string }, R>(self: Effect.Effect<A, E, R>) =>
        Effect.map(Effect.flip(self), (e) => (e._tag === "InvalidLockOptions" ? (e as unknown as { field: string }).field : e._tag))
      const bad = (input: unknown) => input as number
      const cases: Array<readonly [Effect.Effect<unknown, { readonly _tag: string }, LockBackend | Scope.Scope>, string]> = [
        [Lock.make(""), "key"],
        [Lock.make("a{b}"), "key"],
        [Lock.make(42 as unknown as string), "key"],
        [Lock.make(key, { lease: 0 }), "lease"],
        [Lock.make(key, { lease: -5 }), "lease"],
        [Lock.make(key, { lease: NaN }), "lease"],
        [Lock.make(key, { lease: Infinity }), "lease"],
        [Lock.make(key, { lease: "0 millis" }), "lease"],
        [Lock.make(key, { lease: bad("soon") }), "lease"],
        [Lock.make(key, { lease: "30 days" }), "lease"],
        [Lock.make(key, { watchdog: 0 }), "watchdog"],
        [Lock.make(key, { watchdog: NaN }), "watchdog"],
        [Lock.make(key, { watchdog: Infinity }), "watchdog"],
        [Lock.make(key, { lease: "10 seconds", watchdog: "10 seconds" }), "watchdog"],
        [Lock.make(key, { lease: "5 millis" }), "lease"],
        [Lock.make(key, { watchdog: 10 }), "watchdog"],
        [FairLock.make(key, { waiterTimeout: -1 }), "waiterTimeout"],
        [ReadWriteLock.make("", {}), "key"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l, { timeout: 0 })), "timeout"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l, { timeout: -1 })), "timeout"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l, { timeout: NaN })), "timeout"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.withLock(Effect.void, l, { timeout: 0 })), "timeout"],
        [Semaphore.make(key, { limit: 0 }), "limit"],
        [Semaphore.make(key, { limit: 1.5 }), "limit"],
        [Semaphore.make(key, { limit: NaN }), "limit"],
        [Semaphore.make(key, { limit: Infinity }), "limit"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.acquire(s, { permits: 0 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.acquire(s, { permits: 4 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.acquire(s, { permits: 1.5 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.tryAcquire(s, { permits: -1 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.withPermits(Effect.void, s, { permits: 9 })), "permits"]
      ]
      for (const [program, expected] of cases) {
        assert.strictEqual(yield* field(Effect.scoped(program)).pipe(Effect.provide(backend.layer)), expected)
      }
      // a negative duration is reported as given, not as the zero it decodes to
      for (const negative of ["-5 seconds", [-1, 0], -5n]) {
        const lease = negative as Duration.DurationInput
        const error = yield* Effect.flip(Lock.make(key, { lease })).pipe(Effect.provide(backend.layer))
        assert.strictEqual(error._tag, "InvalidLockOptions")
        assert.match(error.message, /must be positive, got \[?-/)
      }
      assert.strictEqual(backend.total(), 0, "bad input reached the backend")
    }))

  everyKind("a semaphore with another limit on a held key fails with InvalidLockOptions(limit)", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("limit")
      const three = yield* Semaphore.make(key, { limit: 3 })
      const five = yield* Semaphore.make(key, { limit: 5 })
      const error = yield* Effect.scoped(Effect.gen(function*() {
        yield* Semaphore.acquire(three)
        return yield* Effect.flip(Semaphore.acquire(five))
      }))
      assert.isTrue(error._tag === "InvalidLockOptions" && error.field === "limit", error.message)
      yield* assertFree(key)
    })))

  test("scope close releases exactly once: success, failure, interruption, re-entry", () =>
    Effect.gen(function*() {
      const backend = counting(harness.layer)
      yield* Effect.gen(function*() {
        const key = yield* freshKey("once")
        const lock = yield* Lock.make(key)
        yield* Lock.withLock(Effect.void, lock)
        assert.strictEqual(backend.calls("release"), 1)
        yield* Effect.either(Lock.withLock(Effect.fail("boom"), lock))
        assert.strictEqual(backend.calls("release"), 2)
        const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
        yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
        yield* Fiber.interrupt(fiber)
        assert.strictEqual(backend.calls("release"), 3)
        yield* Effect.scoped(Effect.zipRight(Lock.acquire(lock), Lock.acquire(lock)))
        assert.strictEqual(backend.calls("release"), 5)
        yield* assertFree(key)
      }).pipe(Effect.provide(backend.layer))
    }))

  test("withLock closes the body's scoped resources before the release, also inside Effect.scoped", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("scoped"))
      const log: Array<string> = []
      const body = Effect.gen(function*() {
        yield* Effect.addFinalizer(() =>
          Effect.flatMap(Lock.isLocked(lock), (locked) => Effect.sync(() => log.push(`resource closed, locked: ${locked}`))).pipe(Effect.orDie)
        )
        log.push("body")
      })
      yield* Effect.scoped(Lock.withLock(body, lock))
      yield* body.pipe(Lock.withLock(lock))
      assert.deepStrictEqual(log, ["body", "resource closed, locked: true", "body", "resource closed, locked: true"])
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

  test("withLock's body runs as part of its caller: the fiber refs it sets are seen after it, as inline", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("refs"))
      const ref = FiberRef.unsafeMake(0)
      // a body that changes no fiber ref leaves the caller's as they were
      yield* Lock.withLock(Effect.void, lock)
      assert.strictEqual(yield* FiberRef.get(ref), 0)
      // one that does hands the change on, also through a nested (re-entrant) withLock
      yield* Lock.withLock(FiberRef.set(ref, 1), lock)
      assert.strictEqual(yield* FiberRef.get(ref), 1)
      yield* Lock.withLock(Lock.withLock(FiberRef.update(ref, (n) => n + 1), lock), lock)
      assert.strictEqual(yield* FiberRef.get(ref), 2)
      // a failing body too: its change is kept with the failure, as an inline body's would be
      const failed = yield* Effect.either(Lock.withLock(Effect.zipRight(FiberRef.set(ref, 3), Effect.fail("boom")), lock))
      assert.deepStrictEqual(failed, Either.left("boom"))
      assert.strictEqual(yield* FiberRef.get(ref), 3)
      // and the lock is free after each of them, held by nobody
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

  test("a lease reports the time left and renewals extend it", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("expires"), { watchdog: "3 seconds" })
      yield* Effect.scoped(Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        const initial = Duration.toMillis(yield* lease.expiresIn)
        assert.isTrue(initial > 2_000 && initial <= 3_000, `expiresIn ${initial}`)
        const ttl = yield* Lock.remainingTtl(lock)
        assert.isTrue(Option.isSome(ttl) && Duration.toMillis(ttl.value) <= 3_000 && Duration.toMillis(ttl.value) > 2_000)
        yield* advance(2_500)
        // renewed at least once in between: the deadline moved on
        const later = Duration.toMillis(yield* lease.expiresIn)
        assert.isTrue(later > 1_000, `expiresIn after renewals ${later}`)
      }))
      assert.isTrue(Option.isNone(yield* Lock.remainingTtl(lock)))
    })))

  if (!live) {
    everyKind(`the backend follows the reference model (${harness.modelRuns ?? 200} model-based runs)`, () =>
      withBackend(ModelCheck.run({ advance: (ms) => TestClock.adjust(ms), numRuns: harness.modelRuns ?? 200 })), 120_000)
  } else {
    // Live: the backend keeps its own time, so no time is advanced, leases are long (60 s+) and
    // durations are compared within a tolerance. 200 runs of up to 40 commands take a few seconds
    // on a local redis-server.
    const runs = harness.modelRuns ?? 200
    const maxCommands = 40
    const toleranceMs = 1_000
    everyKind(
      `the backend follows the reference model (${runs} model-based runs of up to ${maxCommands} commands, live timing ±${toleranceMs} ms)`,
      () => withBackend(ModelCheck.run({ timing: { toleranceMs }, numRuns: runs, maxCommands })),
      120_000
    )
  }

  test("a lease acquired in a child fiber (Effect.timeout) is re-entered by the parent", () =>
    withBackend(Effect.gen(function*() {
      const lock = yield* Lock.make(yield* freshKey("child"))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock).pipe(Effect.timeout("5 seconds"))
        assert.strictEqual(yield* Lock.holdCount(lock), 1)
        assert.strictEqual(yield* Lock.holdCount(lock).pipe(Lock.withLock(lock, { timeout: "1 second" })), 2)
      }))
      assert.isFalse(yield* Lock.isLocked(lock))
    })))

  test("re-entering a hold that was lost starts afresh and reports the loss", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("stale")
      const lock = yield* Lock.make(key)
      // another holder, forked before this fiber holds anything
      const go = yield* Deferred.make<void>()
      const otherFence = yield* Effect.fork(
        Effect.zipRight(Deferred.await(go), Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
      )
      yield* Effect.scoped(Effect.gen(function*() {
        const outer = yield* Lock.acquire(lock)
        const outerLost = yield* Effect.fork(Effect.flip(outer.lost))
        assert.isTrue(yield* Lock.forceUnlock(lock))
        yield* Deferred.succeed(go, undefined)
        const fence = yield* Fiber.join(otherFence)
        assert.isAbove(fence, outer.fence)
        const inner = yield* Lock.acquire(lock)
        assert.notStrictEqual(inner.holder, outer.holder)
        assert.isAbove(inner.fence, fence)
        const error = yield* Fiber.join(outerLost)
        assert.strictEqual(error.reason, "NotHeld")
        const state = yield* inspect(key)
        assert.deepStrictEqual(state.holders.map((h) => [h.holder, h.exclusive]), [[inner.holder, 1]])
      }))
      yield* assertFree(key)
    })))

  test("a renewal that dies does not stop the deadline: lost fails with DeadlinePassed", () =>
    Effect.gen(function*() {
      const dying = Layer.effect(
        LockBackend,
        Effect.map(LockBackend, (backend): Service => ({ ...backend, renew: () => Effect.dieMessage("renewal exploded") }))
      ).pipe(Layer.provide(harness.layer))
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(yield* freshKey("defect"), { watchdog: short })
        const fiber = yield* Effect.fork(Lock.withLock(Effect.never, lock))
        yield* Lock.isLocked(lock).pipe(Effect.zipLeft(settle), Effect.repeat({ until: (locked) => locked }))
        yield* advance(shortMs)
        const error = failureOf(yield* Fiber.await(fiber))
        assert.isTrue(Option.isSome(error) && error.value._tag === "LockLost" && error.value.reason === "DeadlinePassed")
      }).pipe(Effect.provide(dying))
    }))

  everyKind("freed capacity reaches every shared waiter that fits, not only the first one woken", () =>
    withBackend(Effect.gen(function*() {
      // semaphore: a 3-permit waiter queued before a 1-permit waiter; one permit frees up
      const sem = yield* Semaphore.make(yield* freshKey("capacity"), { limit: 3 })
      const one = yield* hold(Semaphore.acquire(sem, { permits: 1 }))
      const two = yield* hold(Semaphore.acquire(sem, { permits: 2 }))
      const big = yield* Effect.fork(Effect.scoped(Semaphore.acquire(sem, { permits: 3 })))
      yield* settle
      const small = yield* Effect.fork(Effect.scoped(Semaphore.acquire(sem, { permits: 1 })))
      yield* settle
      yield* one.release
      // the holders' leases are 30 s: only a wake-up can end this wait in time
      yield* Fiber.join(small).pipe(promptly)
      yield* two.release
      yield* Fiber.join(big).pipe(promptly)
      // read-write: a writer holds; R1, W2, R3 wait; both readers enter when the writer leaves
      const rw = yield* ReadWriteLock.make(yield* freshKey("readers"))
      const writer = yield* hold(Lock.acquire(rw.write))
      const r1 = yield* hold(Lock.acquire(rw.read)).pipe(Effect.fork)
      yield* settle
      const w2 = yield* Effect.fork(Effect.scoped(Lock.acquire(rw.write)))
      yield* settle
      const r3 = yield* hold(Lock.acquire(rw.read)).pipe(Effect.fork)
      yield* settle
      yield* writer.release
      const reader1 = yield* Fiber.join(r1).pipe(promptly)
      const reader3 = yield* Fiber.join(r3).pipe(promptly)
      yield* reader1.release
      yield* reader3.release
      yield* Fiber.join(w2).pipe(promptly)
    })))

  everyKind("a fair waiter that stops heartbeating is dropped once its queue entry expires", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("ghost")
      const lock = yield* FairLock.make(key, { waiterTimeout: "600 millis" })
      const backend = yield* LockBackend
      const first = yield* hold(Lock.acquire(lock))
      // a waiter that queues once and dies: it never retries and never cancels
      const ghost = `${backend.clientId}:ghost`
      const queued = yield* backend.acquire({
        key,
        holder: ghost,
        mode: "exclusive",
        permits: 1,
        limit: 1,
        leaseMs: 30_000,
        fair: true,
        waiterTtlMs: 600,
        count: 1
      })
      assert.strictEqual(queued._tag, "Denied")
      const waiter = yield* Effect.fork(Effect.scoped(Effect.asVoid(Lock.acquire(lock))))
      yield* settle
      yield* first.release
      yield* settle
      assert.isTrue(Option.isNone(yield* Fiber.poll(waiter)), "granted past a live queue entry ahead of it")
      yield* advance(600)
      yield* Fiber.join(waiter).pipe(promptly)
      assert.isFalse((yield* inspect(key)).queue.some((w) => w.holder === ghost))
    })))

  everyKind("a fair attempt whose reply is lost leaves no queue entry behind", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("lost-reply")
      // the first attempt of the second acquirer is queued by the backend, but its reply is lost
      const lossy = FaultyBackend.failingLayer({ operation: "acquire", when: (n) => n === 2, timing: "after" })(harness.layer)
      yield* Effect.gen(function*() {
        const lock = yield* FairLock.make(key)
        const first = yield* hold(Lock.acquire(lock))
        const error = yield* Effect.flip(Effect.scoped(Lock.acquire(lock)))
        assert.strictEqual(error._tag, "BackendError")
        assert.deepStrictEqual((yield* inspect(key)).queue, [])
        yield* first.release
        yield* assertFree(key)
      }).pipe(Effect.provide(lossy))
    }))

  // ---------------------------------------------------------------------------------------------
  // Faults: every operation may be delivered twice or late, a reply may be lost, a call may be
  // slow enough for an interruption to land while it is in flight, and the backend may lose its
  // data. A lock stays safe and leaves nothing held behind.

  /** Lets `ms` pass: real time live, TestClock time otherwise. */
  const elapse = (ms: number) => (live ? Effect.sleep(ms) : TestClock.adjust(ms))
  const onLayer = <ROut>(layer: Layer.Layer<ROut>) => <A, E>(self: Effect.Effect<A, E, ROut>) => Effect.provide(self, layer)
  /** Whether a fiber other than the caller can take the lock right now (it releases at once). */
  const othersCanTake = (lock: Lock.Lock) =>
    Effect.flatMap(Effect.fork(Effect.scoped(Effect.map(Lock.tryAcquire(lock), Option.isSome))), Fiber.join)

  test("a release delivered twice takes one hold: the outer hold stays", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("release-twice")
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(lock)
          yield* Effect.scoped(Lock.acquire(lock))
          assert.strictEqual(yield* Lock.holdCount(lock), 1)
          assert.isFalse(yield* othersCanTake(lock), "another fiber took a lock whose outer hold is open")
        }))
        yield* assertFree(key)
      }).pipe(onLayer(FaultyBackend.duplicatingLayer({ operation: "release", when: 1 })(harness.layer)))
    }))

  everyKind("an acquisition delivered twice takes one hold: nothing is left after the release", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("acquire-twice")
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(lock)
          yield* Lock.acquire(lock)
          assert.strictEqual(yield* Lock.holdCount(lock), 2)
        }))
        yield* assertFree(key)
        const sem = yield* Semaphore.make(`${key}-s`, { limit: 2 })
        yield* Effect.scoped(Semaphore.acquire(sem, { permits: 2 }))
        yield* assertFree(`${key}-s`)
      }).pipe(onLayer(FaultyBackend.duplicatingLayer({ operation: "acquire", when: 1 })(harness.layer)))
    }))

  everyKind("a late copy of an acquisition, arriving after its holder released, grants nothing", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("late-copy")
      const late = FaultyBackend.duplicatingLayer({ operation: ["acquire", "cancel"], when: 1, copyAfter: shortMs })
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        yield* Effect.scoped(Lock.acquire(lock))
        const fair = yield* FairLock.make(`${key}-fair`)
        const first = yield* hold(Lock.acquire(fair))
        // a try-acquire queues, is denied, and leaves the queue; both copies arrive late
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(fair))))
        yield* first.release
        yield* elapse(shortMs * 2)
        yield* Effect.yieldNow()
        if (live) yield* settle
        yield* assertFree(key)
        yield* assertFree(`${key}-fair`)
      }).pipe(onLayer(late(harness.layer)))
    }))

  test("an acquisition whose reply was lost leaves nothing held", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("lost-grant")
      const lossy = FaultyBackend.failingLayer({ operation: "acquire", when: (n) => n === 1 || n === 3, timing: "after" })
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        assert.strictEqual((yield* Effect.flip(Effect.scoped(Lock.acquire(lock))))._tag, "BackendError")
        yield* assertFree(key)
        // a re-entry whose reply is lost leaves the outer hold as it was
        yield* Effect.scoped(Effect.gen(function*() {
          yield* Lock.acquire(lock)
          assert.strictEqual((yield* Effect.flip(Lock.acquire(lock)))._tag, "BackendError")
          const [state] = (yield* inspect(key)).holders
          assert.strictEqual(state?.exclusive, 1)
        }))
        yield* assertFree(key)
      }).pipe(onLayer(lossy(harness.layer)))
    }))

  test("an interruption while a grant is in flight releases it at once (Effect.timeout, Effect.race)", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("in-flight")
      const slowMs = live ? 300 : 200
      yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        // the caller's scope stays open: the grant must not be attached to it
        const timedOut = yield* Effect.fork(Lock.acquire(lock).pipe(Effect.timeout(slowMs / 4), Effect.option))
        yield* elapse(slowMs / 2)
        yield* elapse(slowMs)
        assert.isTrue(Option.isNone(yield* Fiber.join(timedOut)), "the acquisition should have timed out")
        const raced = yield* Effect.fork(Effect.race(Lock.acquire(lock), Effect.delay(Effect.succeed("other"), slowMs / 4)))
        yield* elapse(slowMs / 2)
        yield* elapse(slowMs)
        assert.strictEqual(yield* Fiber.join(raced), "other")
        yield* assertFree(key)
        // the same fiber takes the lock afresh
        const again = yield* Effect.fork(Lock.tryAcquire(lock))
        yield* elapse(slowMs)
        assert.isTrue(Option.isSome(yield* Fiber.join(again)))
      })).pipe(onLayer(FaultyBackend.slowLayer({ operation: "acquire", delay: slowMs })(harness.layer)))
      yield* assertFree(key).pipe(withBackend)
    }))

  test("a lease lost to its deadline is dead: no more renewals, released, and taken afresh", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("dead-lease")
      // every renewal is carried out, but its reply is lost
      const deaf = FaultyBackend.failingLayer({ operation: "renew", when: 1, timing: "after" })
      yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* Lock.make(key, { watchdog: short })
        const lease = yield* Lock.acquire(lock)
        const lost = yield* Effect.fork(Effect.flip(lease.lost))
        yield* elapse(shortMs * 2)
        const error = yield* Fiber.join(lost).pipe(promptly)
        assert.strictEqual(error.reason, "DeadlinePassed")
        if (live) yield* settle
        // the scope is still open, yet the key is free and stays free
        yield* assertFree(key)
        yield* elapse(shortMs * 2)
        yield* assertFree(key)
        // the same fiber takes it as a new holder
        const fresh = yield* Lock.tryAcquire(lock)
        assert.isTrue(Option.isSome(fresh))
        assert.notStrictEqual(Option.getOrThrow(fresh).holder, lease.holder)
      })).pipe(onLayer(deaf(harness.layer)))
    }))

  everyKind("a request that would wait for the current fiber's own hold fails with SelfDeadlock", () =>
    withBackend(Effect.gen(function*() {
      const key = yield* freshKey("self")
      const lock = yield* Lock.make(key)
      const sem = yield* Semaphore.make(key, { limit: 2 })
      // in this fiber, which holds the key (a forked fiber would not); time passes beside it
      const attempt = <E>(self: Effect.Effect<unknown, E, Scope.Scope>) =>
        Effect.gen(function*() {
          const clock = yield* Effect.fork(elapse(shortMs * 2))
          const error = yield* Effect.scoped(Effect.flip(self))
          yield* Fiber.interrupt(clock)
          return error
        })
      const tagOf = (e: unknown) => (e as { readonly _tag: string })._tag
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Semaphore.acquire(sem)
        assert.strictEqual(tagOf(yield* attempt(Lock.acquire(lock, { timeout: short }))), "SelfDeadlock")
        assert.strictEqual(tagOf(yield* attempt(Semaphore.acquire(sem, { permits: 2, timeout: short }))), "SelfDeadlock")
      }))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock)
        assert.strictEqual(tagOf(yield* attempt(Semaphore.acquire(sem, { timeout: short }))), "SelfDeadlock")
      }))
      yield* assertFree(key)
    })))

  everyKind("after the backend lost its data, fences still go up and a re-entry into the lost hold is detected", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("data-loss")
      yield* Effect.scoped(Effect.gen(function*() {
        const control = yield* FaultyBackend.DataLoss
        const lock = yield* Lock.make(key)
        const before = yield* Lock.acquire(lock)
        yield* control.wipe
        // a restarted server's clock has moved on
        yield* elapse(1)
        const other = yield* hold(Lock.acquire(lock))
        assert.isAbove(other.lease.fence, before.fence)
        yield* other.release
        // re-entering the hold the backend forgot starts afresh and reports the loss
        const lost = yield* Effect.fork(Effect.flip(before.lost))
        const again = yield* Lock.acquire(lock)
        assert.notStrictEqual(again.holder, before.holder)
        assert.isAbove(again.fence, other.lease.fence)
        assert.strictEqual((yield* Fiber.join(lost).pipe(promptly)).reason, "NotHeld")
        // so is a writer taking the read lock of a key the backend forgot
        const rw = yield* ReadWriteLock.make(`${key}-rw`)
        const writer = yield* Lock.acquire(rw.write)
        yield* control.wipe
        yield* elapse(1)
        const writerLost = yield* Effect.fork(Effect.flip(writer.lost))
        const reader = yield* Lock.acquire(rw.read)
        assert.notStrictEqual(reader.holder, writer.holder)
        assert.isAbove(reader.fence, writer.fence)
        assert.strictEqual((yield* Fiber.join(writerLost).pipe(promptly)).reason, "NotHeld")
      })).pipe(onLayer(harness.dataLoss ?? FaultyBackend.losingData(harness.layer)))
    }))

  const everyOperation: ReadonlyArray<FaultyBackend.Operation> = [
    "acquire",
    "release",
    "renew",
    "cancel",
    "forceRelease",
    "latchSetCount",
    "latchCountDown"
  ]

  everyKind("the backend follows the reference model with every request delivered twice", () => {
    const twice = FaultyBackend.duplicatingLayer({ operation: everyOperation, when: 1 })(harness.layer)
    const runs = Math.max(20, Math.floor((harness.modelRuns ?? 200) / 4))
    return Effect.provide(
      live
        ? ModelCheck.run({ timing: { toleranceMs: 1_000 }, numRuns: runs, maxCommands: 40 })
        : ModelCheck.run({ advance: (ms) => TestClock.adjust(ms), numRuns: runs }),
      twice
    )
  }, 120_000)

  everyKind("contention under at-least-once delivery: history checked, nothing left held", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("faulty-contend")
      const faulty = FaultyBackend.duplicatingLayer({ operation: everyOperation, when: 0.5 })(harness.layer)
      yield* withHistory(Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        const fair = yield* FairLock.make(`${key}-fair`)
        const plain = yield* contend(30, 1, () => Lock.acquire(lock))
        const fifo = yield* contend(30, 1, () => Lock.acquire(fair))
        assert.strictEqual(plain.maxHolders, 1)
        assert.strictEqual(fifo.maxHolders, 1)
        assertStrictlyIncreasing(plain.fences)
        assertStrictlyIncreasing(fifo.fences)
        yield* assertFree(key)
        yield* assertFree(`${key}-fair`)
      }), faulty)
      // shared holders overlap, so the order their (re-sent) grants are seen in says nothing
      // about fences: permits are checked by occupancy instead
      yield* Effect.gen(function*() {
        const sem = yield* Semaphore.make(`${key}-sem`, { limit: 3 })
        const shared = yield* contend(30, 3, () => Semaphore.acquire(sem, { permits: 1 }))
        assert.isAtMost(shared.maxPermits, 3)
        yield* assertFree(`${key}-sem`)
      }).pipe(onLayer(faulty))
    }), 120_000)

  test("60 fibers while replies are lost: failed attempts leave nothing held, the history stays clean", () =>
    Effect.gen(function*() {
      const key = yield* freshKey("lossy-contend")
      // one acquisition and one release in five is carried out, but its reply is lost
      const lossy = FaultyBackend.failingLayer({ operation: ["acquire", "release"], when: (n) => n % 5 === 0, timing: "after" })
      yield* withHistory(Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        const retrying = Lock.acquire(lock).pipe(Effect.retry({ while: (e) => e._tag === "BackendError" }))
        const result = yield* contend(60, 1, () => retrying)
        assert.strictEqual(result.maxHolders, 1)
        yield* assertFree(key)
      }), lossy(harness.layer))
    }), 120_000)

  const kit = { live, advance, assertFree, freshKey, handOff, hold, promptly, settle, shortMs, waiterTimeout, withBackend }
  MultiLockConformance.register(kit, everyKind)
  LatchConformance.register(kit, everyKind)
}
