/**
 * Nothing of lockstep's keeps the process alive once its scopes are closed: every lock path on
 * the Redis backend, under `layer({ client })` and under `layerConfig`, run in a child process
 * (see fixtures/exitPaths.ts); keys it must find taken are held by this process meanwhile.
 */
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { FairLock, Lock } from "@lockstep/core"
import { RedisServer } from "@lockstep/servers"
import { runChild } from "../../core/test/fixtures/exitScenarios.js"
import { backendOn, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis process exit suite (exit.test.ts)")

const fixture = fileURLToPath(new URL("./fixtures/exitPaths.ts", import.meta.url))

/** Long enough for sockets to close and the process to end on a busy machine, far below ioredis's 2 s timers. */
const settleBoundMs = 300
// the exit of a whole process on a loaded 2-core machine took up to ~460 ms; the bound stays below
// the shortest timer this must catch when one is left (an idle channel's unsubscribe, 1 s)
const exitBoundMs = 800

describe.runIf(runnable)("process exit (Redis backend)", () => {
  it.scopedLive("every lock path leaves nothing that keeps the process alive once its backend closed", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      // this process is the other holder the child finds
      const backend = yield* backendOn(server.url)
      yield* withBackend(backend)(Effect.flatMap(Lock.make("exit:process:lock", { lease: "1 minute" }), (l) => Lock.acquire(l)))
      yield* withBackend(backend)(Effect.flatMap(FairLock.make("exit:process:fair", { lease: "1 minute" }), (l) => Lock.acquire(l)))

      const failures: Array<string> = []
      for (const kind of ["client", "config"]) {
        const { exitedAfterMs, reports, stdout } = yield* runChild(fixture, [kind, server.url], { REDIS_URL: server.url })
        assert.isAtLeast(reports.length, 11, stdout)
        for (const report of reports) {
          console.log(`[exit] ${kind}: ${report.name}: settled after ${report.settledMs} ms${report.left.length > 0 ? `, still alive: ${report.left.join(", ")}` : ""}`)
          if (report.error !== undefined) failures.push(`${kind}: ${report.name}: ${report.error}`)
          if (report.left.length > 0 || report.settledMs >= settleBoundMs) {
            failures.push(`${kind}: ${report.name}: alive ${report.settledMs} ms after its scope closed (${report.left.join(", ")})`)
          }
        }
        console.log(`[exit] ${kind}: exited ${exitedAfterMs} ms after the program ended`)
        if (exitedAfterMs >= exitBoundMs) failures.push(`${kind}: exited ${exitedAfterMs} ms after the program ended`)
      }
      assert.deepStrictEqual(failures, [])
    }), 120_000)
})
