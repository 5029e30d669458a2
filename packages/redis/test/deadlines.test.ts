/**
 * The command timeout of the Redis backend's calls: one timer for all calls in flight. Each call
 * must expire at its own deadline, never earlier, and a call that ended must never expire.
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

  it("each call expires at its own deadline, in start order, and not before", () => {
    const deadlines = makeDeadlines(100, clock)
    const expired: Array<string> = []
    deadlines.start(() => expired.push("a"))
    vi.advanceTimersByTime(30)
    deadlines.start(() => expired.push("b"))
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
    const deadlines = makeDeadlines(100, clock)
    const expired: Array<string> = []
    const a = deadlines.start(() => expired.push("a"))
    vi.advanceTimersByTime(50)
    const b = deadlines.start(() => expired.push("b"))
    deadlines.start(() => expired.push("c"))
    deadlines.end(a)
    deadlines.end(b)
    vi.advanceTimersByTime(1_000)
    assert.deepStrictEqual(expired, ["c"])
  })

  it("a call started after the timer was set for an earlier one (since ended) gets its full timeout", () => {
    const deadlines = makeDeadlines(100, clock)
    const expired: Array<string> = []
    deadlines.end(deadlines.start(() => expired.push("a")))
    vi.advanceTimersByTime(90)
    deadlines.start(() => expired.push("b"))
    // the timer set for a fires at 100 and finds b 10 ms old
    vi.advanceTimersByTime(99)
    assert.deepStrictEqual(expired, [])
    vi.advanceTimersByTime(1)
    assert.deepStrictEqual(expired, ["b"])
  })

  it("one timer at a time, whatever the number of calls", () => {
    const deadlines = makeDeadlines(100, clock)
    const pending = Array.from({ length: 1_000 }, () => deadlines.start(() => undefined))
    assert.strictEqual(vi.getTimerCount(), 1)
    for (const p of pending) deadlines.end(p)
    assert.strictEqual(deadlines.size(), 0)
    assert.strictEqual(vi.getTimerCount(), 1)
    vi.advanceTimersByTime(100)
    assert.strictEqual(vi.getTimerCount(), 0)
  })
})
