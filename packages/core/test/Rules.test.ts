import { assert, describe, it } from "@effect/vitest"
import { Either } from "effect"
import type {
  AcquireRequest,
  AcquireResult,
  CancelRequest,
  ForceReleaseRequest,
  HoldMode,
  KeyState,
  ReleaseRequest,
  RenewRequest
} from "@lockstep/core/LockBackend"
import { forceReleaseMemoryMs } from "@lockstep/core/LockBackend"
import * as Rules from "@lockstep/core/Rules"

const K = "k"

const request = (holder: string, overrides: Partial<AcquireRequest> = {}): AcquireRequest => ({
  key: K,
  holder,
  mode: "exclusive",
  permits: 1,
  limit: 1,
  leaseMs: 100,
  fair: false,
  waiterTtlMs: 50,
  // 0: filled in by `acquireAll` from the state, as a client would (its count + 1)
  count: 0,
  ...overrides
})
const shared = (holder: string, permits: number, limit: number, overrides: Partial<AcquireRequest> = {}) =>
  request(holder, { mode: "shared", permits, limit, ...overrides })
const fair = (holder: string, overrides: Partial<AcquireRequest> = {}) => request(holder, { fair: true, ...overrides })

/** Runs acquisitions in order at the given times, returning the final state and every result. */
const acquireAll = (
  steps: ReadonlyArray<readonly [AcquireRequest, number]>,
  state: Rules.State = Rules.empty
) => {
  const results: Array<Either.Either<AcquireResult, Rules.AcquireRefusal>> = []
  for (const [req, now] of steps) {
    const step = Rules.acquire(state, withCount(state, req, now), now)
    state = step.state
    results.push(step.result)
  }
  return { state, results }
}

/** The holder's current count in `mode` on `key` at `now`. */
const countOf = (state: Rules.State, key: string, holder: string, mode: HoldMode, now: number): number => {
  const hold = Rules.inspect(state, key, now).result.holders.find((h) => h.holder === holder)
  return hold === undefined ? 0 : mode === "exclusive" ? hold.exclusive : hold.shared
}
const withCount = (state: Rules.State, req: AcquireRequest, now: number): AcquireRequest =>
  req.count === 0 ? { ...req, count: countOf(state, req.key, req.holder, req.mode, now) + 1 } : req
/** A release as a client sends it: from the holder's current count (1 for a non-holder). */
const releaseOf = (state: Rules.State, holder: string, mode: HoldMode, now: number, key = K): ReleaseRequest => ({
  key,
  holder,
  mode,
  count: Math.max(1, countOf(state, key, holder, mode, now)),
  leaseMs: 100
})

const granted = (fence: number, count: number) => Either.right<AcquireResult>({ _tag: "Granted", fence, count })
const denied = (retryAfterMs: number) => Either.right<AcquireResult>({ _tag: "Denied", retryAfterMs })
const tagOf = (result: Either.Either<unknown, { readonly _tag: string }>) =>
  Either.match(result, { onLeft: (e) => e._tag, onRight: () => "Right" })
const view = (state: Rules.State, now: number, key = K): KeyState => Rules.inspect(state, key, now).result
const holderNames = (state: Rules.State, now: number) => view(state, now).holders.map((h) => h.holder)
const queueNames = (state: Rules.State, now: number) => view(state, now).queue.map((w) => w.holder)

