/**
 * Scenario 6: a long fair queue. N fibers (one backend, one connection) all ask for the same
 * FairLock at once; each holds it for no time and releases. Total time until every one of them
 * had its turn, failures by tag, redis-server CPU and commands per grant while the queue drains.
 */
import { Effect, Layer } from "effect"
import { FairLock, Lock } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import type { Env, Failures } from "./shared.js"
import {
  addFailure,
  connect,
  cpuMsSince,
  describeFailures,
  fmt,
  info,
  median,
  mergeFailures,
  now,
  printTable,
  serverCpuSeconds
} from "./shared.js"

const commandsProcessed = (env: Env) => Effect.map(info(env.admin, "stats"), (m) => Number(m.get("total_commands_processed") ?? 0))

export const run = (env: Env) =>
  Effect.gen(function*() {
    const waiters = env.smoke ? 100 : 1000
    const client = yield* connect(env.url)
    const context = yield* Layer.build(RedisBackend.layer({ client }))
    const lock = yield* Effect.orDie(Effect.provide(FairLock.make("s6:fair"), context))

    const round = Effect.gen(function*() {
      const failures: Failures = {}
      let granted = 0
      const commands0 = yield* commandsProcessed(env)
      const serverCpu = yield* serverCpuSeconds(env.admin)
      const cpu = process.cpuUsage()
      const started = now()
      yield* Effect.forEach(
        Array.from({ length: waiters }),
        () =>
          Lock.withLock(Effect.sync(() => granted++), lock).pipe(
            Effect.catchAll((error) => Effect.sync(() => addFailure(failures, error)))
          ),
        { concurrency: "unbounded", discard: true }
      )
      const wall = now() - started
      const clientCpuMs = cpuMsSince(cpu)
      const serverCpuMs = ((yield* serverCpuSeconds(env.admin)) - serverCpu) * 1000
      // less the three INFO calls of this measurement before the last one
      const commands = (yield* commandsProcessed(env)) - commands0 - 3
      return {
        granted,
        failures,
        totalMs: wall,
        grantsPerSec: (granted / wall) * 1000,
        serverCpuShare: serverCpuMs / wall,
        clientCpuShare: clientCpuMs / wall,
        commandsPerGrant: commands / Math.max(1, granted)
      }
    })

    const rounds: Array<Effect.Effect.Success<typeof round>> = []
    for (let i = 0; i < env.rounds; i++) rounds.push(yield* round)
    const m = (f: (r: (typeof rounds)[number]) => number) => median(rounds.map(f))
    const summary = {
      waiters,
      rounds: env.rounds,
      granted: m((r) => r.granted),
      failures: mergeFailures(rounds.map((r) => r.failures)),
      totalMs: m((r) => r.totalMs),
      grantsPerSec: m((r) => r.grantsPerSec),
      serverCpuShare: m((r) => r.serverCpuShare),
      clientCpuShare: m((r) => r.clientCpuShare),
      commandsPerGrant: m((r) => r.commandsPerGrant),
      perRound: rounds
    }
    yield* printTable(
      `6. ${fmt(waiters)} FairLock waiters on one key, one backend, ~0 ms hold (${env.rounds} round(s), median)`,
      ["measure", "value"],
      [
        ["granted", fmt(summary.granted)],
        ["failures (all rounds)", describeFailures(summary.failures)],
        ["total time, ms", fmt(summary.totalMs)],
        ["grants/s", fmt(summary.grantsPerSec)],
        ["redis-server CPU, % of one core", fmt(summary.serverCpuShare * 100, 1)],
        ["client CPU, % of one core", fmt(summary.clientCpuShare * 100, 1)],
        ["Redis commands per grant (incl. inside scripts)", fmt(summary.commandsPerGrant, 1)]
      ]
    )
    return summary
  }).pipe(Effect.scoped)
