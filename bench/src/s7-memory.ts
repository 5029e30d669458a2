/**
 * Scenario 7: the in-process memory backend against Effect's own `Effect.makeSemaphore(1)` with
 * `withPermits(1)`: one fiber locking and unlocking, and 8 fibers contending with no hold time.
 * A floor row runs the same semaphore with the body forked (`Effect.fork` + `Fiber.join`), the
 * plain way to run a body that can be interrupted when the lease is lost; `withLock` starts its
 * body's fiber at once on the caller's stack instead, so it can pass that floor.
 */
import { Effect, Fiber, Layer } from "effect"
import { Lock } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"
import type { Env, Locker } from "./shared.js"
import { fmt, interleave, median, now, printTable, ratio, runLoop } from "./shared.js"

const fibers = 8

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 300 : 1000
    const context = yield* Layer.build(MemoryBackend.layer)
    const lock = yield* Effect.orDie(Effect.provide(Lock.make("s7"), context))
    const semaphore = yield* Effect.makeSemaphore(1)
    const lockstep: Locker = { withLock: (body) => Lock.withLock(body, lock) }
    const effect: Locker = { withLock: (body) => semaphore.withPermits(1)(body) }
    const bodyFiber: Locker = { withLock: (body) => semaphore.withPermits(1)(Effect.flatMap(Effect.fork(body), Fiber.join)) }

    const measure = (locker: Locker, workers: number) =>
      Effect.gen(function*() {
        const started = now()
        const results = yield* Effect.forEach(
          Array.from({ length: workers }),
          () => runLoop(locker, { holdMs: 0, endAt: started + windowMs }),
          { concurrency: "unbounded" }
        )
        return (results.reduce((sum, r) => sum + r.count, 0) / (now() - started)) * 1000
      })
    const cases = [
      { name: "1 fiber, uncontended", workers: 1 },
      { name: `${fibers} fibers contending, no hold`, workers: fibers }
    ]
    // warm up
    for (const c of cases) {
      yield* measure(lockstep, c.workers)
      yield* measure(effect, c.workers)
      yield* measure(bodyFiber, c.workers)
    }
    const samples = yield* interleave(env.rounds, cases, (c) =>
      Effect.all({
        lockstep: measure(lockstep, c.workers),
        effect: measure(effect, c.workers),
        bodyFiber: measure(bodyFiber, c.workers)
      }))
    const rows = cases.map((c, i) => ({
      case: c.name,
      lockstepOpsPerSec: median(samples[i]!.map((s) => s.lockstep)),
      effectSemaphoreOpsPerSec: median(samples[i]!.map((s) => s.effect)),
      bodyFiberFloorOpsPerSec: median(samples[i]!.map((s) => s.bodyFiber))
    }))
    yield* printTable(
      `7. Memory backend Lock.withLock vs Effect.makeSemaphore(1).withPermits(1) (${env.rounds} x ${windowMs} ms, median)`,
      ["case", "lockstep memory ops/s", "Effect semaphore ops/s", "ratio", "floor: semaphore + body fiber", "floor ratio"],
      rows.map((r) => [
        r.case,
        fmt(r.lockstepOpsPerSec),
        fmt(r.effectSemaphoreOpsPerSec),
        ratio(r.lockstepOpsPerSec, r.effectSemaphoreOpsPerSec),
        fmt(r.bodyFiberFloorOpsPerSec),
        ratio(r.bodyFiberFloorOpsPerSec, r.effectSemaphoreOpsPerSec)
      ]),
      ["target: ratio >= 0.30; the floor forks the body with Effect.fork and joins it (a trip through the scheduler), which withLock avoids for a body that never suspends"]
    )
    return {
      windowMs,
      rounds: env.rounds,
      rows: rows.map((r) => ({
        ...r,
        ratio: r.lockstepOpsPerSec / r.effectSemaphoreOpsPerSec,
        bodyFiberFloorRatio: r.bodyFiberFloorOpsPerSec / r.effectSemaphoreOpsPerSec
      }))
    }
  }).pipe(Effect.scoped)
