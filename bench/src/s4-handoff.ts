/**
 * Scenario 4: handoff latency. Worker A holds the lock, worker B (its own connection and lock
 * instance) starts waiting, A releases after a random 5-15 ms hold; the time from A's release to
 * B's grant, measured from the moment A's body ends (the release is sent) and from the moment
 * A's `withLock` returns (the release is confirmed). The random hold keeps polling peers from
 * falling into step with A.
 */
import { Deferred, Duration, Effect, Fiber } from "effect"
import type { Env, Failures, Locker } from "./shared.js"
import { addFailure, describeFailures, fmt, interleave, median, mergeFailures, now, percentile, printTable } from "./shared.js"
import { sides } from "./sides.js"

const measured = [sides.lockstepLock, sides.lockstepFairLock, sides.redlock, sides.redisSemaphore, sides.edl]

interface Handoff {
  /** From the end of A's critical section (its release starting) to B's grant, ms. */
  readonly fromSent: number
  /** From A's `withLock` returning to B's grant, ms. */
  readonly fromReturned: number
}

const handoff = (a: Locker, b: Locker, holdMs: number): Effect.Effect<Handoff, unknown> =>
  Effect.gen(function*() {
    const holding = yield* Deferred.make<void>()
    const go = yield* Deferred.make<void>()
    let sentAt = 0
    let returnedAt = 0
    let grantedAt = 0
    const first = yield* Effect.fork(
      Effect.zipRight(
        a.withLock(Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(go))),
        Effect.sync(() => {
          returnedAt = now()
        })
      )
    )
    yield* Deferred.await(holding)
    const second = yield* Effect.fork(b.withLock(Effect.sync(() => {
      grantedAt = now()
    })))
    yield* Effect.sleep(Duration.millis(holdMs))
    sentAt = now()
    yield* Deferred.succeed(go, undefined)
    yield* Fiber.join(first)
    yield* Fiber.join(second)
    return { fromSent: grantedAt - sentAt, fromReturned: grantedAt - returnedAt }
  })

export const run = (env: Env) =>
  Effect.gen(function*() {
    const maxReps = env.smoke ? 50 : 300
    const maxMs = env.smoke ? 600 : 3000
    const pairs = yield* Effect.forEach(measured, (side) =>
      Effect.all([side.open(env.url, `s4:${side.id}`), side.open(env.url, `s4:${side.id}`)]))
    const samples = yield* interleave(env.rounds, measured.map((_, i) => i), (i) =>
      Effect.gen(function*() {
        const [a, b] = pairs[i]!
        const values: Array<Handoff> = []
        const failures: Failures = {}
        const started = now()
        while (values.length < maxReps && now() - started < maxMs) {
          const result = yield* Effect.either(handoff(a, b, 5 + Math.random() * 10))
          if (result._tag === "Right") values.push(result.right)
          else addFailure(failures, result.left)
        }
        const sent = values.map((v) => v.fromSent)
        const returned = values.map((v) => v.fromReturned)
        return {
          n: values.length,
          sentP50: percentile(sent, 50),
          sentP99: percentile(sent, 99),
          returnedP50: percentile(returned, 50),
          returnedP99: percentile(returned, 99),
          failures
        }
      }))
    const rows = measured.map((side, i) => {
      const s = samples[i]!
      return {
        side: side.id,
        name: side.name,
        reps: s.reduce((sum, r) => sum + r.n, 0),
        sentP50: median(s.map((r) => r.sentP50)),
        sentP99: median(s.map((r) => r.sentP99)),
        returnedP50: median(s.map((r) => r.returnedP50)),
        returnedP99: median(s.map((r) => r.returnedP99)),
        failures: mergeFailures(s.map((r) => r.failures))
      }
    })
    yield* printTable(
      `4. Handoff latency, A releases -> B granted (${env.rounds} round(s) of up to ${maxReps} handoffs / ${maxMs} ms, median of per-round percentiles)`,
      ["side", "handoffs", "p50 ms (sent)", "p99 ms (sent)", "p50 ms (returned)", "p99 ms (returned)", "failures"],
      rows.map((r) => [
        r.name,
        String(r.reps),
        fmt(r.sentP50, 3),
        fmt(r.sentP99, 3),
        fmt(r.returnedP50, 3),
        fmt(r.returnedP99, 3),
        describeFailures(r.failures)
      ]),
      [
        "sent: from the end of A's critical section (release starting); returned: from A's unlock call returning",
        "target for lockstep: p50 <= 0.5 ms"
      ]
    )
    return { maxReps, maxMs, rounds: env.rounds, rows }
  }).pipe(Effect.scoped)
