/**
 * Model-based property tests of a `LockBackend`: random command sequences (acquire exclusive /
 * shared / fair with holders and keys from small pools, release, renew, inspect, forceRelease,
 * cancel, latch set / count down / count, advance time) run against the pure `Model` and against
 * the backend side by side; every
 * observable result (grants, denials with their `retryAfterMs`, fences, counts, error tags,
 * release counts, renew booleans, and the inspected state of every key after every step) must be
 * the same. A failing sequence is shrunk, and the smallest one is reported in the error message.
 *
 * Timing comes in two kinds:
 * - exact (the default): the backend's clock and the driver's `Clock` agree. Under `TestClock`
 *   (memory backend) pass `advance: TestClock.adjust`; sequences include `Advance` commands, short
 *   leases expire, and results match to the millisecond.
 * - live (`timing: { toleranceMs }`): the backend judges time on a clock of its own (Redis: the
 *   server's `TIME`). No `Advance` commands are generated and leases and waiter TTLs are 60 s or
 *   more, so nothing expires during a sequence; the model's `now` is Effect's `Clock` at each step.
 *   Durations (`retryAfterMs`, the `ttlMs` of `inspect`) must be positive and within `toleranceMs`
 *   of the model's; everything else (grants, denials, fences, counts, error tags, release counts,
 *   renew booleans, holders, permits, queue order) must still be the same.
 *
 * @since 0.1.0
 */
import { Data, Effect, Either, FastCheck as fc, Random } from "effect"
import type { HoldMode } from "@lockstep/core/LockBackend"
import type { LockBackend } from "@lockstep/core/LockBackend"
import * as internal from "./internal/modelCheck.js"
import * as modelRun from "./internal/modelRun.js"
import * as shrinking from "./internal/shrinking.js"

/**
 * A command of a model-based run. `key` and `holder` are indices into the run's pools (each run
 * uses fresh keys under a random prefix; holders are `<clientId>:<holder + 1>`). Releases,
 * renewals and cancellations may carry a `pick`: if anything is held (queued) at that point, they
 * target the `pick`-th live hold (queue entry) instead, so that most of them hit something. A
 * `ModelMismatch` reports its commands with every `pick` resolved, ready to replay with `execute`.
 *
 * @example
 * ```ts
 * import { ModelCheck } from "@lockstep/testkit"
 *
 * const commands: ReadonlyArray<ModelCheck.Command> = [
 *   ModelCheck.Command.Acquire({
 *     key: 0, holder: 0, mode: "exclusive", permits: 1, limit: 1, leaseMs: 10, fair: false, waiterTtlMs: 10
 *   }),
 *   ModelCheck.Command.Advance({ ms: 10 })
 * ]
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Command = internal.Command

/**
 * Constructors and matchers for `Command`.
 *
 * @example
 * ```ts
 * import { ModelCheck } from "@lockstep/testkit"
 *
 * const release = ModelCheck.Command.Release({ key: 0, holder: 1, mode: "shared" })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const Command = internal.Command

/**
 * The backend and the model disagreed. The message shows the (shrunk) command sequence, the step
 * where they first disagreed, and both results.
 *
 * @example
 * ```ts
 * import { Effect, TestClock } from "effect"
 * import { ModelCheck } from "@lockstep/testkit"
 *
 * const program = ModelCheck.run({ advance: TestClock.adjust }).pipe(
 *   Effect.catchTag("ModelMismatch", (e) => Effect.logError(e.message))
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class ModelMismatch extends Data.TaggedError("ModelMismatch")<{
  /** The (shrunk) failing sequence. */
  readonly commands: ReadonlyArray<Command>
  /** Index in `commands` of the step where the results differed. */
  readonly step: number
  /** What was compared: `"acquire result"`, `"state of k0 after the step"`, ... */
  readonly what: string
  readonly expected: string
  readonly actual: string
  /** The seed of the run that found it (`run` only). */
  readonly seed?: number | undefined
  /** Which generated sequence (0-based) failed first (`run` only). */
  readonly run?: number | undefined
  /** How many shrinking steps led to `commands` (`run` only). */
  readonly shrinks?: number | undefined
  /** Live timing: the tolerance durations were compared with. */
  readonly toleranceMs?: number | undefined
}> {
  override get message(): string {
    const origin = this.seed === undefined
      ? ""
      : ` (seed ${this.seed}, sequence ${this.run ?? "?"}, shrunk ${this.shrinks ?? 0} times)`
    const lines = this.commands.map((command, i) =>
      `${i === this.step ? ">" : " "} ${String(i).padStart(3)}. ${internal.renderCommand(command)}`
    )
    return [
      `backend and model disagree on the ${this.what} at step ${this.step}${origin}`,
      ...lines,
      `  expected (model): ${this.expected}`,
      `  actual (backend): ${this.actual}`,
      ...(this.toleranceMs === undefined
        ? []
        : [`  (live timing: durations must be > 0 and within ${this.toleranceMs} ms of the model's)`])
    ].join("\n")
  }
}

