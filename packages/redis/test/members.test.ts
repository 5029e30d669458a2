/**
 * The waiter entries (src/internal/scripts/members.ts) are written and read in two languages: the
 * TypeScript builders (the entry the backend notes for a registered waiter, the entries a cancel
 * names) and the Lua helpers of the scripts. On a real redis-server: the acquire script writes
 * exactly the entries the TypeScript builds, and the Lua parsers read those entries field by
 * field. A change to one side alone fails here.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Redis } from "ioredis"
import type { AcquireRequest } from "@lockstep/core/LockBackend"
import * as scripts from "../src/internal/scripts/lock.js"
import { fairMember, limitOf, modeOf, waiterMember } from "../src/internal/scripts/members.js"
import { base, fence, prelude } from "../src/internal/scripts/shared.js"
import { wakeCode } from "../src/internal/wakeups.js"
import { call, ownServerUrl, rawClient, runnable, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis waiter entries suite (members.test.ts)")

const request = (key: string, holder: string, fields: Partial<AcquireRequest>): AcquireRequest => ({
  key,
  holder,
  mode: "exclusive",
  permits: 1,
  limit: 1,
  leaseMs: 30_000,
  fair: false,
  waiterTtlMs: 20_000,
  count: 1,
  ...fields
})

/** Runs the acquire script for `r` (registering it as a subscribed waiter when `register`). */
const acquire = (raw: Redis, r: AcquireRequest, register: boolean, claimMs: number) => {
  const keys = scripts.acquire.keys(r.key, r.holder, undefined)
  const args = scripts.acquire.args(r, wakeCode(r.holder), register, claimMs, undefined)
  return call(raw, "EVAL", scripts.acquire.lua, keys.length, ...keys, ...args)
}

/** The waiters the Lua parsers read from `entries` (unfair ones, then fair ones), every field a string. */
const parseLua = `${prelude}${fence}${base}
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local m = ARGV[1 + i]
  local c, mode, p, l, ms, h = unfair_entry(m)
  local heldMode, heldPermits = unfair_hold(m)
  out[#out + 1] = { c, mode, fmt(p), fmt(l), fmt(ms), h, code_of(m), heldMode, heldPermits }
end
for i = 2 + tonumber(ARGV[1]), #ARGV do
  local m = ARGV[i]
  local c, ms, h = fair_entry(m)
  out[#out + 1] = { c, fmt(ms), h, code_of(m), fair_holder(m) }
end
return out
`

/** Unfair waiters: holder, request fields, claim. */
const unfair: ReadonlyArray<readonly [string, Partial<AcquireRequest>, number]> = [
  ["0b9a6c1e-0000-4000-8000-000000000001:1", {}, 2_000],
  ["0b9a6c1e-0000-4000-8000-000000000002:7", { mode: "shared", permits: 2, limit: 3 }, 0],
  ["0b9a6c1e-0000-4000-8000-000000000003:1", { mode: "shared", permits: 1, limit: Infinity }, 1_500],
  // a holder id with the separator in it: the holder is the rest of the entry
  ["odd|holder:1", {}, 600]
]

/** Fair waiters: holder, claim. */
const fair: ReadonlyArray<readonly [string, number]> = [
  ["0b9a6c1e-0000-4000-8000-000000000004:1", 0],
  ["0b9a6c1e-0000-4000-8000-000000000005:3", 2_000],
  ["odd|holder:2", 900]
]

describe.runIf(runnable)("waiter entries: the TypeScript and the Lua agree", () => {
  it.scopedLive("the acquire script writes the entries the TypeScript builds", () =>
    Effect.gen(function*() {
      const raw = yield* rawClient(yield* ownServerUrl)
      for (const [i, [holder, fields, claimMs]] of unfair.entries()) {
        const key = `members-unfair-${i}`
        // held by another: the waiter is denied and registered
        yield* acquire(raw, request(key, "elsewhere:1", {}), false, 0)
        const waiter = request(key, holder, fields)
        const reply = (yield* acquire(raw, waiter, true, claimMs)) as Array<unknown>
        assert.strictEqual(Number(reply[0]), 0, `${holder} was not denied`)
        assert.deepStrictEqual(
          yield* call(raw, "ZRANGE", `lockstep_waiters:{${key}}`, 0, -1),
          [waiterMember(waiter, wakeCode(holder), claimMs)]
        )
      }
      for (const [i, [holder, claimMs]] of fair.entries()) {
        const key = `members-fair-${i}`
        yield* acquire(raw, request(key, "elsewhere:1", { fair: true }), false, 0)
        const waiter = request(key, holder, { fair: true })
        // queued before it waits on a subscription (claim 0), then with its claim
        yield* acquire(raw, waiter, false, claimMs)
        assert.deepStrictEqual(yield* call(raw, "ZRANGE", `lockstep_fair:{${key}}`, 0, -1), [fairMember(holder, 0)])
        yield* acquire(raw, waiter, true, claimMs)
        assert.deepStrictEqual(yield* call(raw, "ZRANGE", `lockstep_fair:{${key}}`, 0, -1), [fairMember(holder, claimMs)])
      }
    }))

  it.scopedLive("the Lua parsers read the entries the TypeScript builds, field by field", () =>
    Effect.gen(function*() {
      const raw = yield* rawClient(yield* ownServerUrl)
      const unfairEntries = unfair.map(([holder, fields, claimMs]) =>
        waiterMember(request("k", holder, fields), wakeCode(holder), claimMs)
      )
      const fairEntries = fair.map(([holder, claimMs]) => fairMember(holder, claimMs))
      const parsed = yield* call(raw, "EVAL", parseLua, 0, unfairEntries.length, ...unfairEntries, ...fairEntries)
      const expected = [
        ...unfair.map(([holder, fields, claimMs]) => {
          const r = request("k", holder, fields)
          const code = wakeCode(holder)
          const mode = modeOf(r.mode)
          return [code, mode, String(r.permits), String(limitOf(r.limit)), String(claimMs), holder, code, mode, String(r.permits)]
        }),
        ...fair.map(([holder, claimMs]) => {
          const code = wakeCode(holder)
          return [code, String(claimMs), holder, code, holder]
        })
      ]
      assert.deepStrictEqual(parsed, expected)
    }))
})
