/**
 * Scenario 5: many leases held at once by one process. N fibers each hold `Lock.withLock` on
 * their own key (one backend, one connection, watchdog 3 s, so a renewal every second) for a
 * while: leases lost, client CPU while holding, heap per held lease, and what the renewals cost
 * Redis (scripts per renewal period, their time, redis-server CPU).
 *
 * The acquisitions are let in `inFlight` at a time (the leases stay held), so that the figures
 * are about holding many leases rather than about a burst of N simultaneous acquisitions.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { Deferred, Duration, Effect, Either, Exit, Fiber, Layer, Scope } from "effect"
import { Lock } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import type { Env, Failures } from "./shared.js"
import {
  addFailure,
  collectGarbage,
  commandStats,
  connect,
  countFailures,
  cpuMsSince,
  describeFailures,
  diffFailures,
  fmt,
  gcAvailable,
  median,
  mergeFailures,
  now,
  printTable,
  resetStats,
  serverCpuSeconds
} from "./shared.js"

const watchdogMs = 3000
const renewPeriodMs = watchdogMs / 3
const inFlight = 256

export const run = (env: Env) =>
  Effect.gen(function*() {
    const leases = env.smoke ? 1_000 : 10_000
    const holdMs = env.smoke ? 4_000 : 10_000
    const client = yield* connect(env.url)
    const context = yield* Layer.build(RedisBackend.layer({ client }))
    const locks = yield* Effect.orDie(Effect.provide(
      Effect.forEach(Array.from({ length: leases }, (_, i) => i), (i) => Lock.make(`s5:${i}`, { watchdog: Duration.millis(watchdogMs) })),
      context
    ))

    const round = Effect.gen(function*() {
      collectGarbage()
      const heapBefore = process.memoryUsage().heapUsed
      const gate = yield* Effect.makeSemaphore(inFlight)
      const release = yield* Deferred.make<void>()
      const failures: Failures = {}
      // how late the event loop runs: a stall longer than the renewal slack loses leases
      const loopDelay = monitorEventLoopDelay({ resolution: 20 })
      loopDelay.enable()
      let inBody = 0
      let ended = 0
      const acquireStarted = now()
      const holders = yield* Effect.fork(Effect.forEach(
        locks,
        (lock) =>
          Effect.suspend(() => {
            // lets the next acquisition in, once: when this one is granted, or failed
            let passed = false
            const pass = Effect.suspend(() => {
              if (passed) return Effect.void
              passed = true
              return gate.release(1)
            })
            const body = Effect.zipRight(
              Effect.sync(() => inBody++),
              Effect.ensuring(Effect.zipRight(pass, Deferred.await(release)), Effect.sync(() => inBody--))
            )
            return Effect.zipRight(gate.take(1), Lock.withLock(body, lock)).pipe(
              Effect.catchAll((error) => Effect.sync(() => addFailure(failures, error))),
              Effect.ensuring(Effect.zipRight(pass, Effect.sync(() => ended++)))
            )
          }),
        { concurrency: "unbounded", discard: true }
      ))
      // every fiber is holding its lease or has ended
      while (inBody + ended < leases) yield* Effect.sleep(Duration.millis(5))
      const acquireMs = now() - acquireStarted
      const failedBeforeHold = { ...failures }
      const heldAtStart = inBody
      const acquireMaxLoopDelayMs = loopDelay.max / 1e6
      loopDelay.reset()

      // the hold: only renewals run now (no forced GC here: a full collection of this heap pauses
      // the process for long enough to let leases pass their deadline)
      yield* resetStats(env.admin)
      const serverCpu = yield* serverCpuSeconds(env.admin)
      const cpu = process.cpuUsage()
      const holdStarted = now()
      yield* Effect.sleep(Duration.millis(holdMs))
      const holdWall = now() - holdStarted
      const clientCpuMs = cpuMsSince(cpu)
      const serverCpuMs = ((yield* serverCpuSeconds(env.admin)) - serverCpu) * 1000
      const stats = yield* commandStats(env.admin)
      // lockstep runs its scripts as Redis Functions (FCALL) where the server allows it
      const scripts = (stats.get("evalsha")?.calls ?? 0) + (stats.get("eval")?.calls ?? 0) + (stats.get("fcall")?.calls ?? 0)
      const scriptUsec = (stats.get("evalsha")?.usec ?? 0) + (stats.get("eval")?.usec ?? 0) + (stats.get("fcall")?.usec ?? 0)
      const failedDuringHold = diffFailures(failures, failedBeforeHold)
      // what the server says: a lock's hash exists while it is held
      const serverHeldAtEnd = yield* Effect.promise(() => env.admin.exists(locks.map((lock) => lock.key)))
      const heldAtEnd = inBody
      const holdMaxLoopDelayMs = loopDelay.max / 1e6
      loopDelay.disable()

      // the heap with the leases still held, after a full collection (timed: it stops the process)
      const gcStarted = now()
      collectGarbage()
      const gcPauseMs = now() - gcStarted
      const heapHeld = process.memoryUsage().heapUsed

      const releaseStarted = now()
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(holders)
      const releaseMs = now() - releaseStarted
      const periods = holdWall / renewPeriodMs
      return {
        heldAtStart,
        heldAtEnd,
        serverHeldAtEnd,
        failedBeforeHold,
        failedDuringHold,
        lostDuringHold: countFailures(failedDuringHold, "LockLost"),
        acquireMs,
        acquireMaxLoopDelayMs,
        holdMaxLoopDelayMs,
        releaseMs,
        clientCpuShare: clientCpuMs / holdWall,
        // each held lease is renewed once per period
        clientCpuUsPerRenewal: (clientCpuMs * 1000) / Math.max(1, ((heldAtStart + heldAtEnd) / 2) * periods),
        serverCpuShare: serverCpuMs / holdWall,
        // only meaningful while (nearly) all leases are held
        heapPerLeaseBytes: heldAtEnd >= 0.9 * leases ? (heapHeld - heapBefore) / heldAtEnd : NaN,
        gcPauseMs,
        renewScriptsPerPeriod: scripts / periods,
        renewScriptUsecPerPeriod: scriptUsec / periods
      }
    })

    const rounds: Array<Effect.Effect.Success<typeof round>> = []
    for (let i = 0; i < env.rounds; i++) rounds.push(yield* round)

    // the lease alone: the same leases taken with Lock.acquire into one scope, by one fiber (no
    // fiber per lease), then the heap after a full collection
    const scopedLease = Effect.gen(function*() {
      collectGarbage()
      const heapBefore = process.memoryUsage().heapUsed
      const scope = yield* Scope.make()
      const taken = yield* Effect.either(Scope.extend(Effect.forEach(locks, (lock) => Lock.acquire(lock), { discard: true }), scope))
      collectGarbage()
      const heapHeld = process.memoryUsage().heapUsed
      yield* Scope.close(scope, Exit.void)
      return Either.isRight(taken) ? (heapHeld - heapBefore) / leases : NaN
    })
    const scopedHeap: Array<number> = []
    for (let i = 0; i < env.rounds; i++) scopedHeap.push(yield* scopedLease)
    const m = (f: (r: (typeof rounds)[number]) => number) => median(rounds.map(f))
    const summary = {
      leases,
      holdMs,
      watchdogMs,
      inFlight,
      rounds: env.rounds,
      gcExposed: gcAvailable(),
      heldAtStart: m((r) => r.heldAtStart),
      heldAtEnd: m((r) => r.heldAtEnd),
      serverHeldAtEnd: m((r) => r.serverHeldAtEnd),
      lostDuringHold: m((r) => r.lostDuringHold),
      failedBeforeHold: mergeFailures(rounds.map((r) => r.failedBeforeHold)),
      failedDuringHold: mergeFailures(rounds.map((r) => r.failedDuringHold)),
      acquireMs: m((r) => r.acquireMs),
      acquireMaxLoopDelayMs: m((r) => r.acquireMaxLoopDelayMs),
      holdMaxLoopDelayMs: m((r) => r.holdMaxLoopDelayMs),
      releaseMs: m((r) => r.releaseMs),
      clientCpuShare: m((r) => r.clientCpuShare),
      clientCpuUsPerRenewal: m((r) => r.clientCpuUsPerRenewal),
      serverCpuShare: m((r) => r.serverCpuShare),
      heapPerLeaseBytes: m((r) => r.heapPerLeaseBytes),
      heapPerScopedLeaseBytes: median(scopedHeap),
      gcPauseMs: m((r) => r.gcPauseMs),
      renewScriptsPerPeriod: m((r) => r.renewScriptsPerPeriod),
      renewScriptUsecPerPeriod: m((r) => r.renewScriptUsecPerPeriod),
      perRound: rounds
    }
    yield* printTable(
      `5. ${fmt(leases)} leases held at once by one process (Lock.withLock, distinct keys, watchdog ${watchdogMs / 1000} s, ` +
        `hold ${holdMs / 1000} s, ${inFlight} acquisitions in flight; ${env.rounds} round(s), median)`,
      ["measure", "value"],
      [
        ["leases held when the hold started", fmt(summary.heldAtStart)],
        ["leases lost (LockLost) during the hold", fmt(summary.lostDuringHold)],
        ["leases still held at the end of the hold (client's view)", fmt(summary.heldAtEnd)],
        ["... of which Redis still has (EXISTS)", fmt(summary.serverHeldAtEnd)],
        ["failures while acquiring (all rounds)", describeFailures(summary.failedBeforeHold)],
        ["failures during the hold (all rounds)", describeFailures(summary.failedDuringHold)],
        ["time to acquire all, ms", fmt(summary.acquireMs)],
        ["longest event-loop stall while acquiring, ms", fmt(summary.acquireMaxLoopDelayMs)],
        ["longest event-loop stall during the hold, ms", fmt(summary.holdMaxLoopDelayMs)],
        ["time to release all, ms", fmt(summary.releaseMs)],
        ["client CPU while holding, % of one core", fmt(summary.clientCpuShare * 100, 1)],
        ["client CPU per lease renewal, us (leases held on average x periods)", fmt(summary.clientCpuUsPerRenewal, 1)],
        ["redis-server CPU while holding, % of one core", fmt(summary.serverCpuShare * 100, 1)],
        [`heap per held lease at the end of the hold, bytes${gcAvailable() ? "" : " (no --expose-gc: rough)"}`, fmt(summary.heapPerLeaseBytes)],
        [
          `heap per lease taken with Lock.acquire into one scope (no fiber per lease), bytes${gcAvailable() ? "" : " (rough)"}`,
          fmt(summary.heapPerScopedLeaseBytes)
        ],
        ["full GC pause with those leases held, ms", gcAvailable() ? fmt(summary.gcPauseMs) : "-"],
        [`scripts (round trips) per ${renewPeriodMs} ms period during the hold`, fmt(summary.renewScriptsPerPeriod, 1)],
        ["script time per period during the hold, ms (server)", fmt(summary.renewScriptUsecPerPeriod / 1000, 1)]
      ],
      [
        "scripts during the hold: batched renewals, and a release for each lease that was lost",
        "heap per lease: only from rounds that still held >= 90% of the leases at the end; it includes the",
        "  harness's own fiber per lease (the one that runs Lock.withLock)",
        "the client's deadline for a lease: its last confirmed renewal + 3 s - 35 ms drift allowance"
      ]
    )
    return summary
  }).pipe(Effect.scoped)
