/**
 * A multi-process adversarial run on a real redis-server. Four client processes
 * (`fixtures/nemesisClient.ts`), each behind its own TCP proxy (`TcpProxy`), contend for one watchdog lock
 * (`Lock.withLock`, watchdog 1.5 s) and in every critical section write their fence token two or
 * three times to a fenced resource in this process, which accepts a write iff its token is at
 * least the highest accepted so far. Meanwhile a nemesis injects one fault at a time with short
 * random gaps, from a seeded generator (`NEMESIS_SEED=<seed>` replays a schedule; the seed is in
 * the summary): SIGSTOP of a client past its lease, SIGKILL of a client (and a replacement),
 * SIGSTOP of the server, a reset of one client's connections, a kill and restart of the server,
 * and FLUSHALL. See fixtures/nemesis.ts for the run and fixtures/nemesisHistory.ts for the checks.
 *
 * Phase A runs a server that keeps its data across restarts (AOF, fsync always); phase B one that
 * keeps nothing on disk, so that a restart (like FLUSHALL) loses every lock and fence counter.
 *
 * Checks, per phase, on the recorded history (one `nemesis:` JSON summary line per phase):
 * 1. fences: in grant order the fences never go back, and no two leases share one;
 * 2. stale writes, judged against the leases (`judgeWrites`), not by the resource's own rule: a write
 *    is stale when it comes after a write of a holder granted once the writer's lease had ended
 *    (a client paused past its lease); none may be accepted, every write carries its lease's
 *    fence, and some stale write was made (the nemesis stops more clients, a bounded number of
 *    times, until one is), so the check had something to judge;
 * 3. overlapping valid leases (validity: grant to the earliest of release, loss, local deadline and
 *    kill): none in phase A; in phase B none except within one watchdog period of a data loss;
 * 4. liveness: every client completed critical sections, every process exited within a few
 *    seconds of being told to stop, and no process wrote anything to stderr (no unhandled
 *    rejection, exception or defect);
 * and every kind of fault was injected.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { WriteAttempt } from "./fixtures/fencedResource.js"
import type { FaultKind, PhaseConfig, PhaseResult } from "./fixtures/nemesis.js"
import { runPhase } from "./fixtures/nemesis.js"
import { MORE_STOPS, seedOf } from "./fixtures/nemesisProcesses.js"
import type { LeaseRecord } from "./fixtures/nemesisHistory.js"
import {
  checkFences,
  checkHarness,
  checkLiveness,
  countBy,
  describeLease,
  historySummary,
  judgeFencesAndWrites,
  judgeWrites,
  overlaps,
  phaseTimes
} from "./fixtures/nemesisHistory.js"
import { runnable, trapRejections, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis nemesis suite (nemesis.test.ts)")

const WATCHDOG_MS = 1_500
const COMMAND_TIMEOUT_MS = 400
const CLIENTS = 4
const NEMESIS_MS = 20_000
/** After the nemesis: every client must complete a critical section in this much time (no client hangs; a loaded machine may be slow). */
const QUIET_MS = 4_000
/** Sections every client completes, and how long a process may take to exit once told to stop. */
const LIVENESS = { sections: 1, stopWithinMs: 5_000 }

// Anything that escapes the Effect world in this process (an error event nobody listens to on a
// socket of the resource or a proxy) is a harness bug and fails the phase it happened in.
const escaped = trapRejections()

/** `NEMESIS_VERBOSE=1` prints the fault timeline and the clients' log lines. */
const verbose = process.env["NEMESIS_VERBOSE"] === "1"
const SEED = seedOf(process.env["NEMESIS_SEED"])

const phase = (name: string, persistent: boolean, seedOffset: number): PhaseConfig => ({
  name,
  persistent,
  seed: SEED + seedOffset,
  clients: CLIENTS,
  nemesisMs: NEMESIS_MS,
  quietMs: QUIET_MS,
  watchdogMs: WATCHDOG_MS,
  commandTimeoutMs: COMMAND_TIMEOUT_MS,
  key: "nemesis"
})

const round = (n: number) => Math.round(n)