describe("Model", () => {
  describe("exclusive", () => {
    it("grants an empty key with the first fence", () => {
      const { results, state } = acquireAll([[request("a"), 0]])
      assert.deepStrictEqual(results, [granted(1, 1)])
      assert.deepStrictEqual(view(state, 30), {
        key: K,
        fence: 1,
        limit: undefined,
        holders: [{ holder: "a", exclusive: 1, shared: 0, permits: 0, fence: 1, ttlMs: 70 }],
        queue: []
      })
    })

    it("denies while another holder is live, retrying when its hold expires", () => {
      const { results } = acquireAll([[request("a"), 0], [request("b"), 30]])
      assert.deepStrictEqual(results[1], denied(70))
    })

    it("drops expired holders first: a hold ends exactly at its expiry", () => {
      const { results, state } = acquireAll([[request("a"), 0], [request("b"), 99], [request("b"), 100]])
      // a new grant's fence is never below the clock in microseconds
      assert.deepStrictEqual(results, [granted(1, 1), denied(1), granted(100_000, 1)])
      assert.deepStrictEqual(holderNames(state, 100), ["b"])
    })

    it("re-enters: count + 1, same fence, expiry extended to at least now + lease", () => {
      const { results, state } = acquireAll([
        [request("a", { leaseMs: 100 }), 0],
        [request("a", { leaseMs: 10 }), 50], // would shorten: keeps 100
        [request("a", { leaseMs: 200 }), 60] // extends to 260
      ])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1, 2), granted(1, 3)])
      assert.deepStrictEqual(view(state, 60).holders[0], {
        holder: "a",
        exclusive: 3,
        shared: 0,
        permits: 0,
        fence: 1,
        ttlMs: 200
      })
    })

    it("fails an upgrade (reader asking for the write lock) without changing anything", () => {
      const first = acquireAll([[shared("a", 1, Infinity), 0]])
      const step = Rules.acquire(first.state, request("a"), 10)
      assert.strictEqual(tagOf(step.result), "LockUpgradeNotSupported")
      assert.deepStrictEqual(view(step.state, 10), view(first.state, 10))
    })

    it("ignores the limit of exclusive requests", () => {
      const { results, state } = acquireAll([[request("a", { limit: 7 }), 0], [shared("a", 1, 3), 1]])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1, 1)])
      assert.strictEqual(view(state, 1).limit, 3)
    })
  })

  describe("shared", () => {
    it("lets readers in together (limit Infinity), each with its own fence", () => {
      const { results, state } = acquireAll([
        [shared("a", 1, Infinity), 0],
        [shared("b", 1, Infinity), 1],
        [shared("c", 1, Infinity), 2]
      ])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1_000, 1), granted(2_000, 1)])
      assert.deepStrictEqual(holderNames(state, 2), ["a", "b", "c"])
      assert.strictEqual(view(state, 2).limit, Infinity)
    })

    it("counts permits against the limit; retry when the earliest shared hold expires", () => {
      const { results } = acquireAll([
        [shared("a", 1, 3, { leaseMs: 50 }), 0],
        [shared("b", 2, 3, { leaseMs: 20 }), 0],
        [shared("c", 1, 3), 5], // 3 + 1 > 3
        [shared("c", 1, 3), 20] // b expired: 1 + 1 <= 3
      ])
      assert.deepStrictEqual(results, [granted(1, 1), granted(2, 1), denied(15), granted(20_000, 1)])
    })

    it("excludes readers while a writer holds, and a writer while readers hold", () => {
      const w = acquireAll([[request("w", { leaseMs: 40 }), 0], [shared("r", 1, Infinity), 10]])
      assert.deepStrictEqual(w.results[1], denied(30))
      const r = acquireAll([[shared("r", 1, Infinity, { leaseMs: 40 }), 0], [request("w"), 10]])
      assert.deepStrictEqual(r.results[1], denied(30))
    })

    it("re-enters a shared hold keeping its permits and fence", () => {
      const { results, state } = acquireAll([[shared("a", 2, 3), 0], [shared("a", 1, 3), 1]])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1, 2)])
      const hold = view(state, 1).holders[0]
      assert.strictEqual(hold?.shared, 2)
      assert.strictEqual(hold?.permits, 2)
    })

    it("lets a writer take the read lock (downgrade) with the same fence, still excluding others", () => {
      const { results, state } = acquireAll([
        [request("w"), 0],
        [shared("w", 1, Infinity), 1],
        [shared("r", 1, Infinity), 2]
      ])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1, 1), denied(99)])
      assert.deepStrictEqual(view(state, 2).holders, [
        { holder: "w", exclusive: 1, shared: 1, permits: 1, fence: 1, ttlMs: 99 }
      ])
    })

    it("stores the limit with the shared holds: another limit fails, until no shared holder is left", () => {
      const first = acquireAll([[shared("a", 1, 2), 0]])
      const mismatch = Rules.acquire(first.state, shared("b", 1, 5), 1)
      assert.strictEqual(tagOf(mismatch.result), "InvalidLockOptions")
      assert.strictEqual(
        Either.match(mismatch.result, { onLeft: (e) => (e._tag === "InvalidLockOptions" ? e.field : ""), onRight: () => "" }),
        "limit"
      )
      // the holder itself cannot change the limit either
      assert.strictEqual(tagOf(Rules.acquire(first.state, shared("a", 1, 5), 1).result), "InvalidLockOptions")
      const released = Rules.release(first.state, releaseOf(first.state, "a", "shared", 2), 2)
      assert.strictEqual(view(released.state, 2).limit, undefined)
      assert.deepStrictEqual(Rules.acquire(released.state, withCount(released.state, shared("b", 1, 5), 3), 3).result, granted(3_000, 1))
    })
  })

  describe("fences", () => {
    it("never go back, even after the key was empty or force-released", () => {
      let state = acquireAll([[request("a"), 0]]).state
      state = Rules.release(state, releaseOf(state, "a", "exclusive", 1), 1).state
      assert.strictEqual(view(state, 1).fence, 1)
      state = acquireAll([[request("b"), 2]], state).state
      state = Rules.forceRelease(state, { key: K, id: "force" }, 3).state
      const { results } = acquireAll([[request("c"), 4]], state)
      assert.deepStrictEqual(results, [granted(4_000, 1)])
    })

    it("are per key", () => {
      const { results } = acquireAll([[request("a"), 0], [request("a", { key: "other" }), 0]])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1, 1)])
    })
  })

  describe("release", () => {
    it("decrements the count and removes the holder at 0", () => {
      let { state } = acquireAll([[request("a"), 0], [request("a"), 1]])
      const first = Rules.release(state, releaseOf(state, "a", "exclusive", 2), 2)
      assert.deepStrictEqual(first.result, Either.right(1))
      state = first.state
      const second = Rules.release(state, releaseOf(state, "a", "exclusive", 3), 3)
      assert.deepStrictEqual(second.result, Either.right(0))
      assert.deepStrictEqual(holderNames(second.state, 3), [])
    })

    it("releases one mode of a downgraded writer, keeping the other", () => {
      const { state } = acquireAll([[request("w"), 0], [shared("w", 2, 3), 1]])
      const step = Rules.release(state, releaseOf(state, "w", "exclusive", 2), 2)
      assert.deepStrictEqual(step.result, Either.right(0))
      assert.deepStrictEqual(view(step.state, 2).holders, [
        { holder: "w", exclusive: 0, shared: 1, permits: 2, fence: 1, ttlMs: 99 }
      ])
      // now another reader fits (2 + 1 <= 3)
      assert.deepStrictEqual(Rules.acquire(step.state, withCount(step.state, shared("r", 1, 3), 3), 3).result, granted(3_000, 1))
    })

    it("reports NotHeld for a non-holder and an expired hold, changing no hold", () => {
      const { state } = acquireAll([[request("a", { leaseMs: 10 }), 0]])
      const cases = [
        { key: K, holder: "b", mode: "exclusive" as const, count: 1, leaseMs: 100, now: 1 },
        { key: K, holder: "a", mode: "exclusive" as const, count: 1, leaseMs: 100, now: 10 }
      ]
      for (const { now, ...req } of cases) {
        const step = Rules.release(state, req, now)
        assert.strictEqual(tagOf(step.result), "NotHeld")
        assert.deepStrictEqual(view(step.state, now), view(state, now))
      }
      // a holder releasing a mode it does not hold: taken as a copy of a release already applied
      const wrongMode = Rules.release(state, { key: K, holder: "a", mode: "shared", count: 1, leaseMs: 100 }, 1)
      assert.deepStrictEqual(wrongMode.result, Either.right(0))
      assert.deepStrictEqual(view(wrongMode.state, 1), view(state, 1))
    })
  })

  describe("renew", () => {
    it("extends to at least now + lease iff still held, one boolean per request", () => {
      const { state } = acquireAll([[request("a", { leaseMs: 100 }), 0], [request("b", { key: "x", leaseMs: 10 }), 0]])
      const step = Rules.renew(state, [
        { key: K, holder: "a", leaseMs: 200 }, // extends to 250
        { key: K, holder: "a", leaseMs: 10 }, // never shortens
        { key: "x", holder: "b", leaseMs: 100 }, // expired at 10
        { key: K, holder: "c", leaseMs: 100 } // never held
      ], 50)
      assert.deepStrictEqual(step.result, [true, true, false, false].map((ok) => Either.right(ok)))
      assert.strictEqual(view(step.state, 50).holders[0]?.ttlMs, 200)
    })
  })

  describe("fair", () => {
    it("queues a denied fair request; a refresh keeps its place and sets a new expiry", () => {
      const { results, state } = acquireAll([
        [request("a"), 0],
        [fair("b", { waiterTtlMs: 50 }), 0],
        [fair("c", { waiterTtlMs: 50 }), 10],
        [fair("b", { waiterTtlMs: 20 }), 20] // refresh: expiry 40, still first
      ])
      assert.deepStrictEqual(results, [granted(1, 1), denied(100), denied(40), denied(80)])
      assert.deepStrictEqual(view(state, 20).queue, [{ holder: "b", ttlMs: 20 }, { holder: "c", ttlMs: 40 }])
    })

    it("grants the head when the key is free, denies those behind it", () => {
      let { state } = acquireAll([[request("a"), 0], [fair("b"), 0], [fair("c"), 0]])
      state = Rules.release(state, releaseOf(state, "a", "exclusive", 5), 5).state
      const behind = Rules.acquire(state, fair("c"), 6)
      assert.deepStrictEqual(behind.result, denied(44)) // until b's entry expires (0 + 50)
      const head = Rules.acquire(behind.state, withCount(behind.state, fair("b"), 7), 7)
      assert.deepStrictEqual(head.result, granted(7_000, 1))
      assert.deepStrictEqual(queueNames(head.state, 7), ["c"]) // the grant removed b
    })

    it("drops expired queue entries, so the next waiter becomes the head", () => {
      const { results, state } = acquireAll([
        [request("a", { leaseMs: 10 }), 0],
        [fair("b", { waiterTtlMs: 30 }), 0],
        [fair("c", { waiterTtlMs: 50 }), 0],
        [fair("c"), 30]
      ])
      assert.deepStrictEqual(results[3], granted(30_000, 1))
      assert.deepStrictEqual(queueNames(state, 30), [])
    })

    it("does not hold back non-fair requests, re-entry or a downgrade", () => {
      const { results } = acquireAll([
        [request("a", { leaseMs: 10 }), 0],
        [fair("b"), 0],
        [fair("a", { leaseMs: 10 }), 1], // re-entry
        [shared("a", 1, Infinity, { fair: true, leaseMs: 10 }), 2], // downgrade
        [request("c"), 20] // barges past b
      ])
      assert.deepStrictEqual(results.slice(2), [granted(1, 2), granted(1, 1), granted(20_000, 1)])
    })

    it("applies to shared requests too", () => {
      const { results, state } = acquireAll([
        [request("w", { leaseMs: 10 }), 0],
        [fair("x", { waiterTtlMs: 40 }), 0],
        [shared("r", 1, Infinity, { fair: true }), 20] // w gone, but x is ahead
      ])
      assert.deepStrictEqual(results[2], denied(20))
      assert.deepStrictEqual(queueNames(state, 20), ["x", "r"])
    })

    it("cancel removes a waiter and leaves the others in order", () => {
      const { state } = acquireAll([[request("a"), 0], [fair("b"), 0], [fair("c"), 0], [fair("d"), 0]])
      const step = Rules.cancel(state, { key: K, holder: "c", leaseMs: 50 }, 1)
      assert.deepStrictEqual(queueNames(step.state, 1), ["b", "d"])
      assert.deepStrictEqual(Rules.cancel(step.state, { key: K, holder: "zz", leaseMs: 50 }, 1).state.keys.get(K)?.queue, step.state.keys.get(K)?.queue)
    })
  })

  describe("forceRelease", () => {
    it("drops every live holder, keeps the queue, reports whether anything was held", () => {
      const { state } = acquireAll([[shared("a", 1, 3), 0], [shared("b", 1, 3), 0], [request("c", { fair: true }), 0]])
      const step = Rules.forceRelease(state, { key: K, id: "force" }, 1)
      assert.strictEqual(step.result, true)
      assert.deepStrictEqual(holderNames(step.state, 1), [])
      assert.deepStrictEqual(queueNames(step.state, 1), ["c"])
      assert.strictEqual(view(step.state, 1).limit, undefined)
      assert.strictEqual(Rules.forceRelease(step.state, { key: K, id: "force-2" }, 2).result, false)
      // a second delivery of the same forced release answers as the first and drops no later holder
      const later = acquireAll([[request("d"), 2]], step.state).state
      const copy = Rules.forceRelease(later, { key: K, id: "force" }, 3)
      assert.strictEqual(copy.result, true)
      assert.deepStrictEqual(holderNames(copy.state, 3), ["d"])
      // expired holders do not count
      assert.strictEqual(Rules.forceRelease(state, { key: K, id: "force-3" }, 100).result, false)
    })
  })

  describe("at-least-once delivery", () => {
    it("an acquisition delivered twice takes one hold; so does a release", () => {
      const { results, state } = acquireAll([[request("a"), 0], [request("a", { count: 2 }), 1], [request("a", { count: 2 }), 2]])
      assert.deepStrictEqual(results, [granted(1, 1), granted(1, 2), granted(1, 2)])
      const release = { key: K, holder: "a", mode: "exclusive" as const, count: 2, leaseMs: 100 }
      const first = Rules.release(state, release, 3)
      const copy = Rules.release(first.state, release, 4)
      assert.deepStrictEqual([first.result, copy.result], [Either.right(1), Either.right(1)])
      assert.deepStrictEqual(holderNames(copy.state, 4), ["a"])
    })

    it("an ended holder is remembered for its lease: a late acquisition is NotHeld, a copy of the last release answers 0", () => {
      const { state } = acquireAll([[request("a"), 0]])
      const release = { key: K, holder: "a", mode: "exclusive" as const, count: 1, leaseMs: 100 }
      const ended = Rules.release(state, release, 10).state
      assert.strictEqual(tagOf(Rules.acquire(ended, request("a", { count: 1 }), 50).result), "NotHeld")
      assert.deepStrictEqual(Rules.release(ended, release, 50).result, Either.right(0))
      // forgotten after the lease
      assert.deepStrictEqual(Rules.acquire(ended, request("a", { count: 1 }), 110).result, granted(110_000, 1))
    })

    it("a re-entry by a holder that holds nothing is NotHeld: its hold was lost", () => {
      assert.strictEqual(tagOf(Rules.acquire(Rules.empty, request("a", { count: 2 }), 0).result), "NotHeld")
    })

    it("a cancelled waiter is not queued again by a late copy of its attempt", () => {
      const { state } = acquireAll([[request("a"), 0], [fair("b", { count: 1 }), 0]])
      const cancelled = Rules.cancel(state, { key: K, holder: "b", leaseMs: 100 }, 1).state
      const late = Rules.acquire(cancelled, fair("b", { count: 1 }), 2)
      assert.strictEqual(tagOf(late.result), "NotHeld")
      assert.deepStrictEqual(queueNames(late.state, 2), [])
    })

    it("fences are forgotten a lease after the last grant and once the clock passed them, and still go up", () => {
      let state = acquireAll([[request("a", { leaseMs: 10 }), 0], [request("b", { leaseMs: 10 }), 20]]).state
      assert.strictEqual(view(state, 25).fence, 20_000)
      state = Rules.release(state, { key: K, holder: "b", mode: "exclusive", count: 1, leaseMs: 10 }, 25).state
      assert.strictEqual(view(state, 31).fence, 0)
      const { results } = acquireAll([[request("c"), 31]], state)
      assert.deepStrictEqual(results, [granted(31_000, 1)])
    })

    describe("the same cases as the memory backend", () => {
      /** A release from `count`, as the lock API sends it. */
      const from = (holder: string, count: number, overrides: Partial<ReleaseRequest> = {}): ReleaseRequest => ({
        key: K,
        holder,
        mode: "exclusive",
        count,
        leaseMs: 100,
        ...overrides
      })
      /** Runs `f` over the state, keeping the next one: the result of each step. */
      const run = (state: Rules.State) => {
        let current = state
        const step = <A>(next: Rules.Step<A>): A => {
          current = next.state
          return next.result
        }
        return {
          get state() {
            return current
          },
          acquire: (req: AcquireRequest, now: number) => step(Rules.acquire(current, withCount(current, req, now), now)),
          release: (req: ReleaseRequest, now: number) => step(Rules.release(current, req, now)),
          forceRelease: (req: ForceReleaseRequest, now: number) => step(Rules.forceRelease(current, req, now)),
          cancel: (req: CancelRequest, now: number) => step(Rules.cancel(current, req, now)),
          renew: (reqs: ReadonlyArray<RenewRequest>, now: number) => step(Rules.renew(current, reqs, now))
        }
      }
      /** What the key still remembers at `now`, besides its live holders and queue. */
      const memory = (state: Rules.State, now: number, key = K) => {
        const live = Rules.liveKey(state, key, now)
        return { fence: view(state, now, key).fence, ended: [...live.ended.keys()] }
      }
      const forgotten = { fence: 0, ended: [] }

      it("a release delivered twice changes the count once", () => {
        const m = run(Rules.empty)
        assert.deepStrictEqual(m.acquire(request("a", { count: 1 }), 0), granted(1, 1))
        assert.deepStrictEqual(m.acquire(request("a", { count: 2 }), 0), granted(1, 2))
        assert.deepStrictEqual(m.release(from("a", 2), 1), Either.right(1))
        // the copy finds the count at 1 already: it answers 1 and leaves 1
        assert.deepStrictEqual(m.release(from("a", 2), 2), Either.right(1))
        assert.deepStrictEqual(view(m.state, 2).holders.map((h) => [h.holder, h.exclusive]), [["a", 1]])
        assert.deepStrictEqual(m.acquire(request("b"), 2), denied(98))
        // the same for a shared hold: the permits stay taken until the last release
        const sem = (holder: string, count: number) => shared(holder, 1, 2, { key: "sem", count })
        m.acquire(sem("r", 1), 3)
        m.acquire(sem("r", 2), 3)
        const sharedRelease = from("r", 2, { key: "sem", mode: "shared" })
        assert.deepStrictEqual([m.release(sharedRelease, 4), m.release(sharedRelease, 5)], [Either.right(1), Either.right(1)])
        assert.deepStrictEqual(view(m.state, 5, "sem").holders.map((h) => [h.holder, h.shared, h.permits]), [["r", 1, 1]])
        // the last release still ends the hold
        assert.deepStrictEqual(m.release(from("a", 1), 6), Either.right(0))
        assert.deepStrictEqual(m.acquire(request("b"), 6), granted(6_000, 1))
      })

      it("an acquisition delivered twice takes one hold: the copy answers Granted with the same fence", () => {
        const m = run(Rules.empty)
        const first = m.acquire(request("a", { count: 1 }), 0)
        assert.deepStrictEqual(first, granted(1, 1))
        // the clock moved: a new grant would take a new fence, the copy keeps the first
        assert.deepStrictEqual(m.acquire(request("a", { count: 1 }), 10), first)
        assert.deepStrictEqual(view(m.state, 10).holders.map((h) => [h.holder, h.exclusive, h.fence]), [["a", 1, 1]])
        // a re-entry delivered twice counts once
        assert.deepStrictEqual(m.acquire(request("a", { count: 2 }), 10), granted(1, 2))
        assert.deepStrictEqual(m.acquire(request("a", { count: 2 }), 10), granted(1, 2))
        assert.strictEqual(view(m.state, 10).holders[0]?.exclusive, 2)
        // two releases end it
        assert.deepStrictEqual(m.release(from("a", 2), 11), Either.right(1))
        assert.deepStrictEqual(m.acquire(request("b"), 11), denied(99))
        assert.deepStrictEqual(m.release(from("a", 1), 12), Either.right(0))
        assert.deepStrictEqual(m.acquire(request("b"), 12), granted(12_000, 1))
        // a shared acquisition delivered twice takes its permits once
        const sem = (holder: string) => shared(holder, 1, 2, { key: "sem", count: 1 })
        const r = m.acquire(sem("r1"), 13)
        assert.deepStrictEqual(m.acquire(sem("r1"), 13), r)
        assert.strictEqual(tagOf(m.acquire(sem("r2"), 13)), "Right")
        assert.deepStrictEqual(m.acquire(sem("r3"), 13), denied(100))
        assert.deepStrictEqual(view(m.state, 13, "sem").holders.map((h) => h.holder), ["r1", "r2"])
      })

      it("a late copy of an acquisition from a holder that ended is NotHeld for leaseMs, then forgotten", () => {
        const m = run(Rules.empty)
        m.acquire(request("a", { count: 1 }), 0)
        // remembered for the release's leaseMs (50), the fence for the grant's lease (100)
        assert.deepStrictEqual(m.release(from("a", 1, { leaseMs: 50 }), 0), Either.right(0))
        const late = m.acquire(request("a", { count: 1 }), 49)
        assert.strictEqual(tagOf(late), "NotHeld")
        assert.deepStrictEqual(
          Either.match(late, { onLeft: (e) => (e._tag === "NotHeld" ? [e._tag, e.key, e.holder] : [e._tag]), onRight: () => [] }),
          ["NotHeld", K, "a"]
        )
        // it granted nothing, and queued nothing
        assert.strictEqual(tagOf(m.acquire(request("a", { count: 1, fair: true }), 49)), "NotHeld")
        assert.deepStrictEqual([view(m.state, 49).holders, view(m.state, 49).queue], [[], []])
        assert.deepStrictEqual(memory(m.state, 49), { fence: 1, ended: ["a"] })
        assert.deepStrictEqual(memory(m.state, 50), { fence: 1, ended: [] })
        assert.deepStrictEqual(memory(m.state, 100), forgotten)
        // forgotten: a copy this late is taken for a new holder
        assert.deepStrictEqual(m.acquire(request("a", { count: 1 }), 100), granted(100_000, 1))
      })

      it("a re-entry by a holder that holds nothing is NotHeld and grants nothing", () => {
        const m = run(Rules.empty)
        assert.strictEqual(tagOf(m.acquire(request("a", { count: 2 }), 0)), "NotHeld")
        assert.strictEqual(tagOf(m.acquire(shared("r", 1, Infinity, { count: 2 }), 0)), "NotHeld")
        assert.deepStrictEqual(memory(m.state, 0), forgotten)
        assert.deepStrictEqual(view(m.state, 0).holders, [])
        // a hold that expired is gone too: re-entering it is NotHeld, not a fresh grant
        m.acquire(request("b", { count: 1 }), 0)
        assert.strictEqual(tagOf(m.acquire(request("b", { count: 2 }), 100)), "NotHeld")
        assert.deepStrictEqual(view(m.state, 100).holders, [])
        assert.deepStrictEqual(m.acquire(request("c"), 100), granted(100_000, 1))
      })

      it("a copy of a last release answers 0 within leaseMs and leaves a later holder alone", () => {
        const m = run(Rules.empty)
        m.acquire(request("a", { count: 1 }), 0)
        assert.deepStrictEqual(m.release(from("a", 1), 0), Either.right(0))
        const b = m.acquire(request("b", { count: 1 }), 0)
        assert.deepStrictEqual(b, granted(2, 1))
        assert.deepStrictEqual(m.release(from("a", 1), 99), Either.right(0))
        assert.deepStrictEqual(view(m.state, 99).holders.map((h) => [h.holder, h.exclusive, h.fence]), [["b", 1, 2]])
        // each copy is remembered for its own leaseMs; after that a release is NotHeld again
        assert.strictEqual(tagOf(m.release(from("a", 1), 199)), "NotHeld")
      })

      it("a forced release delivered twice does not drop a holder granted in between", () => {
        const m = run(Rules.empty)
        m.acquire(request("a", { count: 1 }), 0)
        const force = { key: K, id: "force-1" }
        assert.isTrue(m.forceRelease(force, 1))
        assert.deepStrictEqual(m.acquire(request("b", { count: 1 }), 1), granted(1_000, 1))
        // the copy answers as the first did, and changes nothing
        assert.isTrue(m.forceRelease(force, 2))
        assert.deepStrictEqual(view(m.state, 2).holders.map((h) => [h.holder, h.fence]), [["b", 1_000]])
        // the dropped holder is remembered: a late copy of its acquisition takes nothing
        assert.strictEqual(tagOf(m.acquire(request("a", { count: 1 }), 2)), "NotHeld")
        // a forced release that found nothing: its copy answers false, and leaves a later holder too
        const idle = { key: "other", id: "force-2" }
        assert.isFalse(m.forceRelease(idle, 3))
        m.acquire(request("c", { key: "other", count: 1 }), 3)
        assert.isFalse(m.forceRelease(idle, 4))
        assert.deepStrictEqual(view(m.state, 4, "other").holders.map((h) => h.holder), ["c"])
        // another id is another forced release
        assert.isTrue(m.forceRelease({ key: K, id: "force-3" }, 5))
        assert.deepStrictEqual(view(m.state, 5).holders, [])
        // ids are remembered forceReleaseMemoryMs, then nothing is left
        assert.deepStrictEqual(memory(m.state, 5 + forceReleaseMemoryMs), forgotten)
        assert.deepStrictEqual(memory(m.state, 4 + forceReleaseMemoryMs, "other"), forgotten)
      })

      it("a cancelled waiter is remembered: a late copy of its fair attempt does not queue it again", () => {
        const m = run(Rules.empty)
        m.acquire(fair("a", { count: 1 }), 0)
        assert.deepStrictEqual(m.acquire(fair("b", { count: 1 }), 0), denied(100))
        assert.deepStrictEqual(queueNames(m.state, 0), ["b"])
        m.cancel({ key: K, holder: "b", leaseMs: 100 }, 0)
        assert.strictEqual(tagOf(m.acquire(fair("b", { count: 1 }), 0)), "NotHeld")
        assert.deepStrictEqual(queueNames(m.state, 0), [])
        // not even once the key is free
        assert.deepStrictEqual(m.release(from("a", 1), 0), Either.right(0))
        assert.strictEqual(tagOf(m.acquire(fair("b", { count: 1 }), 0)), "NotHeld")
        assert.deepStrictEqual([view(m.state, 0).holders, view(m.state, 0).queue], [[], []])
        // forgotten after leaseMs, with the rest of the key
        assert.deepStrictEqual(memory(m.state, 100), forgotten)
      })

      it("a cancel by a current holder ends nothing: it re-enters and releases as before", () => {
        const m = run(Rules.empty)
        m.acquire(fair("a", { count: 1 }), 0)
        m.cancel({ key: K, holder: "a", leaseMs: 100 }, 0)
        assert.deepStrictEqual(memory(m.state, 0), { fence: 1, ended: [] })
        assert.deepStrictEqual(m.acquire(fair("a", { count: 2 }), 0), granted(1, 2))
        assert.deepStrictEqual(m.release(from("a", 2), 0), Either.right(1))
        assert.deepStrictEqual(m.release(from("a", 1), 0), Either.right(0))
        assert.deepStrictEqual(m.acquire(fair("b"), 0), granted(2, 1))
      })

      it("fences increase strictly across holders and are never below the clock in microseconds", () => {
        const m = run(Rules.empty)
        const fences: Array<number> = []
        const fenceOf = (result: Either.Either<AcquireResult, Rules.AcquireRefusal>) => {
          assert.isTrue(Either.isRight(result) && result.right._tag === "Granted")
          return Either.isRight(result) && result.right._tag === "Granted" ? result.right.fence : NaN
        }
        let now = 0
        for (const holder of ["a", "b", "c", "d"]) {
          const fence = fenceOf(m.acquire(request(holder, { count: 1 }), now))
          assert.isAtLeast(fence, Math.floor(now * 1000))
          fences.push(fence)
          m.release(from(holder, 1), now)
          now += 0.25
        }
        // readers granted in one instant: one microsecond apart at least
        for (const holder of ["r1", "r2", "r3"]) {
          fences.push(fenceOf(m.acquire(shared(holder, 1, Infinity, { count: 1 }), now)))
        }
        for (let i = 1; i < fences.length; i++) assert.isAbove(fences[i]!, fences[i - 1]!)
      })

      it("a fence ahead of the clock outlives the lease; once the key is idle and forgotten the next is the clock", () => {
        const m = run(Rules.empty)
        // 1500 grants in one instant: the fence runs ahead of the clock (0 µs)
        let last = 0
        for (let i = 0; i < 1500; i++) {
          const result = m.acquire(request(`h${i}`, { count: 1, leaseMs: 1 }), 0)
          assert.deepStrictEqual(result, granted(last + 1, 1))
          last++
          m.release(from(`h${i}`, 1, { leaseMs: 1 }), 0)
        }
        // every lease and every ended holder expired, but the clock has not passed the fence yet
        assert.isBelow(Math.floor(1.2 * 1000), last)
        assert.deepStrictEqual(memory(m.state, 1.2), { fence: last, ended: [] })
        assert.deepStrictEqual(m.acquire(request("x", { count: 1, leaseMs: 1 }), 1.2), granted(last + 1, 1))
        m.release(from("x", 1, { leaseMs: 1 }), 1.2)
        // idle past the lease and past fence / 1000 ms: forgotten
        assert.deepStrictEqual(memory(m.state, 3.2), forgotten)
        const after = m.acquire(request("y", { count: 1 }), 3.2)
        assert.deepStrictEqual(after, granted(Math.floor(3.2 * 1000), 1))
        assert.isAbove(Math.floor(3.2 * 1000), last + 1)
      })

      it("renew answers an Either per request, in order, and revives nothing", () => {
        const m = run(Rules.empty)
        m.acquire(request("a", { count: 1 }), 0)
        m.acquire(shared("r", 1, Infinity, { key: "other", count: 1 }), 0)
        m.acquire(request("e", { key: "ended", count: 1 }), 0)
        m.release(from("e", 1, { key: "ended" }), 0)
        const results = m.renew([
          { key: K, holder: "a", leaseMs: 100 },
          { key: "ended", holder: "e", leaseMs: 100 },
          { key: "other", holder: "r", leaseMs: 100 },
          { key: "never", holder: "z", leaseMs: 100 }
        ], 0)
        assert.isTrue(results.every(Either.isEither))
        assert.deepStrictEqual(results, [Either.right(true), Either.right(false), Either.right(true), Either.right(false)])
        assert.deepStrictEqual(m.renew([], 0), [])
        // the ended holder stays ended: a late copy of its acquisition is still refused
        assert.deepStrictEqual(view(m.state, 0, "ended").holders, [])
        assert.strictEqual(tagOf(m.acquire(request("e", { key: "ended", count: 1 }), 0)), "NotHeld")
        assert.deepStrictEqual(memory(m.state, 0, "never"), forgotten)
      })
    })
  })

  it("inspect of an untouched key is empty", () => {
    assert.deepStrictEqual(view(Rules.empty, 0, "nothing"), {
      key: "nothing",
      fence: 0,
      limit: undefined,
      holders: [],
      queue: []
    })
  })

  it("never mutates its input state", () => {
    // a holder, an ended holder and a waiter: every part of a key, the memory of ended holders included
    let { state } = acquireAll([[request("a"), 0], [request("e", { key: "x" }), 0]])
    state = Rules.release(state, releaseOf(state, "e", "exclusive", 0, "x"), 0).state
    state = acquireAll([[fair("w"), 0]], state).state
    const snapshot = (s: Rules.State) =>
      JSON.stringify([...s.keys].map(([key, value]) => [key, { ...value, ended: [...value.ended] }]))
    const before = snapshot(state)
    assert.include(before, "\"e\"")
    Rules.acquire(state, withCount(state, request("a"), 1), 1)
    Rules.acquire(state, withCount(state, request("e", { key: "x" }), 1), 1)
    Rules.release(state, releaseOf(state, "a", "exclusive", 1), 1)
    Rules.release(state, releaseOf(state, "e", "exclusive", 1, "x"), 1)
    Rules.renew(state, [{ key: K, holder: "a", leaseMs: 500 }], 1)
    Rules.forceRelease(state, { key: K, id: "force" }, 1)
    Rules.cancel(state, { key: K, holder: "w", leaseMs: 100 }, 1)
    Rules.acquire(state, withCount(state, fair("b"), 1), 1)
    Rules.inspect(state, K, 200)
    assert.strictEqual(snapshot(state), before)
  })
})

