/**
 * A history checker for lock tests: record every grant and release (with fence, permits and time)
 * while many fibers use a backend, then check the history for
 * - mutual exclusion: while a holder holds a key exclusively, no other holder holds it at all;
 * - capacity: the permits of the shared holders of a key never exceed its limit, and they agree
 *   on that limit;
 * - fencing: every new grant of a key carries a fence above every grant answered before its
 *   acquisition was sent, and above every grant it could not have held alongside (one of the two
 *   exclusive) answered before it; only shared grants in flight together may come back in either
 *   order. A re-entrant grant (or a writer taking the read lock) keeps the holder's fence;
 * - well-formedness: no release of a hold that was never granted.
 *
 * Events are ordered by `at`, a logical sequence number. To judge a real, concurrent system
 * without false alarms, take the number for a grant *after* the backend reports it and the number
 * for a release *before* asking the backend to release (`History.instrument` does so): recorded
 * intervals are then inside the true ones, so any overlap the checker finds really happened.
 * Holds whose `expiresAt` (on the same clock as `time`) has passed end on their own.
 *
 * @since 0.1.0
 */
import { Array as Arr, Clock, Data, Effect, Ref } from "effect"
import type { HoldMode, Service } from "@lockstep/core/LockBackend"
import * as internal from "./internal/history.js"

/**
 * A recorded event. `at` orders events; `time` (optional) is a clock reading used only to end
 * holds at their `expiresAt`.
 *
 * @example
 * ```ts
 * import { History } from "@lockstep/testkit"
 *
 * const events: ReadonlyArray<History.Event> = [
 *   History.Event.Grant({ at: 1, key: "k", holder: "a", mode: "exclusive", permits: 1, limit: 1, fence: 1 }),
 *   History.Event.Release({ at: 2, key: "k", holder: "a", mode: "exclusive" })
 * ]
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Event = Data.TaggedEnum<{
  /** `holder` was granted `key` (a new grant or a re-entrant one). */
  Grant: {
    readonly at: number
    readonly time?: number | undefined
    readonly key: string
    readonly holder: string
    readonly mode: HoldMode
    readonly permits: number
    /** The shared limit of the request (ignored for exclusive grants). */
    readonly limit: number
    readonly fence: number
    /** When the hold ends unless renewed, on the clock of `time`. */
    readonly expiresAt?: number | undefined
    /**
     * The sequence number taken when the acquisition was sent (`at` if absent): a shared grant
     * answered while it was in flight may carry a higher fence (the backend may have granted them
     * in either order).
     */
    readonly invokedAt?: number | undefined
  }
  /** `holder` released one hold of `key` in `mode`. */
  Release: {
    readonly at: number
    readonly time?: number | undefined
    readonly key: string
    readonly holder: string
    readonly mode: HoldMode
  }
  /** `holder` renewed its holds of `key` until `expiresAt`. */
  Renew: {
    readonly at: number
    readonly time?: number | undefined
    readonly key: string
    readonly holder: string
    readonly expiresAt: number
  }
  /** `holder` lost all its holds of `key` (lease expired, renewal failed). */
  Expire: {
    readonly at: number
    readonly time?: number | undefined
    readonly key: string
    readonly holder: string
  }
  /** Every holder of `key` lost its holds (`forceRelease`). */
  ForceRelease: {
    readonly at: number
    readonly time?: number | undefined
    readonly key: string
  }
}>

/**
 * Constructors for `Event`.
 *
 * @example
 * ```ts
 * import { History } from "@lockstep/testkit"
 *
 * const event = History.Event.Expire({ at: 7, key: "k", holder: "a" })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const Event = Data.taggedEnum<Event>()

/**
 * Something the history shows a correct lock could not have done.
 *
 * @example
 * ```ts
 * import { History } from "@lockstep/testkit"
 *
 * const tags = (violations: ReadonlyArray<History.Violation>) => violations.map((v) => v._tag)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Violation = Data.TaggedEnum<{
  /** `holder` was granted `mode` while `other` held the key in `otherMode`, one of them exclusively. */
  Overlap: {
    readonly at: number
    readonly key: string
    readonly holder: string
    readonly mode: HoldMode
    readonly other: string
    readonly otherMode: HoldMode
  }
  /** After the grant at `at`, the shared holders of the key held `permits` > `limit`. */
  PermitsExceeded: {
    readonly at: number
    readonly key: string
    readonly holder: string
    readonly permits: number
    readonly limit: number
  }
  /** A shared grant named another limit than the key's current shared holders. */
  LimitMismatch: {
    readonly at: number
    readonly key: string
    readonly holder: string
    readonly limit: number
    readonly expected: number
  }
  /** A new grant's fence was not above every fence issued before for the key. */
  FenceNotIncreasing: {
    readonly at: number
    readonly key: string
    readonly holder: string
    readonly fence: number
    readonly previous: number
  }
  /** A re-entrant grant (the holder still held the key) came with another fence. */
  FenceChanged: {
    readonly at: number
    readonly key: string
    readonly holder: string
    readonly fence: number
    readonly expected: number
  }
  /** A release of a hold that was not held (and had not merely expired). */
  ReleaseWithoutGrant: {
    readonly at: number
    readonly key: string
    readonly holder: string
    readonly mode: HoldMode
  }
}>

