/**
 * `lockstep status`, `lockstep release --force` and `lockstep latch`: an operator's view of a key,
 * and a `CountDownLatch` for shell pipelines.
 */
import { Console, Duration, Effect, Either, Option } from "effect"
import { CountDownLatch } from "@lockstep/core"
import type { KeyState } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import * as Backend from "./backend.js"
import * as Durations from "./duration.js"
import { CliFailure, ExitCodes, usage } from "./errors.js"
import { exitCode as signalExitCode, Signals } from "./signals.js"

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)}s`

const table = (rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)))
  return rows.map((row) => row.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd()).join("\n")
}

/** `state` as the table `status` prints. */
export const formatState = (state: KeyState): string => {
  const lines = [
    `key:     ${state.key}`,
    `fence:   ${state.fence === 0 ? "-" : state.fence} (the last issued)`,
    ...(state.limit === undefined ? [] : [`limit:   ${state.limit}`])
  ]
  if (state.holders.length === 0) {
    lines.push("holders: none (free)")
  } else {
    lines.push("holders:")
    lines.push(table([
      ["HOLDER", "MODE", "COUNT", "PERMITS", "FENCE", "TIME LEFT"],
      ...state.holders.map((h) => [
        h.holder,
        h.exclusive > 0 ? (h.shared > 0 ? "exclusive+shared" : "exclusive") : "shared",
        String(h.exclusive + h.shared),
        String(h.permits),
        String(h.fence),
        seconds(h.ttlMs)
      ])
    ]).replace(/^/gm, "  "))
  }
  if (state.queue.length === 0) {
    lines.push("waiters: none")
  } else {
    lines.push("waiters:")
    lines.push(table([["WAITER", "TIME LEFT"], ...state.queue.map((w) => [w.holder, seconds(w.ttlMs)])]).replace(/^/gm, "  "))
  }
  return lines.join("\n")
}

const inspect = (key: string) => Effect.flatMap(LockBackend, (backend) => backend.inspect(key))

const failing = <A, R>(effect: Effect.Effect<A, { readonly _tag: string; readonly message: string }, R>) =>
  Effect.mapError(effect, (error) =>
    error._tag === "CliFailure"
      ? (error as CliFailure)
      : error._tag === "BackendError"
      ? new CliFailure({ code: ExitCodes.unavailable, message: error.message })
      : usage(error.message))

/** `lockstep status KEY [--json]`. */
export const status = (args: Backend.Target & { readonly key: string; readonly json: boolean }) =>
  Backend.provide(
    args,
    failing(Effect.gen(function*() {
      const state = yield* inspect(args.key)
      yield* Console.log(args.json ? JSON.stringify(state, null, 2) : formatState(state))
      return 0
    }))
  )

/** `lockstep release --force KEY`. */
export const release = (args: Backend.Target & { readonly key: string; readonly force: boolean }) =>
  Effect.gen(function*() {
    if (!args.force) {
      return yield* Effect.fail(
        usage("release: --force is required: it drops every holder of the key, who learn of it at their next renewal")
      )
    }
    return yield* Backend.provide(
      args,
      failing(Effect.gen(function*() {
        const backend = yield* LockBackend
        const before = yield* backend.inspect(args.key)
        const dropped = yield* backend.forceRelease({ key: args.key, id: crypto.randomUUID() })
        if (!dropped) {
          yield* Console.log(`"${args.key}" was not held: nothing removed`)
        } else {
          yield* Console.log(`"${args.key}": removed ${before.holders.length} holder${before.holders.length === 1 ? "" : "s"}`)
          for (const h of before.holders) {
            yield* Console.log(`  ${h.holder} (${h.exclusive > 0 ? "exclusive" : `shared, ${h.permits} permits`}, fence ${h.fence}, ${seconds(h.ttlMs)} left)`)
          }
        }
        return 0
      }))
    )
  })

/** `lockstep latch set KEY N`. */
export const latchSet = (args: Backend.Target & { readonly key: string; readonly count: number }) =>
  Backend.provide(
    args,
    failing(Effect.gen(function*() {
      const latch = yield* CountDownLatch.make(args.key)
      const set = yield* CountDownLatch.trySetCount(latch, args.count)
      if (!set) {
        const count = yield* CountDownLatch.count(latch)
        yield* Console.error(`lockstep: latch "${args.key}" is already counting (count ${count}): not set`)
        return 1
      }
      yield* Console.log(String(args.count))
      return 0
    }))
  )

/** `lockstep latch count-down KEY`: prints the count after. */
export const latchCountDown = (args: Backend.Target & { readonly key: string }) =>
  Backend.provide(
    args,
    failing(Effect.gen(function*() {
      const latch = yield* CountDownLatch.make(args.key)
      yield* Console.log(String(yield* CountDownLatch.countDown(latch)))
      return 0
    }))
  )

/** `lockstep latch await KEY [--timeout D]`. */
export const latchAwait = (
  args: Backend.Target & { readonly key: string; readonly timeout: Option.Option<string> }
) =>
  Effect.gen(function*() {
    const timeout = Option.isNone(args.timeout)
      ? undefined
      : yield* Either.match(Durations.parse("--timeout", args.timeout.value), {
        onLeft: (message) => Effect.fail(usage(message)),
        onRight: (d: Duration.Duration) => Effect.succeed(d)
      })
    const signals = yield* Signals
    return yield* Backend.provide(
      args,
      failing(Effect.gen(function*() {
        const latch = yield* CountDownLatch.make(args.key)
        const waited = yield* Effect.raceFirst(
          CountDownLatch.await(latch, { timeout }).pipe(
            Effect.as(0),
            Effect.catchTag("LockTimeout", () =>
              Effect.as(Console.error(`lockstep: latch "${args.key}" did not reach 0 within ${Duration.format(timeout!)}`), ExitCodes.timeout))
          ),
          Effect.map(signals.next, signalExitCode)
        )
        return waited
      }))
    )
  })
