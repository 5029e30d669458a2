/**
 * The command timeout of the Redis backend's calls: one timer for all calls in flight. Each call
 * must expire at its own deadline, never earlier, and a call that ended must never expire. The
 * timeout bounds a route's silence: a call waiting behind replies that keep coming waits its turn.
 */
import { afterEach, assert, beforeEach, describe, it, vi } from "@effect/vitest"
import { makeDeadlines } from "../src/internal/deadlines.js"

describe("deadlines of calls in flight", () => {
  beforeEach(() => {
    vi.useFakeTimers()
  })
  afterEach(() => {
    vi.useRealTimers()
  })

  const clock = () => Date.now()
  /** Fake timers: the judgement the timer defers until the sockets were read runs at once. */
  const now = (f: () => void) => f()

  it("each call expires at its own deadline, in start order, and not before", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const expired: Array<string> = []
    deadlines.start("commands", () => expired.push("a"))
    vi.advanceTimersByTime(30)
    deadlines.start("commands", () => expired.push("b"))
    vi.advanceTimersByTime(69)
    assert.deepStrictEqual(expired, [])
    vi.advanceTimersByTime(1)
    assert.deepStrictEqual(expired, ["a"])
    vi.advanceTimersByTime(29)
    assert.deepStrictEqual(expired, ["a"])
    vi.advanceTimersByTime(1)
    assert.deepStrictEqual(expired, ["a", "b"])
    assert.strictEqual(deadlines.size(), 0)
  })

  it("a call that ended never expires, and the ones after it still do", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const expired: Array<string> = []
    const a = deadlines.start("commands", () => expired.push("a"))
    vi.advanceTimersByTime(50)
    const b = deadlines.start("commands", () => expired.push("b"))
    deadlines.start("commands", () => expired.push("c"))
    deadlines.end(a)
    deadlines.end(b)
    vi.advanceTimersByTime(1_000)
    assert.deepStrictEqual(expired, ["c"])
  })

  it("a call started after the timer was set for an earlier one (since ended) gets its full timeout", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const expired: Array<string> = []
    deadlines.end(deadlines.start("commands", () => expired.push("a")))
    vi.advanceTimersByTime(90)
    deadlines.start("commands", () => expired.push("b"))
    // the timer set for a fires at 100 and finds b 10 ms old
    vi.advanceTimersByTime(99)
    assert.deepStrictEqual(expired, [])
    vi.advanceTimersByTime(1)
    assert.deepStrictEqual(expired, ["b"])
  })

  it("a reply on the route moves the deadline of the calls waiting behind it; silence after it expires them", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const expired: Array<string> = []
    deadlines.start("commands", () => expired.push("a"))
    deadlines.start("commands", () => expired.push("b"))
    deadlines.start("commands:7", () => expired.push("other route"))
    vi.advanceTimersByTime(60)
    // an earlier call was answered: the server answers, these wait in line
    deadlines.heard("commands")
    vi.advanceTimersByTime(40)
    assert.deepStrictEqual(expired, ["other route"])
    vi.advanceTimersByTime(59)
    assert.deepStrictEqual(expired, ["other route"])
    // silent for the whole timeout since the last reply
    vi.advanceTimersByTime(1)
    assert.deepStrictEqual(expired, ["other route", "a", "b"])
    assert.strictEqual(deadlines.size(), 0)
  })

  it("replies that keep coming keep a call in line as long as they come", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const expired: Array<string> = []
    const a = deadlines.start("commands", () => expired.push("a"))
    for (let i = 0; i < 10; i++) {
      vi.advanceTimersByTime(90)
      deadlines.heard("commands")
    }
    assert.deepStrictEqual(expired, [])
    deadlines.end(a)
    vi.advanceTimersByTime(1_000)
    assert.deepStrictEqual(expired, [])
  })

  it("a reply heard before the call started does not extend it", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const expired: Array<string> = []
    deadlines.start("commands", () => expired.push("first"))
    deadlines.heard("commands")
    vi.advanceTimersByTime(10)
    deadlines.start("commands", () => expired.push("a"))
    vi.advanceTimersByTime(100)
    assert.deepStrictEqual(expired, ["first", "a"])
  })

  it("a process busy past the deadline reads the sockets before it judges", () => {
    let judge: (() => void) | undefined
    const deadlines = makeDeadlines(100, clock, (f) => {
      judge = f
    })
    const expired: Array<string> = []
    deadlines.start("commands", () => expired.push("a"))
    vi.advanceTimersByTime(100)
    // the timer fired and deferred its judgement until the event loop has read the sockets
    assert.deepStrictEqual(expired, [])
    assert.isDefined(judge)
    // the poll phase: a reply that came while the process was busy
    deadlines.heard("commands")
    judge!()
    judge = undefined
    assert.deepStrictEqual(expired, [])
    assert.strictEqual(deadlines.size(), 1)
    // then silence for the whole timeout
    vi.advanceTimersByTime(100)
    judge!()
    assert.deepStrictEqual(expired, ["a"])
  })

  it("one timer at a time, whatever the number of calls", () => {
    const deadlines = makeDeadlines(100, clock, now)
    const pending = Array.from({ length: 1_000 }, () => deadlines.start("commands", () => undefined))
    assert.strictEqual(vi.getTimerCount(), 1)
    for (const p of pending) deadlines.end(p)
    assert.strictEqual(deadlines.size(), 0)
    assert.strictEqual(vi.getTimerCount(), 1)
    vi.advanceTimersByTime(100)
    assert.strictEqual(vi.getTimerCount(), 0)
  })
})