/**
 * Live timing: the backend keeps time on a clock of its own, so durations are compared within
 * `toleranceMs` (and must be positive) instead of exactly.
 *
 * @example
 * ```ts
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const timing: ModelCheck.LiveTiming = { toleranceMs: 1_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface LiveTiming {
  /** Largest difference allowed between a duration the backend reports and the model's. */
  readonly toleranceMs: number
}

/**
 * How the backend's clock relates to the driver's `Clock`: `"exact"` (the default; they are the
 * same clock, moved by `advance`) or live (`{ toleranceMs }`).
 *
 * @example
 * ```ts
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const onRedis: ModelCheck.Timing = { toleranceMs: 1_000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Timing = "exact" | LiveTiming

/**
 * What random sequences look like.
 *
 * @example
 * ```ts
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const generation: ModelCheck.Generation = { keys: 1, holders: 4, maxCommands: 60 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Generation {
  /** Size of the key pool (default 2). Key `i` mostly uses the shared limit 2, Infinity, 3, ... by `i`. */
  readonly keys?: number | undefined
  /** Size of the holder pool (default 3). */
  readonly holders?: number | undefined
  /** Longest sequence (default 40). */
  readonly maxCommands?: number | undefined
  /** Whether shared requests may be `fair` (default true; exclusive ones always may). */
  readonly fairShared?: boolean | undefined
  /**
   * `"byKey"`: every request on an odd key is fair and none on an even one, for backends whose
   * fair and non-fair waiters stand in one queue (ZooKeeper's), where a non-fair request does not
   * pass fair waiters as the rules let it. Default `"any"`.
   */
  readonly fairness?: "any" | "byKey" | undefined
  /**
   * `"exact"` (default): leases of 10 to 100 ms, waiter TTLs of 10 or 30 ms, and `Advance`
   * commands. Live: no `Advance` commands, leases of 60, 90 or 120 s and waiter TTLs of 60 or 90 s.
   */
  readonly timing?: Timing | undefined
}

/**
 * Settings shared by both timings.
 *
 * @example
 * ```ts
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const settings: ModelCheck.RunSettings = { numRuns: 50, maxCommands: 20 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RunSettings extends Generation {
  /** Sequences to run (default 100). */
  readonly numRuns?: number | undefined
  /** Seed for generation; random by default (reported on failure). */
  readonly seed?: number | undefined
  /** Candidates tried while shrinking a failure (default 1000). */
  readonly maxShrinkAttempts?: number | undefined
  /** Compare `inspect` of every key after every step (default true). */
  readonly inspectEveryStep?: boolean | undefined
  /** Prefix of the keys (default `"lockstep-model"`); each sequence adds a random UUID. */
  readonly keyPrefix?: string | undefined
}

/**
 * Exact timing: the backend's clock is Effect's `Clock`, moved by `advance`.
 *
 * @example
 * ```ts
 * import { TestClock } from "effect"
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const options: ModelCheck.ExactOptions = { advance: TestClock.adjust, numRuns: 200 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ExactOptions extends RunSettings {
  readonly timing?: "exact" | undefined
  /** Moves the backend's clock (and Effect's `Clock`) forward: `TestClock.adjust`, or `Effect.sleep` live. */
  readonly advance: (ms: number) => Effect.Effect<void>
}

/**
 * Live timing: the backend keeps its own time (a real server); durations are compared within a
 * tolerance and nothing expires during a sequence. Run it with a live `Clock` (`it.live`).
 *
 * @example
 * ```ts
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const options: ModelCheck.LiveOptions = { timing: { toleranceMs: 1_000 }, numRuns: 100, maxCommands: 20 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface LiveOptions extends RunSettings {
  readonly timing: LiveTiming
  /** Only for `Advance` commands handed to `execute` (never generated live); default `Effect.sleep`. */
  readonly advance?: ((ms: number) => Effect.Effect<void>) | undefined
}

