import { assert, describe, it } from "@effect/vitest"
import { Clock, Duration, Effect, Either, Exit, Fiber, Layer, Option, Scope, TestClock } from "effect"
import { forceReleaseMemoryMs, LockBackend } from "@lockstep/core/LockBackend"
import type { AcquireRequest, AcquireResult, HoldMode, ReleaseRequest, Service, Subscription } from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"
import { MemoryBackend } from "@lockstep/memory"
import { unsafeMake } from "../src/internal/memoryBackend.js"

const KEY = "k"

const request = (holder: string, overrides: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key: KEY,
  holder,
  mode: "exclusive",
  permits: 1,
  limit: 1,
  leaseMs: 1000,
  fair: false,
  waiterTtlMs: 100,
  // 0: filled in by `counted` from the backend's state, as a lock API would send it
  count: 0,
  ...overrides
})

/** A release as a lock API sends it; `counted` fills in the holder's current count. */
const rel = (holder: string, mode: HoldMode = "exclusive", key = KEY): ReleaseRequest => ({
  key,
  holder,
  mode,
  count: 0,
  leaseMs: 1000
})

/**
 * The backend, with the counts of requests that leave them at 0 filled in from its state: an
 * acquisition takes the holder's count + 1, a release starts from the holder's count.
 */
const counted = (backend: Service): Service => {
  const countOf = (key: string, holder: string, mode: HoldMode) =>
    Effect.map(backend.inspect(key), (state) => {
      const hold = state.holders.find((h) => h.holder === holder)
      return hold === undefined ? 0 : mode === "exclusive" ? hold.exclusive : hold.shared
    })
  return {
    ...backend,
    acquire: (r) =>
      r.count !== 0
        ? backend.acquire(r)
        : Effect.flatMap(countOf(r.key, r.holder, r.mode), (count) => backend.acquire({ ...r, count: count + 1 })),
    release: (r) =>
      r.count !== 0
        ? backend.release(r)
        : Effect.flatMap(countOf(r.key, r.holder, r.mode), (count) => backend.release({ ...r, count: Math.max(1, count) }))
  }
}

const read = (holder: string, overrides: Partial<AcquireRequest> = {}) =>
  request(holder, { mode: "shared", limit: Infinity, ...overrides })

const fair = (holder: string, overrides: Partial<AcquireRequest> = {}) => request(holder, { fair: true, ...overrides })

const granted = (result: AcquireResult) => {
  assert.strictEqual(result._tag, "Granted")
  return result as Extract<AcquireResult, { _tag: "Granted" }>
}

const denied = (result: AcquireResult) => {
  assert.strictEqual(result._tag, "Denied")
  return result as Extract<AcquireResult, { _tag: "Denied" }>
}

/** Lets forked fibers run until they block. */
const settle = Effect.yieldNow().pipe(Effect.repeatN(20))

/** Forks `await` and reports, after everything settled, whether it completed. */
const awaitFork = (sub: Subscription) => Effect.fork(sub.await)
const isDone = <A, E>(fiber: Fiber.Fiber<A, E>) =>
  settle.pipe(Effect.zipRight(Fiber.poll(fiber)), Effect.map(Option.isSome))

/** A waiter as a lock API would write it: subscribe first, then retry until granted. */
const waitFor = (backend: Service, req: AcquireRequest) =>
  Effect.gen(function* () {
    const sub = yield* backend.subscribe(req.key, req.holder, req.mode)
    while (true) {
      const result = yield* backend.acquire(req)
      if (result._tag === "Granted") return result
      yield* sub.await
    }
  }).pipe(Effect.scoped)

/** The backend's clock in microseconds: the floor of every new fence. */
const clockMicros = Effect.map(Clock.currentTimeNanos, (nanos) => Number(nanos / 1000n))

const nothingStored = { keys: 0, subscribedKeys: 0, subscriptions: 0, fences: 0, ended: 0 }

const fresh = Effect.sync(() => {
  const made = unsafeMake("test-client")
  return { service: counted(made.service), sizes: made.sizes }
})

