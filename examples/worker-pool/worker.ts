/**
 * One worker process of the pool (main.ts starts three): takes a permit of the pool's `Semaphore`
 * for each of its jobs, so that across every process at most `POOL_LIMIT` jobs run at once.
 * While a job runs it also counts itself in a counter of its own in Redis (INCR on the way in,
 * DECR on the way out): a check that does not rely on the semaphore, reported to main.ts.
 */
import { Duration, Effect, Random } from "effect"
import { Redis } from "ioredis"
import { Semaphore } from "@lockstep/core"
import { readyThenAwaitGo, tell } from "../shared/processes.js"
import { redisBackend, redisUrl } from "../shared/redis.js"

const namespace = process.env["EXAMPLE_NAMESPACE"]!
const worker = Number(process.env["WORKER"])
const jobs = Number(process.env["JOBS"])
const limit = Number(process.env["POOL_LIMIT"])

export interface JobReport {
  readonly worker: number
  readonly job: number
  /** Jobs inside at once, this one included, by the counter. */
  readonly inside: number
  /** Permits free while this one ran, as the backend says. */
  readonly available: number
}

const program = Effect.gen(function*() {
  const counter = yield* Effect.acquireRelease(
    Effect.sync(() => new Redis(redisUrl, { keyPrefix: namespace })),
    (client) => Effect.sync(() => client.disconnect())
  )
  // the same key and limit in every process: one pool
  const pool = yield* Semaphore.make("pool", { limit })
  yield* readyThenAwaitGo

  for (let job = 1; job <= jobs; job++) {
    yield* Semaphore.withPermits(pool)(
      Effect.gen(function*() {
        const inside = yield* Effect.promise(() => counter.incr("inside"))
        const available = yield* Semaphore.available(pool)
        // the job: 150-300 ms of work
        yield* Effect.sleep(Duration.millis(yield* Random.nextIntBetween(150, 300)))
        yield* Effect.promise(() => counter.decr("inside"))
        yield* tell({ worker, job, inside, available } satisfies JobReport)
      })
    )
  }
})

void Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(redisBackend(namespace)))).then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error)
    process.exit(1)
  }
)