/** The summary of one phase, and every check it fails (empty: all passed). */
const judge = (result: PhaseResult, escapedHere: ReadonlyArray<string>) => {
  const { config } = result
  const origin = result.startedAt
  // 1. fences, 2. stale writes
  const { fail, failures, fences, writes } = judgeFencesAndWrites(result)

  // 3. overlapping valid leases
  const found = overlaps(result.leases, result.losses, config.watchdogMs)
  const explained = found.filter((o) => o.explainedBy !== undefined)
  const unexplained = config.persistent ? found : found.filter((o) => o.explainedBy === undefined)
  if (unexplained.length > 0) {
    const first = unexplained[0]!
    fail(
      "overlaps",
      `${unexplained.length} overlapping valid leases${config.persistent ? "" : " not within a watchdog period of a data loss"} ` +
        `(first: ${describeLease(first.first, origin)} and ${describeLease(first.second, origin)}, ` +
        `${(first.to - first.from).toFixed(1)} ms)`
    )
  }

  // 4. liveness
  const liveness = checkLiveness(result.children, config, LIVENESS, fail)
  checkHarness(result, escapedHere, fail)

  // the nemesis did its work
  const kinds: ReadonlyArray<FaultKind> = config.persistent
    ? ["stopClient", "killClient", "pauseServer", "resetProxy", "restartServer"]
    : ["stopClient", "killClient", "pauseServer", "resetProxy", "restartServer", "flushAll"]
  const faultCounts = countBy(result.faults, (f) => f.kind)
  for (const kind of kinds) {
    if ((faultCounts[kind] ?? 0) === 0) fail("nemesis", `no ${kind} fault was injected`)
  }
  if (config.persistent && (result.markers.lost > 0 || result.markers.kept === 0)) {
    fail("nemesis", `persistent server: data kept across ${result.markers.kept} restarts, lost across ${result.markers.lost}`)
  }
  if (!config.persistent && result.markers.lost === 0) fail("nemesis", "no restart lost the server's data")

  const summary = {
    phase: config.name,
    persistent: config.persistent,
    seed: config.seed,
    clients: config.clients,
    watchdogMs: config.watchdogMs,
    ...phaseTimes(result),
    faults: faultCounts,
    aimedFaults: result.faults.filter((f) => f.note.startsWith("at a grant") || f.note.startsWith("in a section")).length,
    processes: result.children.length,
    restarts: result.markers,
    dataLosses: result.losses.length,
    leases: result.leases.length,
    outcomes: countBy(result.leases, (l) => l.how),
    ...historySummary(result, { fences, writes, liveness }, MORE_STOPS),
    overlaps: { total: found.length, explainedByDataLoss: explained.length, unexplained: unexplained.length },
    stopToExitMaxMs: liveness.stopTimes.length === 0 ? null : round(Math.max(...liveness.stopTimes)),
    logLines: result.children.reduce((n, c) => n + c.logLines, 0),
    failed: Array.from(new Set(failures.map((f) => f.slice(1, f.indexOf("]")))))
  }
  return { summary, failures }
}

const runAndJudge = (config: PhaseConfig) =>
  Effect.gen(function*() {
    const escapedBefore = escaped.length
    const result = yield* runPhase(config)
    const { failures, summary } = judge(result, escaped.slice(escapedBefore))
    console.log(`nemesis: ${JSON.stringify(summary)}`)
    if (failures.length > 0 || verbose) {
      const origin = result.startedAt
      console.log(
        `nemesis phase ${config.name} faults: ${
          result.faults.map((f) => `${round(f.start - origin)}ms ${f.kind} ${f.target ?? ""} (${f.note})`).join("; ")
        }`
      )
    }
    if (verbose) {
      for (const child of result.children) {
        if (child.logTail !== "") console.log(`nemesis phase ${config.name} ${child.label} log:${child.logTail}`)
      }
    }
    assert.deepStrictEqual(failures, [], `phase ${config.name} (NEMESIS_SEED=${SEED} replays the fault schedule)`)
  })