describe("MemoryBackend", () => {
  describe("constructors", () => {
    it.effect("make gives independent backends with UUID client ids", () =>
      Effect.gen(function* () {
        const a = yield* MemoryBackend.make
        const b = yield* MemoryBackend.make
        assert.match(a.clientId, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
        assert.notStrictEqual(a.clientId, b.clientId)
        granted(yield* a.acquire(request("a:1")))
        // b shares no state with a
        granted(yield* b.acquire(request("b:1")))
      }))

    it.effect("layer provides LockBackend", () =>
      Effect.gen(function* () {
        const backend = yield* LockBackend
        granted(yield* backend.acquire(request("a:1")))
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual(state.holders.map((h) => h.holder), ["a:1"])
      }).pipe(Effect.provide(Layer.fresh(MemoryBackend.layer))))
  })

  describe("exclusive", () => {
    it.effect("excludes other holders and reports the wait", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        yield* TestClock.adjust(300)
        assert.strictEqual(denied(yield* backend.acquire(request("b:1"))).retryAfterMs, 700)
        // a shared request is excluded too
        assert.strictEqual(denied(yield* backend.acquire(read("b:1"))).retryAfterMs, 700)
      }))

    it.effect("re-entry counts up, keeps the fence and extends the expiry to the max", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const first = granted(yield* backend.acquire(request("a:1")))
        assert.strictEqual(first.count, 1)
        yield* TestClock.adjust(500)
        const second = granted(yield* backend.acquire(request("a:1", { leaseMs: 100 })))
        assert.deepStrictEqual(second, { _tag: "Granted", fence: first.fence, count: 2 })
        // a shorter lease never shortens the expiry
        assert.strictEqual((yield* backend.inspect(KEY)).holders[0]?.ttlMs, 500)
        granted(yield* backend.acquire(request("a:1", { leaseMs: 1000 })))
        assert.strictEqual((yield* backend.inspect(KEY)).holders[0]?.ttlMs, 1000)
        assert.strictEqual(yield* backend.release(rel("a:1", "exclusive")), 2)
        assert.strictEqual(yield* backend.release(rel("a:1", "exclusive")), 1)
        denied(yield* backend.acquire(request("b:1")))
        assert.strictEqual(yield* backend.release(rel("a:1", "exclusive")), 0)
        granted(yield* backend.acquire(request("b:1")))
      }))

    it.effect("fences increase strictly across holders, expiry and an emptied key", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        const a = granted(yield* backend.acquire(request("a:1")))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.deepStrictEqual(yield* backend.inspect(KEY), {
          key: KEY,
          fence: a.fence,
          limit: undefined,
          holders: [],
          queue: []
        })
        // the key remembers its fence and its ended holder for a lease, then nothing
        assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 0, subscriptions: 0, fences: 1, ended: 1 })
        const b = granted(yield* backend.acquire(request("b:1")))
        assert.isTrue(b.fence > a.fence)
        yield* TestClock.adjust(1000)
        const c = granted(yield* backend.acquire(request("c:1")))
        assert.isTrue(c.fence > b.fence)
        // never below the clock in microseconds (the TestClock is at 1000 ms now, past b's fence)
        assert.strictEqual(c.fence, yield* clockMicros)
        const d = granted(yield* backend.acquire(request("d:1", { key: "other" })))
        assert.strictEqual(d.fence, yield* clockMicros)
        assert.strictEqual((yield* backend.inspect(KEY)).fence, c.fence)
        // idle for a lease, and the clock past the fence: forgotten, and the next one still greater
        yield* backend.release(rel("c:1", "exclusive"))
        yield* backend.release(rel("d:1", "exclusive", "other"))
        yield* TestClock.adjust(1000)
        assert.strictEqual((yield* backend.inspect(KEY)).fence, 0)
        yield* backend.inspect("other")
        assert.deepStrictEqual(sizes(), { keys: 0, subscribedKeys: 0, subscriptions: 0, fences: 0, ended: 0 })
        assert.isAbove(granted(yield* backend.acquire(request("e:1"))).fence, c.fence)
      }))

    it.effect("upgrading a shared hold fails with LockUpgradeNotSupported and changes nothing", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(read("a:1")))
        const error = yield* Effect.flip(backend.acquire(request("a:1")))
        assert.instanceOf(error, LockError.LockUpgradeNotSupported)
        assert.deepStrictEqual([error.key, error.holder], [KEY, "a:1"])
        const [holder] = (yield* backend.inspect(KEY)).holders
        assert.strictEqual(holder?.shared, 1)
        assert.strictEqual(holder?.exclusive, 0)
      }))
  })

  describe("shared", () => {
    it.effect("read locks share, exclude writers, and re-enter", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const r1 = granted(yield* backend.acquire(read("r:1")))
        yield* TestClock.adjust(200)
        const r2 = granted(yield* backend.acquire(read("r:2")))
        assert.isTrue(r2.fence > r1.fence)
        assert.deepStrictEqual(granted(yield* backend.acquire(read("r:1"))), { _tag: "Granted", fence: r1.fence, count: 2 })
        // the writer waits for the earliest reader: r:1, extended to 200 + 1000 by its re-entry
        assert.strictEqual(denied(yield* backend.acquire(request("w:1"))).retryAfterMs, 1000)
        const state = yield* backend.inspect(KEY)
        assert.strictEqual(state.limit, Infinity)
        assert.deepStrictEqual(state.holders.map((h) => [h.holder, h.shared, h.permits]), [["r:1", 2, 1], ["r:2", 1, 1]])
      }))

    it.effect("a semaphore grants permits up to its limit", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const sem = (holder: string, permits: number) => request(holder, { mode: "shared", permits, limit: 3 })
        granted(yield* backend.acquire(sem("a:1", 2)))
        yield* TestClock.adjust(100)
        granted(yield* backend.acquire(sem("b:1", 1)))
        // full: the earliest holder to expire (a:1, at 1000) may free enough
        assert.strictEqual(denied(yield* backend.acquire(sem("c:1", 1))).retryAfterMs, 900)
        assert.strictEqual((yield* backend.inspect(KEY)).limit, 3)
        yield* backend.release(rel("b:1", "shared"))
        granted(yield* backend.acquire(sem("c:1", 1)))
        denied(yield* backend.acquire(sem("d:1", 1)))
      }))

    it.effect("a request naming another limit fails while the key has shared holders", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1", { mode: "shared", limit: 3 })))
        const error = yield* Effect.flip(backend.acquire(request("b:1", { mode: "shared", limit: 4 })))
        assert.strictEqual(error._tag, "InvalidLockOptions")
        assert.strictEqual(error._tag === "InvalidLockOptions" && error.field, "limit")
        // the holder itself cannot switch limits either
        assert.strictEqual((yield* Effect.flip(backend.acquire(read("a:1"))))._tag, "InvalidLockOptions")
        yield* backend.release(rel("a:1", "shared"))
        assert.strictEqual((yield* backend.inspect(KEY)).limit, undefined)
        granted(yield* backend.acquire(request("b:1", { mode: "shared", limit: 4 })))
        assert.strictEqual((yield* backend.inspect(KEY)).limit, 4)
      }))

    it.effect("the limit is forgotten when the last shared hold ends, even if the key stays held", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("w:1")))
        granted(yield* backend.acquire(request("w:1", { mode: "shared", limit: 3 })))
        assert.strictEqual((yield* backend.inspect(KEY)).limit, 3)
        yield* backend.release(rel("w:1", "shared"))
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders.length, state.limit], [1, undefined])
        assert.deepStrictEqual([state.holders[0]?.exclusive, state.holders[0]?.shared, state.holders[0]?.permits], [1, 0, 0])
        granted(yield* backend.acquire(request("w:1", { mode: "shared", limit: 5 })))
      }))

    it.effect("more permits than the limit fail instead of waiting forever", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const error = yield* Effect.flip(backend.acquire(request("a:1", { mode: "shared", permits: 3, limit: 2 })))
        assert.strictEqual(error._tag === "InvalidLockOptions" && error.field, "permits")
      }))

    it.effect("a writer may downgrade: it keeps its fence and readers enter after the write hold ends", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const w = granted(yield* backend.acquire(request("w:1")))
        assert.deepStrictEqual(granted(yield* backend.acquire(read("w:1"))), { _tag: "Granted", fence: w.fence, count: 1 })
        denied(yield* backend.acquire(read("r:1")))
        assert.strictEqual(yield* backend.release(rel("w:1", "exclusive")), 0)
        const [holder] = (yield* backend.inspect(KEY)).holders
        assert.deepStrictEqual([holder?.exclusive, holder?.shared, holder?.fence], [0, 1, w.fence])
        granted(yield* backend.acquire(read("r:1")))
        // now a pure reader again: no upgrade back
        assert.strictEqual((yield* Effect.flip(backend.acquire(request("w:1"))))._tag, "LockUpgradeNotSupported")
      }))

    it.effect("a downgrade skips the fair queue of waiters blocked by the writer itself", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(fair("w:1")))
        denied(yield* backend.acquire(read("r:1", { fair: true })))
        granted(yield* backend.acquire(read("w:1", { fair: true })))
      }))
  })

  describe("release", () => {
    it.effect("release by a non-holder is NotHeld; in a mode not held it is a copy: neither changes a hold", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const before = yield* backend.inspect(KEY)
        const foreign = yield* Effect.flip(backend.release(rel("b:1", "exclusive")))
        assert.instanceOf(foreign, LockError.NotHeld)
        assert.deepStrictEqual([foreign.key, foreign.holder], [KEY, "b:1"])
        // a count below the caller's reads as a copy of a release already applied
        assert.strictEqual(yield* backend.release({ ...rel("a:1", "shared"), count: 1 }), 0)
        assert.deepStrictEqual(yield* backend.inspect(KEY), before)
        // an expired hold is not held either
        yield* TestClock.adjust(1000)
        assert.strictEqual((yield* Effect.flip(backend.release(rel("a:1", "exclusive"))))._tag, "NotHeld")
      }))
  })

  describe("expiry and renewal", () => {
    it.effect("a holder is dropped when its lease ends on the Effect clock", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        yield* TestClock.adjust(999)
        assert.strictEqual(denied(yield* backend.acquire(request("b:1"))).retryAfterMs, 1)
        assert.strictEqual((yield* backend.inspect(KEY)).holders[0]?.ttlMs, 1)
        yield* TestClock.adjust(1)
        assert.deepStrictEqual((yield* backend.inspect(KEY)).holders, [])
        granted(yield* backend.acquire(request("b:1")))
      }))

    it.effect("renew extends live holds and reports lost ones", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        granted(yield* backend.acquire(read("r:1", { key: "other" })))
        yield* TestClock.adjust(900)
        assert.deepStrictEqual(
          yield* backend.renew([
            { key: KEY, holder: "a:1", leaseMs: 1000 },
            { key: KEY, holder: "b:1", leaseMs: 1000 },
            { key: "other", holder: "r:1", leaseMs: 50 }
          ]),
          [Either.right(true), Either.right(false), Either.right(true)]
        )
        // renew never shortens: r:1 keeps its original 100 ms left
        assert.strictEqual((yield* backend.inspect("other")).holders[0]?.ttlMs, 100)
        yield* TestClock.adjust(600)
        assert.strictEqual(denied(yield* backend.acquire(request("b:1"))).retryAfterMs, 400)
        yield* TestClock.adjust(400)
        assert.deepStrictEqual(yield* backend.renew([{ key: KEY, holder: "a:1", leaseMs: 1000 }]), [Either.right(false)])
        granted(yield* backend.acquire(request("b:1")))
      }))
  })

  describe("fair queue", () => {
    it.effect("grants in arrival order and accounts for waiters ahead", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(fair("a:1")))
        // b:1 is head: only the holder blocks it
        assert.strictEqual(denied(yield* backend.acquire(fair("b:1"))).retryAfterMs, 1000)
        // c:1 also waits on b:1's queue entry (ttl 100)
        assert.strictEqual(denied(yield* backend.acquire(fair("c:1"))).retryAfterMs, 100)
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue.map((w) => w.holder), ["b:1", "c:1"])
        yield* backend.release(rel("a:1", "exclusive"))
        denied(yield* backend.acquire(fair("c:1")))
        granted(yield* backend.acquire(fair("b:1")))
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue.map((w) => w.holder), ["c:1"])
        // a non-fair request ignores the queue
        yield* backend.release(rel("b:1", "exclusive"))
        granted(yield* backend.acquire(request("x:1")))
      }))

    it.effect("a retry refreshes the entry; a waiter that stops retrying is dropped", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(fair("a:1")))
        denied(yield* backend.acquire(fair("b:1")))
        denied(yield* backend.acquire(fair("c:1")))
        yield* TestClock.adjust(60)
        denied(yield* backend.acquire(fair("c:1")))
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue, [{ holder: "b:1", ttlMs: 40 }, { holder: "c:1", ttlMs: 100 }])
        yield* TestClock.adjust(40)
        // b:1 stopped retrying: dropped after its waiter ttl, c:1 is next
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue, [{ holder: "c:1", ttlMs: 60 }])
        yield* backend.release(rel("a:1", "exclusive"))
        granted(yield* backend.acquire(fair("c:1")))
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue, [])
      }))

    it.effect("fair shared requests queue too, behind a queued writer", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(read("r:1", { fair: true })))
        denied(yield* backend.acquire(fair("w:1")))
        // r:2 would fit, but the writer is ahead of it
        denied(yield* backend.acquire(read("r:2", { fair: true })))
        yield* backend.release(rel("r:1", "shared"))
        granted(yield* backend.acquire(fair("w:1")))
      }))

    it.effect("cancel removes a waiter and wakes the new head only when the head changed", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(fair("a:1")))
        for (const holder of ["b:1", "c:1", "d:1"]) denied(yield* backend.acquire(fair(holder)))
        const subD = yield* backend.subscribe(KEY, "d:1", "exclusive")
        const subC = yield* backend.subscribe(KEY, "c:1", "exclusive")
        const waitC = yield* awaitFork(subC)
        const waitD = yield* awaitFork(subD)
        yield* backend.cancel({ key: KEY, holder: "c:1", leaseMs: 1000 })
        assert.isFalse(yield* isDone(waitD))
        yield* backend.cancel({ key: KEY, holder: "b:1", leaseMs: 1000 })
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue.map((w) => w.holder), ["d:1"])
        assert.isTrue(yield* isDone(waitD))
        assert.isFalse(yield* isDone(waitC))
      }).pipe(Effect.scoped))
  })

  describe("forceRelease", () => {
    it.effect("drops every holder, keeps the fence and wakes a waiter", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(read("r:1")))
        const r2 = granted(yield* backend.acquire(read("r:2")))
        const sub = yield* backend.subscribe(KEY, "w:1", "exclusive")
        const wait = yield* awaitFork(sub)
        assert.isTrue(yield* backend.forceRelease({ key: KEY, id: crypto.randomUUID() }))
        assert.isTrue(yield* isDone(wait))
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.limit, state.fence], [[], undefined, r2.fence])
        assert.isFalse(yield* backend.forceRelease({ key: KEY, id: crypto.randomUUID() }))
        assert.isTrue(granted(yield* backend.acquire(request("w:1"))).fence > r2.fence)
      }).pipe(Effect.scoped))
  })

  describe("at-least-once delivery", () => {
    /** A release from `count`, as the lock API sends it. */
    const from = (holder: string, count: number, overrides: Partial<ReleaseRequest> = {}): ReleaseRequest => ({
      ...rel(holder),
      count,
      ...overrides
    })

    it.effect("a release delivered twice changes the count once", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1", { count: 1 })))
        granted(yield* backend.acquire(request("a:1", { count: 2 })))
        assert.strictEqual(yield* backend.release(from("a:1", 2)), 1)
        // the copy finds the count at 1 already: it answers 1 and leaves 1
        assert.strictEqual(yield* backend.release(from("a:1", 2)), 1)
        assert.deepStrictEqual((yield* backend.inspect(KEY)).holders.map((h) => [h.holder, h.exclusive]), [["a:1", 1]])
        denied(yield* backend.acquire(request("b:1")))
        // the same for a shared hold: the permits stay taken until the last release
        const sem = (holder: string, count: number) => request(holder, { key: "sem", mode: "shared", limit: 2, count })
        granted(yield* backend.acquire(sem("r:1", 1)))
        granted(yield* backend.acquire(sem("r:1", 2)))
        const shared = from("r:1", 2, { key: "sem", mode: "shared" })
        assert.deepStrictEqual([yield* backend.release(shared), yield* backend.release(shared)], [1, 1])
        assert.deepStrictEqual((yield* backend.inspect("sem")).holders.map((h) => [h.holder, h.shared, h.permits]), [["r:1", 1, 1]])
        // the last release still ends the hold
        assert.strictEqual(yield* backend.release(from("a:1", 1)), 0)
        granted(yield* backend.acquire(request("b:1")))
      }))

    it.effect("an acquisition delivered twice takes one hold: the copy answers Granted with the same fence", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const first = granted(yield* backend.acquire(request("a:1", { count: 1 })))
        yield* TestClock.adjust(10)
        // the clock moved: a new grant would take a new fence, the copy keeps the first
        assert.deepStrictEqual(granted(yield* backend.acquire(request("a:1", { count: 1 }))), first)
        assert.deepStrictEqual(
          (yield* backend.inspect(KEY)).holders.map((h) => [h.holder, h.exclusive, h.fence]),
          [["a:1", 1, first.fence]]
        )
        // a re-entry delivered twice counts once
        const reentry = granted(yield* backend.acquire(request("a:1", { count: 2 })))
        assert.deepStrictEqual(reentry, { _tag: "Granted", fence: first.fence, count: 2 })
        assert.deepStrictEqual(granted(yield* backend.acquire(request("a:1", { count: 2 }))), reentry)
        assert.strictEqual((yield* backend.inspect(KEY)).holders[0]?.exclusive, 2)
        // two releases end it
        assert.strictEqual(yield* backend.release(from("a:1", 2)), 1)
        denied(yield* backend.acquire(request("b:1")))
        assert.strictEqual(yield* backend.release(from("a:1", 1)), 0)
        granted(yield* backend.acquire(request("b:1")))
        // a shared acquisition delivered twice takes its permits once
        const sem = (holder: string) => request(holder, { key: "sem", mode: "shared", limit: 2, count: 1 })
        const r = granted(yield* backend.acquire(sem("r:1")))
        assert.deepStrictEqual(granted(yield* backend.acquire(sem("r:1"))), r)
        granted(yield* backend.acquire(sem("r:2")))
        denied(yield* backend.acquire(sem("r:3")))
      }))

    it.effect("a late copy of an acquisition from a holder that ended is NotHeld for leaseMs, then forgotten", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        granted(yield* backend.acquire(request("a:1", { count: 1 })))
        // remembered for the release's leaseMs (500), the fence for the grant's lease (1000)
        assert.strictEqual(yield* backend.release(from("a:1", 1, { leaseMs: 500 })), 0)
        yield* TestClock.adjust(499)
        const late = yield* Effect.flip(backend.acquire(request("a:1", { count: 1 })))
        assert.instanceOf(late, LockError.NotHeld)
        assert.deepStrictEqual([late.key, late.holder], [KEY, "a:1"])
        // it granted nothing, and queued nothing
        assert.strictEqual(
          (yield* Effect.flip(backend.acquire(request("a:1", { count: 1, fair: true }))))._tag,
          "NotHeld"
        )
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.queue], [[], []])
        assert.deepStrictEqual(sizes(), { ...nothingStored, keys: 1, fences: 1, ended: 1 })
        yield* TestClock.adjust(1)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), { ...nothingStored, keys: 1, fences: 1 })
        yield* TestClock.adjust(500)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), nothingStored)
        // forgotten: a copy this late is taken for a new holder
        assert.strictEqual(granted(yield* backend.acquire(request("a:1", { count: 1 }))).fence, yield* clockMicros)
      }))

    it.effect("a re-entry by a holder that holds nothing is NotHeld and grants nothing", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        const never = yield* Effect.flip(backend.acquire(request("a:1", { count: 2 })))
        assert.instanceOf(never, LockError.NotHeld)
        assert.deepStrictEqual([never.key, never.holder], [KEY, "a:1"])
        assert.strictEqual((yield* Effect.flip(backend.acquire(read("r:1", { count: 2 }))))._tag, "NotHeld")
        assert.deepStrictEqual(sizes(), nothingStored)
        // a hold that expired is gone too: re-entering it is NotHeld, not a fresh grant
        granted(yield* backend.acquire(request("b:1", { count: 1 })))
        yield* TestClock.adjust(1000)
        assert.strictEqual((yield* Effect.flip(backend.acquire(request("b:1", { count: 2 }))))._tag, "NotHeld")
        assert.deepStrictEqual((yield* backend.inspect(KEY)).holders, [])
        granted(yield* backend.acquire(request("c:1")))
      }))

    it.effect("a copy of a last release answers 0 within leaseMs and leaves a later holder alone", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1", { count: 1 })))
        assert.strictEqual(yield* backend.release(from("a:1", 1)), 0)
        const b = granted(yield* backend.acquire(request("b:1", { count: 1 })))
        yield* TestClock.adjust(999)
        assert.strictEqual(yield* backend.release(from("a:1", 1)), 0)
        assert.deepStrictEqual(
          (yield* backend.inspect(KEY)).holders.map((h) => [h.holder, h.exclusive, h.fence]),
          [["b:1", 1, b.fence]]
        )
        // each copy is remembered for its own leaseMs; after that a release is NotHeld again
        yield* TestClock.adjust(1000)
        assert.strictEqual((yield* Effect.flip(backend.release(from("a:1", 1))))._tag, "NotHeld")
      }))

    it.effect("a forced release delivered twice does not drop a holder granted in between", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        granted(yield* backend.acquire(request("a:1", { count: 1 })))
        const force = { key: KEY, id: "force-1" }
        assert.isTrue(yield* backend.forceRelease(force))
        const b = granted(yield* backend.acquire(request("b:1", { count: 1 })))
        // the copy answers as the first did, and changes nothing
        assert.isTrue(yield* backend.forceRelease(force))
        assert.deepStrictEqual(
          (yield* backend.inspect(KEY)).holders.map((h) => [h.holder, h.fence]),
          [["b:1", b.fence]]
        )
        // the dropped holder is remembered: a late copy of its acquisition takes nothing
        assert.strictEqual((yield* Effect.flip(backend.acquire(request("a:1", { count: 1 }))))._tag, "NotHeld")
        // a forced release that found nothing: its copy answers false, and leaves a later holder too
        const idle = { key: "other", id: "force-2" }
        assert.isFalse(yield* backend.forceRelease(idle))
        granted(yield* backend.acquire(request("c:1", { key: "other", count: 1 })))
        assert.isFalse(yield* backend.forceRelease(idle))
        assert.deepStrictEqual((yield* backend.inspect("other")).holders.map((h) => h.holder), ["c:1"])
        // another id is another forced release
        assert.isTrue(yield* backend.forceRelease({ key: KEY, id: "force-3" }))
        assert.deepStrictEqual((yield* backend.inspect(KEY)).holders, [])
        // ids are remembered forceReleaseMemoryMs, then nothing is left
        yield* TestClock.adjust(forceReleaseMemoryMs)
        yield* backend.inspect(KEY)
        yield* backend.inspect("other")
        assert.deepStrictEqual(sizes(), nothingStored)
      }))

    it.effect("a cancelled waiter is remembered: a late copy of its fair attempt does not queue it again", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        granted(yield* backend.acquire(fair("a:1", { count: 1 })))
        denied(yield* backend.acquire(fair("b:1", { count: 1 })))
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue.map((w) => w.holder), ["b:1"])
        yield* backend.cancel({ key: KEY, holder: "b:1", leaseMs: 1000 })
        const late = yield* Effect.flip(backend.acquire(fair("b:1", { count: 1 })))
        assert.instanceOf(late, LockError.NotHeld)
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue, [])
        // not even once the key is free
        assert.strictEqual(yield* backend.release(from("a:1", 1)), 0)
        assert.strictEqual((yield* Effect.flip(backend.acquire(fair("b:1", { count: 1 }))))._tag, "NotHeld")
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.queue], [[], []])
        // forgotten after leaseMs, with the rest of the key
        yield* TestClock.adjust(1000)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), nothingStored)
      }))

    it.effect("a cancel by a current holder ends nothing: it re-enters and releases as before", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const a = granted(yield* backend.acquire(fair("a:1", { count: 1 })))
        yield* backend.cancel({ key: KEY, holder: "a:1", leaseMs: 1000 })
        assert.deepStrictEqual(granted(yield* backend.acquire(fair("a:1", { count: 2 }))), { _tag: "Granted", fence: a.fence, count: 2 })
        assert.strictEqual(yield* backend.release(from("a:1", 2)), 1)
        assert.strictEqual(yield* backend.release(from("a:1", 1)), 0)
        granted(yield* backend.acquire(fair("b:1")))
      }))

    it.effect("fences increase strictly across holders and are never below the clock in microseconds", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const fences: Array<number> = []
        for (const holder of ["a:1", "b:1", "c:1", "d:1"]) {
          const fence = granted(yield* backend.acquire(request(holder, { count: 1 }))).fence
          assert.isAtLeast(fence, yield* clockMicros)
          fences.push(fence)
          yield* backend.release(from(holder, 1))
          yield* TestClock.adjust(Duration.micros(250n))
        }
        // readers granted in one instant: one microsecond apart at least
        for (const holder of ["r:1", "r:2", "r:3"]) {
          fences.push(granted(yield* backend.acquire(read(holder, { count: 1 }))).fence)
        }
        for (let i = 1; i < fences.length; i++) assert.isAbove(fences[i]!, fences[i - 1]!)
      }))

    it.effect("a fence ahead of the clock outlives the lease; once the key is idle and forgotten the next is the clock", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        // 1500 grants in one instant: the fence runs ahead of the clock (0 µs)
        let last = 0
        for (let i = 0; i < 1500; i++) {
          const fence = granted(yield* backend.acquire(request(`h:${i}`, { count: 1, leaseMs: 1 }))).fence
          assert.isAbove(fence, last)
          last = fence
          yield* backend.release(from(`h:${i}`, 1, { leaseMs: 1 }))
        }
        // every lease and every ended holder expired, but the clock has not passed the fence yet
        yield* TestClock.adjust(Duration.micros(1200n))
        assert.isBelow(yield* clockMicros, last)
        assert.strictEqual((yield* backend.inspect(KEY)).fence, last)
        assert.deepStrictEqual(sizes(), { ...nothingStored, keys: 1, fences: 1 })
        const next = granted(yield* backend.acquire(request("x:1", { count: 1, leaseMs: 1 }))).fence
        assert.strictEqual(next, last + 1)
        yield* backend.release(from("x:1", 1, { leaseMs: 1 }))
        // idle past the lease and past fence / 1000 ms: forgotten, and nothing of the key is kept
        yield* TestClock.adjust(Duration.micros(2000n))
        assert.strictEqual((yield* backend.inspect(KEY)).fence, 0)
        assert.deepStrictEqual(sizes(), nothingStored)
        const after = granted(yield* backend.acquire(request("y:1", { count: 1 }))).fence
        assert.strictEqual(after, yield* clockMicros)
        assert.isAbove(after, next)
      }))

    it.effect("keys nobody touches again are swept once their memories expired", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        for (const key of ["k1", "k2", "k3"]) {
          granted(yield* backend.acquire(request("a:1", { key, count: 1 })))
          yield* backend.release({ ...from("a:1", 1), key })
        }
        yield* backend.cancel({ key: "k4", holder: "w:1", leaseMs: 1000 })
        yield* backend.forceRelease({ key: "k5", id: "force-1" })
        assert.strictEqual(sizes().keys, 5)
        yield* TestClock.adjust(forceReleaseMemoryMs)
        // operations on another key only: the periodic sweep collects the idle ones
        for (let i = 0; i < 1024; i++) yield* backend.inspect("untouched")
        assert.deepStrictEqual(sizes(), nothingStored)
      }))

    it.effect("renew answers an Either per request, in order, and revives nothing", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        granted(yield* backend.acquire(request("a:1", { count: 1 })))
        granted(yield* backend.acquire(read("r:1", { key: "other", count: 1 })))
        granted(yield* backend.acquire(request("e:1", { key: "ended", count: 1 })))
        yield* backend.release({ ...from("e:1", 1), key: "ended" })
        const results = yield* backend.renew([
          { key: KEY, holder: "a:1", leaseMs: 1000 },
          { key: "ended", holder: "e:1", leaseMs: 1000 },
          { key: "other", holder: "r:1", leaseMs: 1000 },
          { key: "never", holder: "z:1", leaseMs: 1000 }
        ])
        assert.isTrue(results.every(Either.isEither))
        assert.deepStrictEqual(results, [Either.right(true), Either.right(false), Either.right(true), Either.right(false)])
        assert.deepStrictEqual(yield* backend.renew([]), [])
        // the ended holder stays ended, and the untouched key is not stored
        assert.deepStrictEqual((yield* backend.inspect("ended")).holders, [])
        assert.strictEqual(sizes().keys, 3)
      }))
  })

  describe("subscriptions", () => {
    it.effect("a release wakes one subscriber, in arrival order", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const scopes = yield* Effect.forEach(["b:1", "c:1", "d:1"], () => Scope.make())
        const subs = yield* Effect.forEach(["b:1", "c:1", "d:1"], (h, i) =>
          backend.subscribe(KEY, h, "exclusive").pipe(Scope.extend(scopes[i]!)))
        const waits = yield* Effect.forEach(subs, awaitFork)
        yield* backend.release(rel("a:1", "exclusive"))
        assert.deepStrictEqual(yield* Effect.forEach(waits, isDone), [true, false, false])
        granted(yield* backend.acquire(request("b:1")))
        // the granted waiter stops waiting: its subscription closes successfully
        yield* Scope.close(scopes[0]!, Exit.void)
        yield* backend.release(rel("b:1", "exclusive"))
        assert.deepStrictEqual(yield* Effect.forEach(waits, isDone), [true, true, false])
        yield* Effect.forEach(scopes, (scope) => Scope.close(scope, Exit.void))
      }).pipe(Effect.scoped))

    it.effect("a count decrement that keeps the hold wakes nobody", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        granted(yield* backend.acquire(request("a:1")))
        const wait = yield* awaitFork(yield* backend.subscribe(KEY, "b:1", "exclusive"))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isFalse(yield* isDone(wait))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(wait))
      }).pipe(Effect.scoped))

    it.effect("a signal delivered before await is pending and consumed once", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive")
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(yield* awaitFork(sub)))
        assert.isFalse(yield* isDone(yield* awaitFork(sub)))
      }).pipe(Effect.scoped))

    it.effect("a signal delivered to a waiting await is consumed by it", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive")
        const wait = yield* awaitFork(sub)
        yield* settle
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(wait))
        assert.isFalse(yield* isDone(yield* awaitFork(sub)))
      }).pipe(Effect.scoped))

    it.effect("a subscriber holding an unconsumed signal is skipped by the next wake-up", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const sem = (holder: string) => request(holder, { mode: "shared", limit: 2 })
        granted(yield* backend.acquire(sem("a:1")))
        granted(yield* backend.acquire(sem("b:1")))
        const subC = yield* backend.subscribe(KEY, "c:1", "exclusive")
        const subD = yield* backend.subscribe(KEY, "d:1", "exclusive")
        yield* backend.release(rel("a:1", "shared"))
        yield* backend.release(rel("b:1", "shared"))
        assert.isTrue(yield* isDone(yield* awaitFork(subC)))
        assert.isTrue(yield* isDone(yield* awaitFork(subD)))
      }).pipe(Effect.scoped))

    it.effect("a fair key wakes the queue head's subscriber first", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(fair("a:1")))
        denied(yield* backend.acquire(fair("b:1")))
        denied(yield* backend.acquire(fair("c:1")))
        const waitC = yield* awaitFork(yield* backend.subscribe(KEY, "c:1", "exclusive"))
        const waitB = yield* awaitFork(yield* backend.subscribe(KEY, "b:1", "exclusive"))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(waitB))
        assert.isFalse(yield* isDone(waitC))
      }).pipe(Effect.scoped))

    it.effect("await is interruptible and an interrupted await does not eat later signals", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive")
        const first = yield* awaitFork(sub)
        yield* settle
        const exit = yield* Fiber.interrupt(first)
        assert.isTrue(Exit.isInterrupted(exit))
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isTrue(yield* isDone(yield* awaitFork(sub)))
      }).pipe(Effect.scoped))

    it.effect("closing a subscription releases its awaiting fibers instead of leaving them blocked", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        const scope = yield* Scope.make()
        const sub = yield* backend.subscribe(KEY, "b:1", "exclusive").pipe(Scope.extend(scope))
        const wait = yield* awaitFork(sub)
        assert.isFalse(yield* isDone(wait))
        yield* Scope.close(scope, Exit.void)
        assert.isTrue(yield* isDone(wait))
        assert.isTrue(yield* isDone(yield* awaitFork(sub)))
      }))

    it.effect("a woken subscriber that is interrupted hands the wake-up on", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("a:1")))
        // b:1 subscribes but never gets to await: the wake-up stays pending on it
        const b = yield* Effect.fork(Effect.scoped(Effect.zipRight(backend.subscribe(KEY, "b:1", "exclusive"), Effect.never)))
        yield* settle
        const subC = yield* backend.subscribe(KEY, "c:1", "exclusive")
        const waitC = yield* awaitFork(subC)
        yield* backend.release(rel("a:1", "exclusive"))
        assert.isFalse(yield* isDone(waitC))
        yield* Fiber.interrupt(b)
        assert.isTrue(yield* isDone(waitC))
      }).pipe(Effect.scoped))

    it.effect("a subscription closed with a failure hands on; one closed successfully does not", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        let round = 0
        const handsOn = (exit: Exit.Exit<unknown, unknown>) =>
          Effect.gen(function* () {
            // a fresh holder each round: an ended one is remembered and refused
            const holder = `a:${++round}`
            granted(yield* backend.acquire(request(holder)))
            const scope = yield* Scope.make()
            yield* backend.subscribe(KEY, "b:1", "exclusive").pipe(Scope.extend(scope))
            const waitC = yield* awaitFork(yield* backend.subscribe(KEY, "c:1", "exclusive"))
            yield* backend.release(rel(holder, "exclusive"))
            yield* Scope.close(scope, exit)
            const done = yield* isDone(waitC)
            yield* Fiber.interrupt(waitC)
            return done
          }).pipe(Effect.scoped)
        assert.isTrue(yield* handsOn(Exit.fail("timeout")))
        assert.isFalse(yield* handsOn(Exit.void))
      }))

    it.effect("a shared grant wakes the next reader, so all readers enter after one release", () =>
      Effect.gen(function* () {
        const { service: backend } = yield* fresh
        granted(yield* backend.acquire(request("w:1")))
        const readers = yield* Effect.forEach(["r:1", "r:2", "r:3"], (h) => Effect.fork(waitFor(backend, read(h))))
        yield* settle
        yield* backend.release(rel("w:1", "exclusive"))
        assert.deepStrictEqual(yield* Effect.forEach(readers, isDone), [true, true, true])
        assert.strictEqual((yield* backend.inspect(KEY)).holders.length, 3)
      }))

    const touches: ReadonlyArray<readonly [string, (backend: Service) => Effect.Effect<unknown, unknown>]> = [
      ["inspect", (backend) => backend.inspect(KEY)],
      ["release", (backend) => Effect.either(backend.release(rel("a:1", "exclusive")))],
      ["renew", (backend) => backend.renew([{ key: KEY, holder: "a:1", leaseMs: 1000 }])],
      ["acquire", (backend) => backend.acquire(request("x:1", { key: KEY }))],
      ["forceRelease", (backend) => backend.forceRelease({ key: KEY, id: crypto.randomUUID() })],
      ["cancel", (backend) => backend.cancel({ key: KEY, holder: "x:1", leaseMs: 1000 })]
    ]
    for (const [name, touch] of touches) {
      it.effect(`an expiry noticed by ${name} wakes a waiter`, () =>
        Effect.gen(function* () {
          const { service: backend } = yield* fresh
          granted(yield* backend.acquire(request("a:1")))
          const wait = yield* awaitFork(yield* backend.subscribe(KEY, "b:1", "exclusive"))
          yield* TestClock.adjust(1000)
          // no timers: nothing happens until the key is touched
          assert.isFalse(yield* isDone(wait))
          yield* touch(backend)
          assert.isTrue(yield* isDone(wait))
        }).pipe(Effect.scoped))
    }

    it.effect("waiters take turns on an exclusive key and leave no state behind", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        const holders = ["w:1", "w:2", "w:3", "w:4"]
        granted(yield* backend.acquire(fair("w:0")))
        const order: Array<string> = []
        const workers = yield* Effect.forEach(holders, (h) =>
          Effect.fork(
            waitFor(backend, fair(h, { waiterTtlMs: 10_000 })).pipe(
              Effect.tap(() => Effect.sync(() => order.push(h))),
              Effect.zipRight(backend.release(rel(h, "exclusive")))
            )
          ))
        yield* settle
        assert.deepStrictEqual((yield* backend.inspect(KEY)).queue.map((w) => w.holder), holders)
        yield* backend.release(rel("w:0", "exclusive"))
        yield* Effect.forEach(workers, Fiber.join)
        assert.deepStrictEqual(order, holders)
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.queue, state.limit, state.fence], [[], [], undefined, 5])
        // ended holders and the fence are remembered for a lease, then the key is gone
        assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 0, subscriptions: 0, fences: 1, ended: 5 })
        yield* TestClock.adjust(1000)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), { keys: 0, subscribedKeys: 0, subscriptions: 0, fences: 0, ended: 0 })
      }))

    it.effect("no state is left after holders, waiters and subscriptions are gone", () =>
      Effect.gen(function* () {
        const { service: backend, sizes } = yield* fresh
        yield* Effect.gen(function* () {
          granted(yield* backend.acquire(request("a:1", { mode: "shared", limit: 2 })))
          denied(yield* backend.acquire(request("w:1", { fair: true })))
          const sub = yield* backend.subscribe(KEY, "w:1", "exclusive")
          yield* awaitFork(sub)
          assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 1, subscriptions: 1, fences: 1, ended: 0 })
        }).pipe(Effect.scoped)
        yield* backend.release(rel("a:1", "shared"))
        // the queue entry of w:1 outlives the hold until its waiter ttl
        assert.deepStrictEqual(sizes(), { keys: 1, subscribedKeys: 0, subscriptions: 0, fences: 1, ended: 1 })
        yield* TestClock.adjust(100)
        const state = yield* backend.inspect(KEY)
        assert.deepStrictEqual([state.holders, state.queue, state.limit], [[], [], undefined])
        // the ended holder and the fence a lease longer
        yield* TestClock.adjust(900)
        yield* backend.inspect(KEY)
        assert.deepStrictEqual(sizes(), { keys: 0, subscribedKeys: 0, subscriptions: 0, fences: 0, ended: 0 })
      }))
  })

  it.effect("a repeated forced release that notices an expiry wakes a waiter, as every other operation does", () =>
    Effect.gen(function* () {
      const { service: backend } = yield* fresh
      granted(yield* backend.acquire(request("a:1")))
      assert.isTrue(yield* backend.forceRelease({ key: KEY, id: "x" }))
      granted(yield* backend.acquire(request("b:1")))
      const wait = yield* awaitFork(yield* backend.subscribe(KEY, "c:1", "exclusive"))
      yield* TestClock.adjust(1000)
      // b's hold expired: the copy of the forced release answers as the first did and wakes c
      assert.isTrue(yield* backend.forceRelease({ key: KEY, id: "x" }))
      assert.isTrue(yield* isDone(wait))
    }).pipe(Effect.scoped))
})
