import { assert, describe, it } from "@effect/vitest"
import { FastCheck } from "effect"
import { makeRemembered } from "../src/internal/remembered.js"

describe("remembered ids", () => {
  it("answers as a map of each id's latest time would, through sets, resets and forgetting", () =>
    FastCheck.assert(
      FastCheck.property(
        FastCheck.array(
          FastCheck.oneof(
            FastCheck.record({ op: FastCheck.constant("set" as const), id: FastCheck.nat(20), ttl: FastCheck.integer({ min: 1, max: 50 }) }),
            FastCheck.record({ op: FastCheck.constant("forget" as const), advance: FastCheck.integer({ min: 0, max: 30 }) })
          ),
          { maxLength: 300 }
        ),
        (commands) => {
          const remembered = makeRemembered()
          const latest = new Map<string, number>()
          let now = 0
          for (const command of commands) {
            if (command.op === "set") {
              latest.set(`${command.id}`, now + command.ttl)
              remembered.set(`${command.id}`, now + command.ttl)
            } else {
              now += command.advance
              remembered.forget(now)
            }
            for (let id = 0; id <= 20; id++) {
              assert.strictEqual(remembered.has(`${id}`, now), (latest.get(`${id}`) ?? 0) > now, `id ${id} at ${now}`)
            }
            const live = [...latest.values()].filter((until) => until > now).length
            assert.isAtLeast(remembered.size(), live)
          }
          // once every time is up, everything is forgotten
          remembered.forget(now + 100)
          assert.strictEqual(remembered.size(), 0)
        }
      )
    ))

  it("forgets the oldest ids and keeps the rest across many arrivals, compacting its queue", () => {
    const remembered = makeRemembered()
    for (let i = 0; i < 10_000; i++) remembered.set(`h${i}`, i + 1)
    remembered.forget(6_000)
    assert.strictEqual(remembered.size(), 4_000)
    assert.isFalse(remembered.has("h5999", 6_000))
    assert.isTrue(remembered.has("h6000", 6_000))
    for (let i = 10_000; i < 12_000; i++) remembered.set(`h${i}`, i + 1)
    remembered.forget(11_000)
    assert.strictEqual(remembered.size(), 1_000)
    assert.isTrue(remembered.has("h11999", 11_000))
    remembered.forget(12_000)
    assert.strictEqual(remembered.size(), 0)
  })
})

describe("remembered numbered ids (`<client>:<n>`, as holders are)", () => {
  const ids = FastCheck.oneof(
    FastCheck.tuple(FastCheck.constantFrom("a", "b:c", ""), FastCheck.nat(40)).map(([prefix, n]) => `${prefix}:${n}`),
    FastCheck.constantFrom("a:", "a:01", "a:1e3", "a: 7", "a:x", "plain", ":", "a:0x1f", "a:9007199254740993")
  )
  it("answer as a map of each id's latest time would, also for ids numbered past any set", () =>
    FastCheck.assert(
      FastCheck.property(
        FastCheck.array(
          FastCheck.oneof(
            FastCheck.record({ op: FastCheck.constant("set" as const), id: ids, ttl: FastCheck.integer({ min: 1, max: 50 }) }),
            FastCheck.record({ op: FastCheck.constant("forget" as const), advance: FastCheck.integer({ min: 0, max: 30 }) }),
            FastCheck.record({ op: FastCheck.constant("has" as const), id: ids })
          ),
          { maxLength: 300 }
        ),
        (commands) => {
          const remembered = makeRemembered()
          const latest = new Map<string, number>()
          let now = 0
          for (const command of commands) {
            if (command.op === "set") {
              latest.set(command.id, now + command.ttl)
              remembered.set(command.id, now + command.ttl)
            } else if (command.op === "forget") {
              now += command.advance
              remembered.forget(now)
            } else {
              assert.strictEqual(remembered.has(command.id, now), (latest.get(command.id) ?? 0) > now, `${command.id} at ${now}`)
            }
            for (const id of latest.keys()) {
              assert.strictEqual(remembered.has(id, now), latest.get(id)! > now, `${id} at ${now}`)
            }
            const live = [...latest.values()].filter((until) => until > now).length
            assert.isAtLeast(remembered.size(), live)
            assert.isAtMost(remembered.size(), latest.size)
          }
          remembered.forget(now + 100)
          assert.strictEqual(remembered.size(), 0)
        }
      )
    ))
})

describe("remembered holders of one process, ending in order", () => {
  it("are found until their time, forgotten oldest first, and the memory empties", () => {
    const remembered = makeRemembered()
    const id = (n: number) => `client:${n}`
    for (let n = 0; n < 5_000; n++) remembered.set(id(n), n + 10)
    assert.strictEqual(remembered.size(), 5_000)
    assert.isTrue(remembered.has(id(0), 9))
    assert.isFalse(remembered.has(id(0), 10))
    assert.isTrue(remembered.has(id(4_999), 5_000))
    assert.isFalse(remembered.has(id(5_000), 0))
    assert.isFalse(remembered.has("other:17", 0))
    // set again (out of the run's order): the latest time answers, counted once
    remembered.set(id(100), 20_000)
    assert.strictEqual(remembered.size(), 5_000)
    remembered.forget(3_000)
    assert.isTrue(remembered.has(id(100), 3_000))
    assert.isFalse(remembered.has(id(2_990), 3_000))
    assert.isTrue(remembered.has(id(2_991), 3_000))
    assert.strictEqual(remembered.size(), 2_009 + 1)
    remembered.forget(19_999)
    assert.strictEqual(remembered.size(), 1)
    remembered.forget(20_000)
    assert.strictEqual(remembered.size(), 0)
    assert.isFalse(remembered.has(id(100), 20_000))
  })
})
