import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, TestClock } from "effect"
import type { AcquireRequest, HoldMode, ReleaseRequest } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import * as FaultyBackend from "@lockstep/testkit/FaultyBackend"
import * as History from "@lockstep/testkit/History"

const E = History.Event
let seq = 0
const at = () => ++seq
const grant = (
  holder: string,
  fence: number,
  options: {
    mode?: HoldMode
    permits?: number
    limit?: number
    key?: string
    time?: number
    expiresAt?: number
    invokedAt?: number
  } = {}
) =>
  E.Grant({
    at: at(),
    invokedAt: options.invokedAt,
    key: options.key ?? "k",
    holder,
    mode: options.mode ?? "exclusive",
    permits: options.permits ?? 1,
    limit: options.limit ?? 1,
    fence,
    time: options.time,
    expiresAt: options.expiresAt
  })
const release = (holder: string, mode: HoldMode = "exclusive", time?: number) =>
  E.Release({ at: at(), key: "k", holder, mode, time })
const tags = (events: ReadonlyArray<History.Event>) => History.check(events).map((v) => v._tag)

describe("History.check", () => {
  describe("accepts", () => {
    it("exclusive holds one after the other, fences increasing (gaps allowed)", () => {
      assert.deepStrictEqual(tags([grant("a", 1), release("a"), grant("b", 2), release("b"), grant("a", 5)]), [])
    })

    it("readers whose acquisitions overlapped, answered in another order than their fences", () => {
      // both asked before either was answered: the backend may grant them in either order
      const asked = at()
      const events = [
        grant("r1", 20, { mode: "shared", limit: Infinity, invokedAt: asked }),
        grant("r2", 10, { mode: "shared", limit: Infinity, invokedAt: asked })
      ]
      assert.deepStrictEqual(tags(events), [])
    })

    it("a late reply: a grant whose hold had expired before a conflicting grant was answered", () => {
      const both = at()
      const events = [
        grant("b", 20, { invokedAt: both, time: 50, expiresAt: 80 }),
        release("b", "exclusive", 60),
        grant("a", 10, { invokedAt: both, time: 70, expiresAt: 40 })
      ]
      // accepted: "a" was granted first on the backend; its reply came after its lease had run out
      assert.deepStrictEqual(tags(events), [])
    })

    it("re-entry and a downgrade by the same holder, keeping the fence", () => {
      assert.deepStrictEqual(
        tags([
          grant("a", 1),
          grant("a", 1),
          grant("a", 1, { mode: "shared", limit: Infinity }),
          release("a"),
          release("a"),
          grant("b", 2, { mode: "shared", limit: Infinity }), // a still reads: fine
          release("a", "shared"),
          release("b", "shared")
        ]),
        []
      )
    })

    it("shared holders up to the limit", () => {
      assert.deepStrictEqual(
        tags([
          grant("a", 1, { mode: "shared", permits: 2, limit: 3 }),
          grant("b", 2, { mode: "shared", permits: 1, limit: 3 }),
          release("a", "shared"),
          grant("c", 3, { mode: "shared", permits: 2, limit: 3 })
        ]),
        []
      )
    })

    it("a new holder once the previous hold expired (by time) or was lost, and its late release", () => {
      assert.deepStrictEqual(
        tags([
          grant("a", 1, { time: 0, expiresAt: 10 }),
          grant("b", 2, { time: 10 }),
          release("a", "exclusive", 11), // the backend said NotHeld or it raced: not a violation
          E.Expire({ at: at(), key: "k", holder: "b" }),
          grant("c", 3),
          E.ForceRelease({ at: at(), key: "k" }),
          grant("d", 4),
          release("c")
        ]),
        []
      )
    })

    it("events in any order (sorted by at)", () => {
      const events = [grant("a", 1), release("a"), grant("b", 2)]
      assert.deepStrictEqual(tags([...events].reverse()), [])
    })

    it("independent keys", () => {
      assert.deepStrictEqual(tags([grant("a", 1), grant("b", 1, { key: "other" })]), [])
    })
  })

  describe("detects", () => {
    it("two exclusive holders at once", () => {
      const violations = History.check([grant("a", 1), grant("b", 2)])
      assert.strictEqual(violations.length, 1)
      const v = violations[0]
      assert.isTrue(v !== undefined && History.Violation.$is("Overlap")(v) && v.holder === "b" && v.other === "a")
    })

    it("a reader while a writer holds, and a writer while a reader holds", () => {
      assert.deepStrictEqual(tags([grant("w", 1), grant("r", 2, { mode: "shared", limit: Infinity })]), ["Overlap"])
      assert.deepStrictEqual(tags([grant("r", 1, { mode: "shared", limit: Infinity }), grant("w", 2)]), ["Overlap"])
    })

    it("shared permits above the limit", () => {
      const violations = History.check([
        grant("a", 1, { mode: "shared", permits: 2, limit: 3 }),
        grant("b", 2, { mode: "shared", permits: 2, limit: 3 })
      ])
      assert.deepStrictEqual(violations.map((v) => v._tag), ["PermitsExceeded"])
      const v = violations[0]
      assert.isTrue(v !== undefined && History.Violation.$is("PermitsExceeded")(v) && v.permits === 4)
    })

    it("shared holders disagreeing on the limit", () => {
      assert.deepStrictEqual(
        tags([grant("a", 1, { mode: "shared", limit: 3 }), grant("b", 2, { mode: "shared", limit: 5 })]),
        ["LimitMismatch"]
      )
    })

    it("a new grant whose fence is not above every earlier one", () => {
      assert.deepStrictEqual(tags([grant("a", 2), release("a"), grant("b", 2)]), ["FenceNotIncreasing"])
      assert.deepStrictEqual(tags([grant("a", 5), release("a"), grant("b", 3)]), ["FenceNotIncreasing"])
      // asked for after an earlier grant was answered: it must be above it, shared or not
      const first = grant("r1", 20, { mode: "shared", limit: Infinity })
      const asked = at()
      assert.deepStrictEqual(tags([first, grant("r2", 10, { mode: "shared", limit: Infinity, invokedAt: asked })]), [
        "FenceNotIncreasing"
      ])
      // two exclusive acquisitions in flight together: the one answered second, after the first
      // was released, held the key after it, and needs a higher fence
      const both = at()
      assert.deepStrictEqual(tags([grant("a", 20, { invokedAt: both }), release("a"), grant("b", 10, { invokedAt: both })]), [
        "FenceNotIncreasing"
      ])
      // likewise a writer answered after a reader it could not have held alongside
      const rw = at()
      assert.deepStrictEqual(
        tags([
          grant("r", 20, { mode: "shared", limit: Infinity, invokedAt: rw }),
          release("r", "shared"),
          grant("w", 10, { invokedAt: rw })
        ]),
        ["FenceNotIncreasing"]
      )
    })


    it("an overlap with a hold a renewal kept alive past its first expiry", () => {
      const events = [
        grant("a", 1, { time: 0, expiresAt: 10 }),
        E.Renew({ at: at(), key: "k", holder: "a", expiresAt: 30, time: 5 }),
        grant("b", 2, { time: 20 })
      ]
      assert.deepStrictEqual(tags(events), ["Overlap"])
      assert.deepStrictEqual(tags([...events.slice(0, 2), grant("b", 2, { time: 30 })]), [])
    })

    it("a re-entrant grant with another fence", () => {
      assert.deepStrictEqual(tags([grant("a", 1), grant("a", 2)]), ["FenceChanged"])
    })

    it("a release without a grant, or in the wrong mode", () => {
      assert.deepStrictEqual(tags([release("a")]), ["ReleaseWithoutGrant"])
      assert.deepStrictEqual(tags([grant("a", 1), release("a", "shared")]), ["ReleaseWithoutGrant"])
      assert.deepStrictEqual(tags([grant("a", 1), release("a"), release("a")]), ["ReleaseWithoutGrant"])
    })
  })

  it.effect("assertValid fails with every violation described", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(History.assertValid([grant("a", 3), grant("b", 2)]))
      assert.strictEqual(error._tag, "HistoryViolation")
      assert.deepStrictEqual(error.violations.map((v) => v._tag), ["FenceNotIncreasing", "Overlap"])
      assert.include(error.message, "2 violation(s)")
      assert.include(error.message, "b was granted exclusive while a held it exclusive")
      yield* History.assertValid([grant("a", 1), release("a")])
    }))
})

