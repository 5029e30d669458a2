/**
 * lockstep demo: several workers contend for each kind of lock; every grant and release goes
 * through a recorder, and the history is checked for mutual exclusion, permit limits and fence
 * order. Exits 0 when every check passes, 1 otherwise.
 *
 *   pnpm demo                                  # the memory backend
 *   REDIS_URL=redis://127.0.0.1:6379 pnpm demo # Redis
 */
import type { Scope } from "effect"
import { Console, Duration, Effect, Exit, Layer, Random } from "effect"
import { FairLock, type Lease, Lock, LockBackend, ReadWriteLock, Semaphore } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"
import { RedisBackend } from "@lockstep/redis"
import * as History from "@lockstep/testkit/History"

interface Stats {
  readonly grants: number
  readonly waits: Array<number>
  readonly fences: Array<number>
  maxInside: number
}

const percentile = (values: ReadonlyArray<number>, p: number): number => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0
}

/** `workers` fibers each take the lock `rounds` times, hold it 1-4 ms, and record their waits. */
const contend = (
  workers: number,
  rounds: number,
  take: (worker: number) => Effect.Effect<Lease.Lease, unknown, Scope.Scope>
) =>
  Effect.gen(function*() {
    const stats: Stats = { grants: workers * rounds, waits: [], fences: [], maxInside: 0 }
    let inside = 0
    yield* Effect.forEach(
      Array.from({ length: workers }, (_, i) => i),
      (worker) =>
        Effect.forEach(Array.from({ length: rounds }), () =>
          Effect.scoped(Effect.gen(function*() {
            const started = yield* Effect.clockWith((c) => c.currentTimeMillis)
            const lease = yield* take(worker)
            stats.waits.push((yield* Effect.clockWith((c) => c.currentTimeMillis)) - started)
            stats.fences.push(lease.fence)
            stats.maxInside = Math.max(stats.maxInside, ++inside)
            yield* Effect.sleep(Duration.millis(yield* Random.nextIntBetween(1, 5)))
            inside--
          })), { discard: true }),
      { concurrency: "unbounded", discard: true }
    )
    return stats
  })

const line = (name: string, shape: string, stats: Stats, extra: string) =>
  Console.log(
    `  ${name.padEnd(14)} ${shape.padEnd(22)} ${String(stats.grants).padStart(3)} grants, ` +
      `fences ${Math.min(...stats.fences)}..${Math.max(...stats.fences)}, ` +
      `wait p50 ${percentile(stats.waits, 50)} ms / max ${Math.max(...stats.waits)} ms, ${extra}`
  )

const demo = (history: History.Recorder) => Effect.gen(function*() {
  const run = Math.random().toString(36).slice(2, 8)
  const key = (name: string) => `demo:${run}:${name}`

  const mutex = yield* Lock.make(key("lock"))
  const lock = yield* contend(8, 5, () => Lock.acquire(mutex))
  yield* line("Lock", "8 workers x 5 rounds", lock, `${lock.maxInside} inside at once`)

  const fair = yield* FairLock.make(key("fair"))
  const fairStats = yield* contend(8, 5, () => Lock.acquire(fair))
  yield* line("FairLock", "8 workers x 5 rounds", fairStats, `${fairStats.maxInside} inside at once`)

  const rw = yield* ReadWriteLock.make(key("rw"))
  const rwStats = yield* contend(8, 5, (worker) => Lock.acquire(worker < 6 ? rw.read : rw.write))
  yield* line("ReadWriteLock", "6 readers + 2 writers", rwStats, `up to ${rwStats.maxInside} inside at once`)

  const sem = yield* Semaphore.make(key("sem"), { limit: 3 })
  const semStats = yield* contend(10, 4, () => Semaphore.acquire(sem))
  yield* line("Semaphore(3)", "10 workers x 4 rounds", semStats, `up to ${semStats.maxInside} inside at once`)

  // the first fences a reader sees: say what the 16-digit numbers are
  yield* Console.log(
    "\n  fences: the backend clock's time of each grant in microseconds since 1970 (or the key's last\n" +
      "  fence + 1, if that is higher): strictly increasing per key, also after a backend restart\n" +
      "  (unless its clock steps back)"
  )

  const events = yield* history.events
  const violations = yield* history.check
  const grants = events.filter((e) => e._tag === "Grant").length
  yield* Console.log(`\nhistory: ${events.length} events, ${grants} grants checked for mutual exclusion, permit limits and fence order`)
  if (violations.length > 0) {
    for (const v of violations) yield* Console.error(`  violation: ${History.formatViolation(v)}`)
    return yield* Effect.fail(`${violations.length} violations`)
  }
  yield* Console.log("all checks passed")
})

const redisUrl = process.env["REDIS_URL"]

/** The backend (Redis when REDIS_URL is set), with every grant and release recorded for the final check. */
const program = Effect.gen(function*() {
  const history = yield* History.make
  const backend = Layer.effect(
    LockBackend.LockBackend,
    Effect.map(LockBackend.LockBackend, (service) => History.instrument(history, service))
  ).pipe(Layer.provide(redisUrl === undefined ? MemoryBackend.layer : RedisBackend.layerConfig()))
  const started = Date.now()
  const where = redisUrl === undefined ? "the memory backend" : `Redis at ${redisUrl}`
  yield* Console.log(`lockstep demo on ${where}: workers contend for each kind of lock\n`)
  yield* Effect.provide(demo(history), backend)
  yield* Console.log(`done in ${((Date.now() - started) / 1000).toFixed(1)} s`)
})

void Effect.runPromiseExit(program).then((exit) => {
  if (Exit.isFailure(exit)) console.error(String(exit.cause))
  process.exitCode = Exit.isSuccess(exit) ? 0 : 1
})
