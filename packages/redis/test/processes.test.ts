/**
 * Two OS processes contend on one lock against one real redis-server: each runs
 * `fixtures/contender.ts` (through tsx) and prints its holds with times on a clock both processes
 * share; the merged history must show mutual exclusion and strictly increasing fences, and both
 * processes must have held the lock.
 */
import { assert, describe, it } from "@effect/vitest"
import type { ChildProcess } from "node:child_process"
import { spawn } from "node:child_process"
import * as path from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import { Deferred, Effect, Exit } from "effect"
import type { Scope } from "effect"
import { History, RedisServer } from "@lockstep/testkit"
import { runnable, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis multi-process suite (processes.test.ts)")

const root = fileURLToPath(new URL("../../../", import.meta.url))
const tsx = path.join(root, "node_modules", ".bin", "tsx")
const contender = fileURLToPath(new URL("./fixtures/contender.ts", import.meta.url))

interface Hold {
  readonly process: number
  readonly holder: string
  readonly fence: number
  readonly start: number
  readonly end: number
  readonly startWall: number
  readonly endWall: number
}

interface Contender {
  readonly holds: Array<Hold>
  readonly ready: Deferred.Deferred<void>
  readonly exited: Deferred.Deferred<number | null>
  readonly stderr: { text: string }
  readonly child: ChildProcess
}

/** Spawns a contender process (killed with the scope if still running) and collects its lines. */
const spawnContender = (
  index: number,
  args: ReadonlyArray<string>
): Effect.Effect<Contender, never, Scope.Scope> =>
  Effect.gen(function*() {
    const ready = yield* Deferred.make<void>()
    const exited = yield* Deferred.make<number | null>()
    const holds: Array<Hold> = []
    const stderr = { text: "" }
    const child = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const child = spawn(tsx, [contender, ...args], { cwd: root, stdio: ["pipe", "pipe", "pipe"] })
        child.on("error", (error) => {
          stderr.text += `\n[spawn] ${error.message}`
          Deferred.unsafeDone(exited, Exit.succeed(null))
        })
        child.on("exit", (code) => Deferred.unsafeDone(exited, Exit.succeed(code)))
        child.stdin?.on("error", () => undefined)
        child.stderr?.on("data", (chunk: Buffer) => {
          stderr.text = (stderr.text + chunk.toString()).slice(-4_000)
        })
        if (child.stdout !== null) {
          createInterface({ input: child.stdout }).on("line", (line) => {
            let record: { readonly type?: unknown } & Record<string, unknown>
            try {
              record = JSON.parse(line) as typeof record
            } catch {
              stderr.text += `\n[stdout] ${line}`
              return
            }
            if (record.type === "ready") Deferred.unsafeDone(ready, Exit.void)
            if (record.type === "hold") {
              holds.push({
                process: index,
                holder: String(record["holder"]),
                fence: Number(record["fence"]),
                start: Number(record["start"]),
                end: Number(record["end"]),
                startWall: Number(record["startWall"]),
                endWall: Number(record["endWall"])
              })
            }
          })
        }
        return child
      }),
      (child) =>
        Effect.sync(() => {
          if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
        })
    )
    return { holds, ready, exited, stderr, child }
  })

/** The holds as a history: a grant at `start` and a release at `end` on the chosen clock. */
const historyOf = (key: string, holds: ReadonlyArray<Hold>, clock: "mono" | "wall"): ReadonlyArray<History.Event> =>
  holds.flatMap((h) => [
    History.Event.Grant({
      at: clock === "mono" ? h.start : h.startWall,
      key,
      holder: h.holder,
      mode: "exclusive",
      permits: 1,
      limit: 1,
      fence: h.fence
    }),
    History.Event.Release({ at: clock === "mono" ? h.end : h.endWall, key, holder: h.holder, mode: "exclusive" })
  ])

/**
 * Two contender processes take `key` on `urls` (one server, or a RedLock over several) `rounds`
 * times each; the merged history must be clean and the fences increase in hold order.
 */