describe("nemesis checks", () => {
  const lease = (holder: string, fence: number, grant: number, end: number, asked?: number): LeaseRecord => ({
    client: holder,
    holder,
    fence,
    asked,
    grant,
    end,
    how: "released"
  })
  const write = (at: number, holder: string, token: number, accepted: boolean): WriteAttempt => ({
    at,
    client: holder,
    holder,
    token,
    seq: 1,
    accepted
  })

  it("find fence regressions, shared fences, stale writes and overlaps", () => {
    const leases = [lease("a", 1, 0, 10), lease("b", 2, 10, 20), lease("c", 1, 30, 40), lease("d", 5, 35, 50)]
    const fences = checkFences(leases)
    assert.deepStrictEqual(fences.regressions.map((r) => r.lease.holder), ["c"])
    assert.deepStrictEqual(fences.shared.map((s) => s.fence), [1])
    assert.deepStrictEqual(checkFences([lease("a", 1, 0, 1), lease("b", 2, 2, 3)]), { regressions: [], shared: [] })
    // "b" asked at 5, before "a"'s grant (fence 9) was answered at 6: it may come back later with a
    // lower fence (paused between the server's grant and its reply); asked at 7, it may not
    assert.deepStrictEqual(checkFences([lease("a", 9, 6, 8, 5), lease("b", 4, 10, 12, 5)]).regressions, [])
    assert.deepStrictEqual(
      checkFences([lease("a", 9, 6, 8, 5), lease("b", 4, 10, 12, 7)]).regressions.map((r) => [r.lease.holder, r.previousMax]),
      [["b", 9]]
    )

    // "a" [0, 10) is paused past its lease and writes at 25, after "b" (granted at 12, after a's
    // end) wrote at 13: stale, whatever the resource said; "a"'s write at 11, before any later
    // holder's, is late but not stale; "b"'s writes inside its lease are neither
    const paused = [lease("a", 1, 0, 10), lease("b", 2, 12, 20)]
    const judged = (accepted: boolean) =>
      judgeWrites([write(5, "a", 1, true), write(11, "a", 1, true), write(13, "b", 2, true), write(25, "a", 1, accepted)], paused)
    assert.deepStrictEqual(judged(false).stale.map((s) => [s.attempt.at, s.supersededBy.holder]), [[25, "b"]])
    assert.deepStrictEqual(judged(false).staleAccepted, [])
    assert.deepStrictEqual(judged(false).lateAccepted.map((a) => a.at), [11])
    assert.deepStrictEqual(judged(true).staleAccepted.map((s) => s.attempt.at), [25])
    // a later holder with a lower fence: its write is rejected, and the earlier holder's stale write
    // then gets through a resource that judges tokens alone: a failure of fencing all the same
    const lower = judgeWrites([write(13, "b", 0, false), write(25, "a", 1, true)], [lease("a", 1, 0, 10), lease("b", 0, 12, 20)])
    assert.deepStrictEqual(lower.staleAccepted.map((s) => s.attempt.at), [25])
    // a lease granted while the writer's was still valid (a double grant) does not make its writes stale
    assert.deepStrictEqual(judgeWrites([write(9, "b", 2, true), write(25, "a", 1, false)], [lease("a", 1, 0, 10), lease("b", 2, 8, 20)]).stale, [])
    // a write with no lease, or another token than its lease's fence
    assert.deepStrictEqual(judgeWrites([write(1, "x", 1, true), write(2, "a", 7, true)], paused).unmatched.map((a) => a.holder), ["x", "a"])

    // [0,10) and [10,20) touch but do not overlap; c and d overlap on [35, 40)
    const found = overlaps(leases, [], 1_000)
    assert.deepStrictEqual(found.map((o) => [o.first.holder, o.second.holder, o.from, o.to]), [["c", "d", 35, 40]])
    assert.isUndefined(found[0]!.explainedBy)
    const loss = { kind: "flushAll", start: 20, end: 21 }
    assert.deepStrictEqual(overlaps(leases, [loss], 20).map((o) => o.explainedBy), [loss])
    assert.deepStrictEqual(overlaps(leases, [loss], 5).map((o) => o.explainedBy), [undefined])
  })
})

// a phase takes about 35 s; the stops added when no stale write was made (at most 5, 2-6 s each)
// may add up to 30 s more
const PHASE_TIMEOUT_MS = 80_000

describe.runIf(runnable)("nemesis: four client processes, one lock, faults on a real redis-server", () => {
  it.scopedLive("phase A: a server that keeps its data across restarts", () => runAndJudge(phase("A", true, 0)), PHASE_TIMEOUT_MS)

  it.scopedLive("phase B: a server that keeps nothing (restart and FLUSHALL lose the lock)", () =>
    runAndJudge(phase("B", false, 1)), PHASE_TIMEOUT_MS)
})
