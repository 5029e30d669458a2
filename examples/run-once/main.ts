/**
 * A job that runs once across a fleet: four processes (job.ts), the hosts of a fleet whose cron
 * fires at the same moment, each try the job's lock once without waiting. Exactly one runs the
 * job; the others skip it.
 *
 *   npx tsx examples/run-once/main.ts        (REDIS_URL, default redis://127.0.0.1:6379)
 *
 * Exits 0 when exactly one host ran the job; 1 otherwise. (cli.sh: the same with the `lockstep`
 * command.)
 */
import { Console, Effect, Exit } from "effect"
import { collectAll, spawnChild, startTogether } from "../shared/processes.js"
import { deleteKeys, runNamespace } from "../shared/redis.js"
import type { Outcome } from "./job.js"

const hosts = 4

const program = Effect.gen(function*() {
  const namespace = runNamespace("run-once")
  yield* Effect.addFinalizer(() => deleteKeys(namespace))
  yield* Console.log(`${hosts} hosts try the nightly report's lock at the same moment:`)
  const children = yield* Effect.forEach(
    Array.from({ length: hosts }, (_, i) => i + 1),
    (host) => spawnChild(new URL("job.ts", import.meta.url), { EXAMPLE_NAMESPACE: namespace, HOST: String(host) })
  )
  yield* startTogether(children)
  const outcomes = yield* collectAll<Outcome>(children, (outcome) =>
    outcome.ran
      ? `  host ${outcome.host}: ran the report (fence ${outcome.fence})`
      : `  host ${outcome.host}: skipped it, held by ${outcome.heldBy}`)

  const ran = outcomes.filter((outcome) => outcome.ran).length
  if (outcomes.length !== hosts) return yield* Effect.fail(`${hosts - outcomes.length} hosts did not answer`)
  if (ran !== 1) return yield* Effect.fail(`${ran} hosts ran the report`)
  yield* Console.log(`ok: exactly one of ${hosts} hosts ran it`)
})

void Effect.runPromiseExit(Effect.scoped(program)).then((exit) => {
  if (Exit.isFailure(exit)) console.error(String(exit.cause))
  process.exitCode = Exit.isSuccess(exit) ? 0 : 1
})