const contendAcrossProcesses = (label: string, urls: ReadonlyArray<string>, key: string, rounds: number) =>
    Effect.gen(function*() {
      const startedAt = performance.now()
      const contenders = yield* Effect.forEach(
        [0, 1],
        (i) => spawnContender(i, [urls.join(","), key, String(rounds), "2"]),
        { concurrency: "unbounded" }
      )
      const describeChildren = () => contenders.map((c, i) => `contender ${i} stderr:\n${c.stderr.text}`).join("\n")
      // both connected, then both start at once
      yield* Effect.forEach(contenders, (c) => Deferred.await(c.ready), { concurrency: "unbounded" }).pipe(
        Effect.timeoutFail({ duration: "15 seconds", onTimeout: () => new Error(`contenders not ready:\n${describeChildren()}`) })
      )
      const readyAfter = performance.now() - startedAt
      for (const c of contenders) c.child.stdin?.end("go\n")
      const codes = yield* Effect.forEach(contenders, (c) => Deferred.await(c.exited), { concurrency: "unbounded" }).pipe(
        Effect.timeoutFail({ duration: "15 seconds", onTimeout: () => new Error(`contenders did not finish:\n${describeChildren()}`) })
      )
      assert.deepStrictEqual(codes, [0, 0], describeChildren())

      const holds = contenders.flatMap((c) => c.holds).sort((a, b) => a.start - b.start)
      const perProcess = contenders.map((c) => c.holds.length)
      let switches = 0
      for (let i = 1; i < holds.length; i++) if (holds[i]!.process !== holds[i - 1]!.process) switches++
      const mono = History.check(historyOf(key, holds, "mono"))
      const wall = History.check(historyOf(key, holds, "wall"))
      let minGapMs = Infinity
      for (let i = 1; i < holds.length; i++) minGapMs = Math.min(minGapMs, holds[i]!.start - holds[i - 1]!.end)
      console.log(
        `[${label}] 2 processes x ${rounds} rounds: holds per process ${JSON.stringify(perProcess)}, ` +
          `${switches} hand-overs between the processes, smallest gap between holds ${minGapMs.toFixed(3)} ms, ` +
          `fences ${holds[0]?.fence}..${holds[holds.length - 1]?.fence}; violations: ${mono.length} (monotonic clock), ` +
          `${wall.length} (timeOrigin + now); ready after ${readyAfter.toFixed(0)} ms, all done after ${
            (performance.now() - startedAt).toFixed(0)
          } ms`
      )
      assert.deepStrictEqual(perProcess, [rounds, rounds])
      assert.strictEqual(new Set(holds.map((h) => h.holder.split(":")[0])).size, 2, "two backends (client ids)")
      assert.deepStrictEqual(mono.map(History.formatViolation), [])
      assert.deepStrictEqual(wall.map(History.formatViolation), [])
      for (let i = 1; i < holds.length; i++) {
        assert.isAbove(holds[i]!.fence, holds[i - 1]!.fence, "fences strictly increase in hold order")
      }
      assert.isAtLeast(switches, 1, "the lock passed between the processes")
      // the check has teeth on this data: stretching every hold by 5 ms makes neighbours overlap
      const stretched = holds.map((h) => ({ ...h, end: h.end + 5 }))
      assert.include(History.check(historyOf(key, stretched, "mono")).map((v) => v._tag), "Overlap")
    })

describe.runIf(runnable)("two processes contend on one lock on real redis-servers", () => {
  it.scopedLive("mutual exclusion and increasing fences across processes; both processes hold the lock", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      yield* contendAcrossProcesses("processes", [server.url], "processes-contended", 60)
    }), 60_000)

  it.scopedLive("the same with a RedLock over three servers in each process", () =>
    Effect.gen(function*() {
      const servers = yield* Effect.forEach([0, 1, 2], () => RedisServer.make(), { concurrency: "unbounded" })
      yield* contendAcrossProcesses("redlock processes", servers.map((s) => s.url), "processes-redlock", 40)
    }), 60_000)
})
