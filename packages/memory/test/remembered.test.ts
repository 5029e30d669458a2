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