describe("Model: latches", () => {
  const right = <A>(e: Either.Either<A, unknown>): A => Either.getOrThrowWith(e, (error) => new Error(String(error)))

  it("sets only at 0, counts down to 0 and not below, and applies a call once", () => {
    let state = Rules.empty
    const set = { key: "l", id: "s1", count: 2 }
    const step = Rules.latchSetCount(state, set, 0)
    assert.isTrue(right(step.result))
    state = step.state
    assert.isFalse(right(Rules.latchSetCount(state, { key: "l", id: "s2", count: 5 }, 1).result))
    // a copy of the applied set answers as the first did
    assert.isTrue(right(Rules.latchSetCount(state, set, 1).result))
    const down = { key: "l", id: "d1" }
    const first = Rules.latchCountDown(state, down, 2)
    assert.strictEqual(right(first.result), 1)
    state = first.state
    assert.strictEqual(right(Rules.latchCountDown(state, down, 3).result), 1, "a copy counted again")
    state = Rules.latchCountDown(state, { key: "l", id: "d2" }, 4).state
    assert.strictEqual(right(Rules.latchCount(state, "l", 5).result), 0)
    assert.strictEqual(right(Rules.latchCountDown(state, { key: "l", id: "d3" }, 6).result), 0)
    // once forgotten, a late copy of the first set applies again: the memory is bounded
    assert.isTrue(right(Rules.latchSetCount(state, set, 7).result))
    assert.strictEqual(right(Rules.latchCount(Rules.latchSetCount(state, set, 60_001).state, "l", 60_001).result), 2)
    // and a latch at 0 that remembers nothing is gone from the state
    assert.strictEqual(Rules.latchCountDown(Rules.empty, { key: "l", id: "x" }, 0).state.latches.size, 0)
  })

  it("refuses latch calls on a key a lock holds", () => {
    const { state } = acquireAll([[request("a", { key: "l" }), 0]])
    const results: ReadonlyArray<Either.Either<unknown, Rules.AcquireRefusal>> = [
      Rules.latchSetCount(state, { key: "l", id: "s", count: 1 }, 1).result,
      Rules.latchCountDown(state, { key: "l", id: "d" }, 1).result,
      Rules.latchCount(state, "l", 1).result
    ]
    for (const result of results) {
      assert.isTrue(Either.isLeft(result) && result.left._tag === "InvalidLockOptions" && result.left.field === "key")
    }
  })
})
