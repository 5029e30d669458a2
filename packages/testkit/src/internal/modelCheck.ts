/**
 * The commands of a model-based run, how they are shown, and how live timing compares results
 * (the run itself: modelRun.ts).
 *
 * @since 0.1.0
 * @internal
 */
import { Data, Either } from "effect"
import type { Effect } from "effect"
import type { HoldMode } from "@lockstep/core/LockBackend"

/** A command of a model-based run; keys and holders are indices into small pools. */
export type Command = Data.TaggedEnum<{
  Acquire: {
    readonly key: number
    readonly holder: number
    readonly mode: HoldMode
    readonly permits: number
    readonly limit: number
    readonly leaseMs: number
    readonly fair: boolean
    readonly waiterTtlMs: number
  }
  Release: {
    readonly key: number
    readonly holder: number
    readonly mode: HoldMode
    /** When set and something is held: release the `pick`-th (modulo) live hold instead. */
    readonly pick?: number | undefined
  }
  Renew: {
    readonly leases: ReadonlyArray<{
      readonly key: number
      readonly holder: number
      readonly leaseMs: number
      /** When set and something is held: renew the `pick`-th (modulo) live holder instead. */
      readonly pick?: number | undefined
    }>
  }
  Inspect: { readonly key: number }
  ForceRelease: { readonly key: number }
  Cancel: {
    readonly key: number
    readonly holder: number
    /** When set and someone is queued: cancel the `pick`-th (modulo) queue entry instead. */
    readonly pick?: number | undefined
  }
  Advance: { readonly ms: number }
  /** Latch calls, on a pool of latch keys of their own. */
  LatchSetCount: { readonly key: number; readonly count: number }
  LatchCountDown: { readonly key: number }
  LatchCount: { readonly key: number }
  /**
   * Delivers an earlier acquire, release, cancel, forced release or latch change again, verbatim (the
   * `pick`-th, modulo, of those sent so far): a duplicate, or a late copy.
   */
  Replay: { readonly pick: number }
}>

export const Command = Data.taggedEnum<Command>()

/** Where the backend and the model first disagreed. */
export interface Divergence {
  /** The commands run, up to and including the failing one, with every `pick` resolved. */
  readonly commands: ReadonlyArray<Command>
  readonly step: number
  readonly what: string
  readonly expected: string
  readonly actual: string
  /** Set in live timing: durations were compared within this many milliseconds. */
  readonly toleranceMs?: number | undefined
}

/**
 * `"exact"`: the backend's clock is Effect's `Clock`, moved by `advance`; results match to the
 * millisecond. `{ toleranceMs }`: the backend judges time on a clock of its own (a server's real
 * clock); durations are compared within `toleranceMs` and must be positive, everything else exactly.
 */
export type Timing = "exact" | { readonly toleranceMs: number }

export interface ExecuteOptions {
  /** Required for `"exact"` timing; in live timing `Advance` commands sleep by default. */
  readonly advance?: ((ms: number) => Effect.Effect<void>) | undefined
  readonly timing?: Timing | undefined
  readonly inspectEveryStep?: boolean | undefined
  readonly keyPrefix?: string | undefined
}

/** The tolerance of live timing, or `undefined` for exact timing. */
export const toleranceOf = (timing: Timing | undefined): number | undefined =>
  timing === undefined || timing === "exact" ? undefined : Math.max(0, timing.toleranceMs)

/** Where rendered results carry durations: `retryAfterMs=<n>` and `ttl=<n>`. */
const durationPattern = /\b(retryAfterMs|ttl)=([^\s,)}\]]*)/g

/**
 * Whether two rendered results agree in live timing: equal once every duration is blanked out,
 * and every duration of `actual` positive and within `toleranceMs` of the one in `expected`.
 */
export const agreeWithin = (expected: string, actual: string, toleranceMs: number): boolean => {
  const skeleton = (rendered: string) => rendered.replace(durationPattern, "$1=~")
  if (skeleton(expected) !== skeleton(actual)) return false
  const durations = (rendered: string) => Array.from(rendered.matchAll(durationPattern), (m) => Number(m[2]))
  const actualDurations = durations(actual)
  return durations(expected).every((ms, i) => {
    const got = actualDurations[i]
    return got !== undefined && got > 0 && Math.abs(got - ms) <= toleranceMs
  })
}

const short = (holder: number): string => `h${holder}`
export const keyLabel = (key: number): string => `k${key}`
const pickLabel = (pick: number | undefined): string => (pick === undefined ? "" : ` (or live pick ${pick})`)

export const renderCommand = (command: Command): string =>
  Command.$match(command, {
    Acquire: (c) =>
      `acquire ${keyLabel(c.key)} ${short(c.holder)} ${c.mode}` +
      (c.mode === "shared" ? ` permits=${c.permits}` : "") +
      ` limit=${c.limit} lease=${c.leaseMs}` +
      (c.fair ? ` fair waiterTtl=${c.waiterTtlMs}` : ""),
    Release: (c) => `release ${keyLabel(c.key)} ${short(c.holder)} ${c.mode}${pickLabel(c.pick)}`,
    Renew: (c) =>
      `renew [${
        c.leases.map((l) => `${keyLabel(l.key)} ${short(l.holder)} lease=${l.leaseMs}${pickLabel(l.pick)}`).join(", ")
      }]`,
    Inspect: (c) => `inspect ${keyLabel(c.key)}`,
    ForceRelease: (c) => `forceRelease ${keyLabel(c.key)}`,
    Cancel: (c) => `cancel ${keyLabel(c.key)} ${short(c.holder)}${pickLabel(c.pick)}`,
    Advance: (c) => `advance ${c.ms}ms`,
    LatchSetCount: (c) => `latchSetCount l${c.key} ${c.count}`,
    LatchCountDown: (c) => `latchCountDown l${c.key}`,
    LatchCount: (c) => `latchCount l${c.key}`,
    Replay: (c) => `replay #${c.pick}`
  })

export const renderError = (
  error: { readonly _tag: string; readonly message: string; readonly field?: string; readonly reason?: string }
): string => {
  switch (error._tag) {
    case "InvalidLockOptions":
      return `InvalidLockOptions(${error.field ?? "?"}: ${error.reason ?? "?"})`
    case "BackendError":
      return `BackendError(${error.message})`
    default:
      return error._tag
  }
}

export const renderEither = <A, E extends { readonly _tag: string; readonly message: string }>(
  either: Either.Either<A, E>,
  render: (a: A) => string
): string => Either.match(either, { onLeft: renderError, onRight: render })
