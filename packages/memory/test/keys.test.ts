/**
 * What a key remembers (internal/keys.ts): ended holders, forced releases and fences, so that a
 * copy of an operation delivered twice changes nothing, and how long before the key is forgotten.
 */
import { assert, describe, it } from "@effect/vitest"
import { Duration, Effect, Either, TestClock } from "effect"
import { forceReleaseMemoryMs } from "@lockstep/core/LockBackend"
import type { ReleaseRequest } from "@lockstep/core/LockBackend"
import * as LockError from "@lockstep/core/LockError"
import { clockMicros, denied, fair, fresh, granted, KEY, nothingStored, read, rel, request } from "./fixtures/memoryBackend.js"

describe("MemoryBackend", () => {
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
})