describe("History.make", () => {
  it.effect("numbers events in order and stamps them with the clock", () =>
    Effect.gen(function*() {
      const history = yield* History.make
      yield* TestClock.adjust(7)
      yield* history.grant({ key: "k", holder: "a", mode: "exclusive", permits: 1, limit: 1, fence: 1 })
      const reserved = yield* history.sequence
      yield* history.grant({ key: "k", holder: "b", mode: "exclusive", permits: 1, limit: 1, fence: 2 })
      yield* history.release({ key: "k", holder: "a", mode: "exclusive" }, reserved)
      const events = yield* history.events
      assert.deepStrictEqual(events.map((e) => [e._tag, e.at, e.time]), [
        ["Grant", 1, 7],
        ["Release", 2, 7],
        ["Grant", 3, 7]
      ])
      assert.deepStrictEqual(yield* history.check, [])
      yield* history.grant({ key: "k", holder: "c", mode: "exclusive", permits: 1, limit: 1, fence: 3 })
      const error = yield* Effect.flip(history.assertValid)
      assert.deepStrictEqual(error.violations.map((v) => v._tag), ["Overlap"])
    }))
})

describe("History.instrument", () => {
  const exclusive = (holder: string, leaseMs = 1_000): AcquireRequest => ({
    key: "k",
    holder,
    mode: "exclusive",
    permits: 1,
    limit: 1,
    leaseMs,
    fair: false,
    waiterTtlMs: 100,
    count: 1
  })
  const release = (holder: string): ReleaseRequest => ({ key: "k", holder, mode: "exclusive", count: 1, leaseMs: 1_000 })

  /** Many fibers take turns on one key: acquire (retrying on denial), hold, release; a fresh holder each round. */
  const contend = (fibers: number, rounds: number) =>
    Effect.gen(function*() {
      const history = yield* History.make
      const backend = History.instrument(history, yield* LockBackend)
      let releaseFailures = 0
      yield* Effect.forEach(
        Array.from({ length: fibers }, (_, i) => `${backend.clientId}:${i}`),
        (holder) =>
          Effect.gen(function*() {
            let taken = 0
            while (taken < rounds) {
              const round = `${holder}.${taken}`
              const result = yield* backend.acquire(exclusive(round))
              if (result._tag === "Denied") {
                yield* Effect.yieldNow()
                continue
              }
              taken++
              yield* Effect.yieldNow()
              const released = yield* Effect.either(backend.release(release(round)))
              if (Either.isLeft(released)) releaseFailures++
            }
          }),
        { concurrency: "unbounded", discard: true }
      )
      return { history, releaseFailures }
    })

  it.effect("records a valid history of a correct backend under contention", () =>
    Effect.gen(function*() {
      const { history, releaseFailures } = yield* contend(5, 10)
      assert.strictEqual(releaseFailures, 0)
      const events = yield* history.events
      assert.strictEqual(events.filter((e) => e._tag === "Grant").length, 50)
      assert.strictEqual(events.filter((e) => e._tag === "Release").length, 50)
      assert.deepStrictEqual(yield* history.check, [])
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("catches a backend that grants an exclusive lock twice", () =>
    Effect.gen(function*() {
      const { history } = yield* contend(3, 3)
      const violations = yield* history.check
      assert.isTrue(violations.some((v) => v._tag === "Overlap"))
    }).pipe(Effect.provide(FaultyBackend.grantTwiceLayer(MemoryBackend.layer))))

  it.effect("ends holds at their lease, so a grant after expiry is no overlap", () =>
    Effect.gen(function*() {
      const history = yield* History.make
      const backend = History.instrument(history, yield* LockBackend)
      yield* backend.acquire(exclusive("a", 10))
      yield* TestClock.adjust(10)
      const second = yield* backend.acquire(exclusive("b", 10))
      assert.strictEqual(second._tag, "Granted")
      const renewed = yield* backend.renew([{ key: "k", holder: "a", leaseMs: 10 }, { key: "k", holder: "b", leaseMs: 50 }])
      assert.deepStrictEqual(renewed, [Either.right(false), Either.right(true)])
      const released = yield* Effect.either(backend.release(release("a")))
      assert.isTrue(Either.isLeft(released))
      yield* TestClock.adjust(20)
      assert.isTrue(yield* backend.forceRelease({ key: "k", id: "force-1" }))
      const events = yield* history.events
      assert.deepStrictEqual(events.map((e) => e._tag), ["Grant", "Grant", "Expire", "Renew", "ForceRelease"])
      assert.deepStrictEqual(yield* history.check, [])
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("stays quiet when the backend fails calls", () =>
    Effect.gen(function*() {
      const history = yield* History.make
      const backend = History.instrument(history, yield* LockBackend)
      const failed = yield* Effect.either(backend.acquire(exclusive("a")))
      assert.isTrue(Either.isLeft(failed))
      assert.deepStrictEqual(yield* history.events, [])
    }).pipe(
      Effect.provide(
        FaultyBackend.failingLayer({ operation: "acquire", when: 1 })(MemoryBackend.layer)
      )
    ))

  it.effect("lost replies: a release still ends the hold, the clean-up of an unanswered grant is not recorded", () =>
    Effect.gen(function*() {
      const history = yield* History.make
      const backend = History.instrument(history, yield* LockBackend)
      // a's grant happens but its reply is lost; the API releases it best-effort with the same count
      assert.isTrue(Either.isLeft(yield* Effect.either(backend.acquire(exclusive("a")))))
      yield* backend.release(release("a"))
      // b's grant is answered, its release runs but the reply is lost
      assert.strictEqual((yield* backend.acquire(exclusive("b")))._tag, "Granted")
      assert.isTrue(Either.isLeft(yield* Effect.either(backend.release(release("b")))))
      assert.strictEqual((yield* backend.acquire(exclusive("c")))._tag, "Granted")
      const events = yield* history.events
      assert.deepStrictEqual(events.map((e) => e._tag), ["Grant", "Release", "Grant"])
      assert.deepStrictEqual(yield* history.check, [])
    }).pipe(
      Effect.provide(
        FaultyBackend.failingLayer({ operation: "release", when: (call) => call === 2, timing: "after" })(
          FaultyBackend.failingLayer({ operation: "acquire", when: (call) => call === 1, timing: "after" })(MemoryBackend.layer)
        )
      )
    ))
})
