/**
 * A release wakes only waiters that can win, on a real redis-server: 100 fibers of one process
 * on one key cost at most 3 acquire calls per grant (see memory/test/fixtures/herd.ts), for every
 * kind. Semaphores are the demanding case: overlapping releases must not wake more waiters than
 * there are free permits, counting those woken before that have yet to try; and the `0` of a
 * release that had no registered waiter to wake (the contenders were still subscribing) must not
 * wake every shared waiter, as a Redisson unlock does.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { RedisServer } from "@lockstep/servers"
import { callsPerGrantBudget, contend, kinds } from "../../memory/test/fixtures/herd.js"
import { backendOn, runnable, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis wake-up herd suite (herd.test.ts)")

describe.runIf(runnable)("Redis backend: wake-ups without a herd", () => {
  for (const kind of kinds) {
    it.scopedLive(`${kind}: 100 contenders, at most ${callsPerGrantBudget} acquire calls per grant`, () =>
      Effect.gen(function*() {
        const server = yield* RedisServer.make()
        const backend = yield* backendOn(server.url, { commandTimeout: "5 seconds" })
        const { acquires, grants, perGrant } = yield* contend(backend, kind, "herd")
        console.log(`[herd] redis ${kind}: ${acquires} acquire calls for ${grants} grants (${perGrant.toFixed(2)} per grant)`)
        assert.strictEqual(grants, 100)
        assert.isAtMost(perGrant, callsPerGrantBudget)
      }), 60_000)
  }
})