/**
 * Constructors for `Violation`.
 *
 * @example
 * ```ts
 * import { History } from "@lockstep/testkit"
 *
 * const v = History.Violation.ReleaseWithoutGrant({ at: 1, key: "k", holder: "a", mode: "shared" })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const Violation = Data.taggedEnum<Violation>()

/**
 * One line describing a violation.
 *
 * @example
 * ```ts
 * import { History } from "@lockstep/testkit"
 *
 * console.log(History.formatViolation(History.Violation.ReleaseWithoutGrant({ at: 1, key: "k", holder: "a", mode: "shared" })))
 * ```
 *
 * @since 0.1.0
 * @category utils
 */
export const formatViolation: (violation: Violation) => string = Violation.$match({
  Overlap: (v) =>
    `#${v.at} "${v.key}": ${v.holder} was granted ${v.mode} while ${v.other} held it ${v.otherMode}`,
  PermitsExceeded: (v) =>
    `#${v.at} "${v.key}": grant to ${v.holder} brought shared permits to ${v.permits}, above the limit ${v.limit}`,
  LimitMismatch: (v) =>
    `#${v.at} "${v.key}": shared grant to ${v.holder} with limit ${v.limit} while it is held with limit ${v.expected}`,
  FenceNotIncreasing: (v) =>
    `#${v.at} "${v.key}": new grant to ${v.holder} has fence ${v.fence}, not above ${v.previous}`,
  FenceChanged: (v) =>
    `#${v.at} "${v.key}": re-entrant grant to ${v.holder} has fence ${v.fence}, its hold has ${v.expected}`,
  ReleaseWithoutGrant: (v) => `#${v.at} "${v.key}": ${v.holder} released a ${v.mode} hold it did not hold`
})

/**
 * The history broke the rules; `violations` lists every finding.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { History } from "@lockstep/testkit"
 *
 * const program = History.assertValid([]).pipe(
 *   Effect.catchTag("HistoryViolation", (e) => Effect.log(e.message))
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class HistoryViolation extends Data.TaggedError("HistoryViolation")<{
  readonly violations: ReadonlyArray<Violation>
}> {
  override get message(): string {
    return `history has ${this.violations.length} violation(s):\n${this.violations.map(formatViolation).join("\n")}`
  }
}

/**
 * Checks a history (in any order; it is sorted by `at`) and returns every violation found, in
 * order. An empty result means the history is valid.
 *
 * @example
 * ```ts
 * import { History } from "@lockstep/testkit"
 *
 * const violations = History.check([
 *   History.Event.Grant({ at: 1, key: "k", holder: "a", mode: "exclusive", permits: 1, limit: 1, fence: 1 }),
 *   History.Event.Grant({ at: 2, key: "k", holder: "b", mode: "exclusive", permits: 1, limit: 1, fence: 2 })
 * ])
 * console.log(violations.map((v) => v._tag)) // ["Overlap"]
 * ```
 *
 * @since 0.1.0
 * @category checking
 */
export const check = (events: Iterable<Event>): ReadonlyArray<Violation> => internal.check(events)

/**
 * Fails with `HistoryViolation` listing every violation, or succeeds if the history is valid.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { History } from "@lockstep/testkit"
 *
 * const program = Effect.gen(function* () {
 *   const history = yield* History.make
 *   // ... run fibers against `History.instrument(history, backend)` ...
 *   yield* History.assertValid(yield* history.events)
 * })
 * ```
 *
 * @since 0.1.0
 * @category checking
 */
