/**
 * One host of the fleet (main.ts starts four): at the same moment as the others, it tries the
 * nightly report's lock once, without waiting. The host that gets it runs the report; the others
 * skip it, saying who holds it.
 */
import { Effect, Option } from "effect"
import { Lock } from "@lockstep/core"
import { readyThenAwaitGo, tell } from "../shared/processes.js"
import { redisBackend } from "../shared/redis.js"

const host = Number(process.env["HOST"])

export type Outcome =
  | { readonly host: number; readonly ran: true; readonly fence: number }
  | { readonly host: number; readonly ran: false; readonly heldBy: string }

/** The job itself: here a second of work. */
const nightlyReport = Effect.sleep("1 second")

const program = Effect.gen(function*() {
  const lock = yield* Lock.make("reports:nightly")
  yield* readyThenAwaitGo
  // one attempt, no wait: Some(result) if this host got the lock (and ran the job), None if not
  const ran = yield* Lock.withLockIfAvailable((lease) => Effect.as(nightlyReport, lease.fence), lock)
  if (Option.isSome(ran)) return yield* tell({ host, ran: true, fence: ran.value } satisfies Outcome)
  // (`Lock.tryAcquire(lock)` is the same attempt, yielding the lease into the scope)
  const holders = yield* Lock.holders(lock)
  yield* tell({ host, ran: false, heldBy: holders[0]?.holder ?? "nobody any more" } satisfies Outcome)
})

void Effect.runPromise(program.pipe(Effect.provide(redisBackend(process.env["EXAMPLE_NAMESPACE"]!)))).then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error)
    process.exit(1)
  }
)