/**
 * How to run model-based tests: exact timing with `advance`, or live timing with a tolerance.
 *
 * @example
 * ```ts
 * import { TestClock } from "effect"
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const options: ModelCheck.Options = { advance: TestClock.adjust, numRuns: 200 }
 * const live: ModelCheck.Options = { timing: { toleranceMs: 1_000 }, numRuns: 100 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Options = ExactOptions | LiveOptions

/**
 * What `execute` needs: the timing (and `advance` for exact timing) and the comparison settings.
 *
 * @example
 * ```ts
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const replay: ModelCheck.ExecuteOptions = { timing: { toleranceMs: 1_000 } }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type ExecuteOptions =
  | Pick<ExactOptions, "timing" | "advance" | "inspectEveryStep" | "keyPrefix">
  | Pick<LiveOptions, "timing" | "advance" | "inspectEveryStep" | "keyPrefix">

const defaultLimits: ReadonlyArray<number> = [2, Infinity, 3]

/**
 * The arbitrary of command sequences.
 *
 * @example
 * ```ts
 * import { FastCheck as fc } from "effect"
 * import { ModelCheck } from "@lockstep/testkit"
 *
 * const [sequence] = fc.sample(ModelCheck.commands({ keys: 1 }), 1)
 * ```
 *
 * @since 0.1.0
 * @category generators
 */
export const commands = (generation: Generation = {}): fc.Arbitrary<ReadonlyArray<Command>> => {
  const keys = Math.max(1, generation.keys ?? 2)
  const holders = Math.max(1, generation.holders ?? 3)
  const fairShared = generation.fairShared ?? true
  const live = internal.toleranceOf(generation.timing) !== undefined
  const key = fc.nat({ max: keys - 1 })
  const holder = fc.nat({ max: holders - 1 })
  const mode = fc.constantFrom<HoldMode>("exclusive", "shared")
  // Live: long enough that nothing expires during a sequence, and far apart compared to any tolerance.
  const leaseMs = live ? fc.constantFrom(60_000, 90_000, 120_000) : fc.constantFrom(10, 20, 50, 100)
  const acquire = fc
    .record({
      key,
      holder,
      mode,
      permits: fc.integer({ min: 1, max: 3 }),
      otherLimit: fc.oneof(
        { weight: 5, arbitrary: fc.constant(undefined) },
        { weight: 1, arbitrary: fc.constantFrom(1, 2, 3, Infinity) }
      ),
      leaseMs,
      fair: fc.boolean(),
      waiterTtlMs: live ? fc.constantFrom(60_000, 90_000) : fc.constantFrom(10, 30)
    })
    .map((r) => {
      const limit = r.otherLimit ?? defaultLimits[r.key % defaultLimits.length] ?? Infinity
      return Command.Acquire({
        key: r.key,
        holder: r.holder,
        mode: r.mode,
        permits: r.mode === "exclusive" ? 1 : Math.min(r.permits, limit),
        limit,
        leaseMs: r.leaseMs,
        fair: generation.fairness === "byKey"
          ? r.key % 2 === 1 && (r.mode === "exclusive" || fairShared)
          : r.mode === "exclusive" || fairShared
          ? r.fair
          : false,
        waiterTtlMs: r.waiterTtlMs
      })
    })
  // Most releases, renewals and cancellations target what is actually held or queued at that point.
  const pick = fc.option(fc.nat({ max: 7 }), { nil: undefined, freq: 4 })
  const release = fc.record({ key, holder, mode, pick }).map((r) => Command.Release(r))
  const renew = fc
    .array(fc.record({ key, holder, leaseMs, pick }), { minLength: 1, maxLength: 3 })
    .map((leases) => Command.Renew({ leases }))
  const inspect = key.map((k) => Command.Inspect({ key: k }))
  const forceRelease = key.map((k) => Command.ForceRelease({ key: k }))
  const cancel = fc.record({ key, holder, pick }).map((r) => Command.Cancel(r))
  const replay = fc.nat({ max: 63 }).map((pick) => Command.Replay({ pick }))
  const advance = fc.constantFrom(1, 5, 10, 20, 50).map((ms) => Command.Advance({ ms }))
  const latchSetCount = fc.record({ key, count: fc.integer({ min: 1, max: 3 }) }).map((r) => Command.LatchSetCount(r))
  const latchCountDown = key.map((k) => Command.LatchCountDown({ key: k }))
  const latchCount = key.map((k) => Command.LatchCount({ key: k }))
  const command: fc.Arbitrary<Command> = fc.oneof(
    { weight: 8, arbitrary: acquire },
    { weight: 4, arbitrary: release },
    { weight: 2, arbitrary: renew },
    { weight: 1, arbitrary: inspect },
    { weight: 1, arbitrary: forceRelease },
    { weight: 2, arbitrary: cancel },
    { weight: 3, arbitrary: replay },
    { weight: 1, arbitrary: latchSetCount },
    { weight: 2, arbitrary: latchCountDown },
    { weight: 1, arbitrary: latchCount },
    // Live: time passes on its own; moving it on purpose would only make expiry a race.
    ...(live ? [] : [{ weight: 4, arbitrary: advance }])
  )
  return fc.array(command, { minLength: 1, maxLength: Math.max(1, generation.maxCommands ?? 40), size: "max" })
}

