/**
 * A worker pool limited across processes: three worker processes (worker.ts) share one
 * `Semaphore` of 2 permits on Redis, each running 4 jobs under a permit. At most 2 jobs run at
 * once in all the processes together, whichever process they are in.
 *
 *   npx tsx examples/worker-pool/main.ts        (REDIS_URL, default redis://127.0.0.1:6379)
 *
 * Exits 0 when no more than 2 jobs ran at once and every job ran; 1 otherwise.
 */
import { Console, Effect, Exit } from "effect"
import { collectAll, spawnChild, startTogether } from "../shared/processes.js"
import { deleteKeys, runNamespace } from "../shared/redis.js"
import type { JobReport } from "./worker.js"

const workers = 3
const jobsPerWorker = 4
const limit = 2

const program = Effect.gen(function*() {
  const namespace = runNamespace("worker-pool")
  // runs last: after every worker has ended
  yield* Effect.addFinalizer(() => deleteKeys(namespace))
  yield* Console.log(`${workers} worker processes, ${jobsPerWorker} jobs each, a Semaphore of ${limit} permits on Redis`)
  const started = Date.now()

  const children = yield* Effect.forEach(
    Array.from({ length: workers }, (_, i) => i + 1),
    (worker) =>
      spawnChild(new URL("worker.ts", import.meta.url), {
        EXAMPLE_NAMESPACE: namespace,
        WORKER: String(worker),
        JOBS: String(jobsPerWorker),
        POOL_LIMIT: String(limit)
      })
  )
  yield* startTogether(children)
  yield* Console.log(`all started (${Date.now() - started} ms); each line is a job as it ends:`)
  const go = Date.now()
  const reports = yield* collectAll<JobReport>(
    children,
    (report) =>
      `  worker ${report.worker} job ${report.job}: ${report.inside} of ${limit} inside (the counter), ` +
      `${report.available} permit(s) free (the backend)`
  )

  const most = Math.max(...reports.map((r) => r.inside))
  yield* Console.log(`\n${reports.length} jobs ran in ${Date.now() - go} ms, at most ${most} at once`)
  if (reports.length !== workers * jobsPerWorker) {
    return yield* Effect.fail(`${workers * jobsPerWorker - reports.length} jobs did not run`)
  }
  if (most > limit) return yield* Effect.fail(`${most} jobs ran at once, over the limit of ${limit}`)
  yield* Console.log(`ok: never more than ${limit} jobs at once across ${workers} processes`)
})

void Effect.runPromiseExit(Effect.scoped(program)).then((exit) => {
  if (Exit.isFailure(exit)) console.error(String(exit.cause))
  process.exitCode = Exit.isSuccess(exit) ? 0 : 1
})
