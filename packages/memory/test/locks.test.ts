/**
 * The lock operations (internal/locks.ts, judged by internal/acquisition.ts): modes, releases,
 * expiry and renewal, the fair queue and forced releases.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, TestClock } from "effect"
import * as LockError from "@lockstep/core/LockError"
import { awaitFork, clockMicros, denied, fair, fresh, granted, isDone, KEY, read, rel, request } from "./fixtures/memoryBackend.js"

describe("MemoryBackend", () => {
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
})