/**
 * Runs one command sequence against the model and the backend (fresh keys), failing with
 * `ModelMismatch` at the first difference. Use it to replay a reported counterexample, with the
 * timing of the run that found it.
 *
 * @example
 * ```ts
 * import { TestClock } from "effect"
 * import { ModelCheck } from "@lockstep/testkit"
 *
 * const replay = ModelCheck.execute(
 *   [ModelCheck.Command.Acquire({
 *     key: 0, holder: 0, mode: "shared", permits: 2, limit: 2, leaseMs: 10, fair: false, waiterTtlMs: 10
 *   })],
 *   { advance: TestClock.adjust }
 * )
 * const replayLive = ModelCheck.execute(
 *   [ModelCheck.Command.Acquire({
 *     key: 0, holder: 0, mode: "exclusive", permits: 1, limit: 1, leaseMs: 60_000, fair: false, waiterTtlMs: 60_000
 *   })],
 *   { timing: { toleranceMs: 1_000 } }
 * )
 * ```
 *
 * @since 0.1.0
 * @category running
 */
export const execute = (
  commands: ReadonlyArray<Command>,
  options: ExecuteOptions
): Effect.Effect<void, ModelMismatch, LockBackend> =>
  Effect.mapError(modelRun.execute(commands, options), (d) => new ModelMismatch(d))

/**
 * Runs `numRuns` random sequences against the model and the backend in context. The first
 * failing sequence is shrunk; the run fails with a `ModelMismatch` carrying the shrunk sequence,
 * the seed and both results. Each sequence (and each shrinking candidate) uses fresh keys under a
 * random UUID, so runs on a shared server do not interfere.
 *
 * @example
 * ```ts
 * import { it } from "@effect/vitest"
 * import { Effect, TestClock } from "effect"
 * import { MemoryBackend } from "@lockstep/memory"
 * import { ModelCheck } from "@lockstep/testkit"
 *
 * it.effect("memory backend follows the model", () =>
 *   ModelCheck.run({ numRuns: 200, advance: TestClock.adjust }).pipe(Effect.provide(MemoryBackend.layer)))
 *
 * // a backend on a clock of its own (a real server): live timing, under a live Clock
 * it.live("memory backend follows the model in live timing", () =>
 *   ModelCheck.run({ timing: { toleranceMs: 1_000 }, numRuns: 100, maxCommands: 20 }).pipe(
 *     Effect.provide(MemoryBackend.layer)
 *   ))
 * ```
 *
 * @since 0.1.0
 * @category running
 */
export const run = (options: Options): Effect.Effect<void, ModelMismatch, LockBackend> =>
  Effect.gen(function*() {
    const seed = options.seed ?? (yield* Random.nextIntBetween(0, 2 ** 31 - 1))
    const arbitrary = commands(options)
    const samples = shrinking.sample(arbitrary, seed, options.numRuns ?? 100)
    const test = (sequence: ReadonlyArray<Command>) => execute(sequence, options)
    for (const [run, sample] of samples.entries()) {
      const outcome = yield* Effect.either(test(sample.value))
      if (Either.isLeft(outcome)) {
        const shrunk = yield* shrinking.shrink(arbitrary, sample, outcome.left, test, options.maxShrinkAttempts ?? 1000)
        const { actual, commands, expected, step, toleranceMs, what } = shrunk.error
        return yield* Effect.fail(
          new ModelMismatch({ commands, step, what, expected, actual, toleranceMs, seed, run, shrinks: shrunk.shrinks })
        )
      }
    }
  })