export const assertValid = (events: Iterable<Event>): Effect.Effect<void, HistoryViolation> =>
  Effect.suspend(() => {
    const violations = check(events)
    return violations.length === 0 ? Effect.void : Effect.fail(new HistoryViolation({ violations }))
  })

/**
 * What to record for a grant.
 *
 * @example
 * ```ts
 * import type { History } from "@lockstep/testkit"
 *
 * const grant: History.GrantInput = { key: "k", holder: "a", mode: "shared", permits: 2, limit: 5, fence: 3 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type GrantInput = Omit<Extract<Event, { readonly _tag: "Grant" }>, "_tag" | "at" | "time">

/**
 * A concurrent-safe event log. Every method stamps the event with the next sequence number (or
 * the one given as `at`, taken earlier with `sequence`) and with `Clock.currentTimeMillis`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { History } from "@lockstep/testkit"
 *
 * const program = Effect.gen(function* () {
 *   const history = yield* History.make
 *   yield* history.grant({ key: "k", holder: "a", mode: "exclusive", permits: 1, limit: 1, fence: 1 })
 *   yield* history.release({ key: "k", holder: "a", mode: "exclusive" })
 *   yield* history.assertValid
 * })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Recorder {
  /** Takes the next sequence number, to place an event before the call it describes. */
  readonly sequence: Effect.Effect<number>
  readonly grant: (grant: GrantInput, at?: number) => Effect.Effect<void>
  readonly release: (
    release: { readonly key: string; readonly holder: string; readonly mode: HoldMode },
    at?: number
  ) => Effect.Effect<void>
  readonly renew: (
    renew: { readonly key: string; readonly holder: string; readonly expiresAt: number },
    at?: number
  ) => Effect.Effect<void>
  readonly expire: (expire: { readonly key: string; readonly holder: string }, at?: number) => Effect.Effect<void>
  readonly forceRelease: (key: string, at?: number) => Effect.Effect<void>
  /** The events recorded so far, in `at` order. */
  readonly events: Effect.Effect<ReadonlyArray<Event>>
  /** `check` of the events recorded so far. */
  readonly check: Effect.Effect<ReadonlyArray<Violation>>
  /** `assertValid` of the events recorded so far. */
  readonly assertValid: Effect.Effect<void, HistoryViolation>
}

/**
 * Creates an empty recorder.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { History } from "@lockstep/testkit"
 *
 * const program = Effect.flatMap(History.make, (history) => history.check)
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: Effect.Effect<Recorder> = Effect.gen(function*() {
  const counter = yield* Ref.make(0)
  const log = yield* Ref.make<ReadonlyArray<Event>>([])
  const sequence = Ref.updateAndGet(counter, (n) => n + 1)
  const stamp = (at: number | undefined) =>
    Effect.all({ at: at === undefined ? sequence : Effect.succeed(at), time: Clock.currentTimeMillis })
  const append = (event: Event) => Ref.update(log, Arr.append(event))
  const events = Effect.map(Ref.get(log), Arr.sort(internal.byAt))
  return {
    sequence,
    grant: (grant, at) => Effect.flatMap(stamp(at), (s) => append(Event.Grant({ ...grant, ...s }))),
    release: (release, at) => Effect.flatMap(stamp(at), (s) => append(Event.Release({ ...release, ...s }))),
    renew: (renew, at) => Effect.flatMap(stamp(at), (s) => append(Event.Renew({ ...renew, ...s }))),
    expire: (expire, at) => Effect.flatMap(stamp(at), (s) => append(Event.Expire({ ...expire, ...s }))),
    forceRelease: (key, at) => Effect.flatMap(stamp(at), (s) => append(Event.ForceRelease({ key, ...s }))),
    events,
    check: Effect.map(events, check),
    assertValid: Effect.flatMap(events, assertValid)
  } satisfies Recorder
})

/**
 * Wraps a backend so that everything it grants, releases, renews and force-releases is recorded,
 * conservatively: grants are numbered after the backend reports them, releases and force releases
 * before they are sent (and recorded only if they succeed), and expiries are computed from the
 * clock reading taken before each call. Recorded holds therefore never outlast the real ones.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core/LockBackend"
 * import { History } from "@lockstep/testkit"
 *
 * const program = Effect.gen(function* () {
 *   const history = yield* History.make
 *   const backend = History.instrument(history, yield* LockBackend)
 *   // ... use `backend` from many fibers ...
 *   yield* history.assertValid
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const instrument = (recorder: Recorder, backend: Service): Service => internal.instrument(recorder, backend)
