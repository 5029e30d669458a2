/**
 * Model-based property tests of a `LockBackend`: random command sequences (acquire exclusive /
 * shared / fair with holders and keys from small pools, release, renew, inspect, forceRelease,
 * cancel, advance time) run against the pure `Model` and against the backend side by side; every
 * observable result (grants, denials with their `retryAfterMs`, fences, counts, error tags,
 * release counts, renew booleans, and the inspected state of every key after every step) must be
 * the same. A failing sequence is shrunk, and the smallest one is reported in the error message.
 *
 * The backend's clock and the driver's `Clock` must agree: under `TestClock` (memory backend) pass
 * `advance: TestClock.adjust` and results match to the millisecond.
 *
 * @since 0.1.0
 */
import { Data, Effect, Either, FastCheck as fc, Random } from "effect"
import type { HoldMode } from "@lockstep/core/LockBackend"
import type { LockBackend } from "@lockstep/core/LockBackend"
import * as internal from "./internal/modelCheck.js"
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
      `  actual (backend): ${this.actual}`
    ].join("\n")
  }
}

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
}

/**
 * How to run model-based tests.
 *
 * @example
 * ```ts
 * import { TestClock } from "effect"
 * import type { ModelCheck } from "@lockstep/testkit"
 *
 * const options: ModelCheck.Options = { advance: TestClock.adjust, numRuns: 200 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options extends Generation {
  /** Moves the backend's clock (and Effect's `Clock`) forward: `TestClock.adjust`, or `Effect.sleep` live. */
  readonly advance: (ms: number) => Effect.Effect<void>
  /** Sequences to run (default 100). */
  readonly numRuns?: number | undefined
  /** Seed for generation; random by default (reported on failure). */
  readonly seed?: number | undefined
  /** Candidates tried while shrinking a failure (default 1000). */
  readonly maxShrinkAttempts?: number | undefined
  /** Compare `inspect` of every key after every step (default true). */
  readonly inspectEveryStep?: boolean | undefined
  /** Prefix of the keys (default `"lockstep-model"`); each sequence adds a random part. */
  readonly keyPrefix?: string | undefined
}

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
  const key = fc.nat({ max: keys - 1 })
  const holder = fc.nat({ max: holders - 1 })
  const mode = fc.constantFrom<HoldMode>("exclusive", "shared")
  const leaseMs = fc.constantFrom(10, 20, 50, 100)
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
      waiterTtlMs: fc.constantFrom(10, 30)
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
        fair: r.mode === "exclusive" || fairShared ? r.fair : false,
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
  const advance = fc.constantFrom(1, 5, 10, 20, 50).map((ms) => Command.Advance({ ms }))
  const command: fc.Arbitrary<Command> = fc.oneof(
    { weight: 8, arbitrary: acquire },
    { weight: 4, arbitrary: release },
    { weight: 2, arbitrary: renew },
    { weight: 1, arbitrary: inspect },
    { weight: 1, arbitrary: forceRelease },
    { weight: 2, arbitrary: cancel },
    { weight: 4, arbitrary: advance }
  )
  return fc.array(command, { minLength: 1, maxLength: Math.max(1, generation.maxCommands ?? 40), size: "max" })
}

/**
 * Runs one command sequence against the model and the backend (fresh keys), failing with
 * `ModelMismatch` at the first difference. Use it to replay a reported counterexample.
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
 * ```
 *
 * @since 0.1.0
 * @category running
 */
export const execute = (
  commands: ReadonlyArray<Command>,
  options: Pick<Options, "advance" | "inspectEveryStep" | "keyPrefix">
): Effect.Effect<void, ModelMismatch, LockBackend> =>
  Effect.mapError(internal.execute(commands, options), (d) => new ModelMismatch(d))

/**
 * Runs `numRuns` random sequences against the model and the backend in context. The first
 * failing sequence is shrunk; the run fails with a `ModelMismatch` carrying the shrunk sequence,
 * the seed and both results.
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
        const { actual, commands, expected, step, what } = shrunk.error
        return yield* Effect.fail(
          new ModelMismatch({ commands, step, what, expected, actual, seed, run, shrinks: shrunk.shrinks })
        )
      }
    }
  })
