/**
 * Running command sequences against the model and a backend side by side.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Data, Effect, Either } from "effect"
import type {
  AcquireRequest,
  AcquireResult,
  CancelRequest,
  ForceReleaseRequest,
  HoldMode,
  KeyState,
  LatchRequest,
  ReleaseRequest,
  RenewResult,
  SetCountRequest
} from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import * as Model from "../Model.js"

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
const keyLabel = (key: number): string => `k${key}`
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

const renderError = (
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

const renderEither = <A, E extends { readonly _tag: string; readonly message: string }>(
  either: Either.Either<A, E>,
  render: (a: A) => string
): string => Either.match(either, { onLeft: renderError, onRight: render })

/** A request as it was sent, for `Replay`. */
type Sent =
  | { readonly _tag: "Acquire"; readonly request: AcquireRequest }
  | { readonly _tag: "Release"; readonly request: ReleaseRequest }
  | { readonly _tag: "Cancel"; readonly request: CancelRequest }
  | { readonly _tag: "ForceRelease"; readonly request: ForceReleaseRequest }
  | { readonly _tag: "LatchSetCount"; readonly request: SetCountRequest }
  | { readonly _tag: "LatchCountDown"; readonly request: LatchRequest }

const renderRenew = (results: ReadonlyArray<RenewResult>) =>
  `[${results.map((r) => Either.match(r, { onLeft: renderError, onRight: String })).join(", ")}]`

export const execute = (
  commands: ReadonlyArray<Command>,
  options: ExecuteOptions
): Effect.Effect<void, Divergence, LockBackend> =>
  Effect.gen(function*() {
    const backend = yield* LockBackend
    const toleranceMs = toleranceOf(options.timing)
    const advance = options.advance ??
      (toleranceMs === undefined
        ? () => Effect.dieMessage("ModelCheck: exact timing needs `advance` to move the backend's clock")
        : (ms: number) => Effect.sleep(ms))
    // Fresh keys per sequence, unique across processes sharing a server (whatever Random is seeded with).
    const prefix = `${options.keyPrefix ?? "lockstep-model"}:${crypto.randomUUID()}`
    const keyName = (key: number): string => `${prefix}:k${key}`
    const latchName = (key: number): string => `${prefix}:l${key}`

    // A holder of the pool is a client's holder identity on one key. Once it ends (its last
    // release, leaving the queue, a forced release, a lost hold) the client takes a fresh
    // identity, as the lock API does: `generation` counts them. `believed` is the client's view of
    // its counts, so a re-entry after a silent loss is sent as the lock API would send it.
    const holderStride = 1000
    // how long ended holders are remembered: short under exact timing so that forgetting is
    // exercised, far beyond the tolerance in live timing so that no comparison straddles it
    const endedMs = toleranceMs === undefined ? 100 : 600_000
    const generations = new Map<string, number>()
    const believed = new Map<string, { exclusive: number; shared: number }>()
    const slot = (key: number, holder: number) => `${key}/${holder}`
    const holderName = (key: number, holder: number): string =>
      `${backend.clientId}:${holder + 1 + holderStride * (generations.get(slot(key, holder)) ?? 0)}`
    const believedOf = (key: number, holder: number) => {
      let counts = believed.get(slot(key, holder))
      if (counts === undefined) {
        counts = { exclusive: 0, shared: 0 }
        believed.set(slot(key, holder), counts)
      }
      return counts
    }
    const retire = (key: number, holder: number): void => {
      generations.set(slot(key, holder), (generations.get(slot(key, holder)) ?? 0) + 1)
      believed.delete(slot(key, holder))
    }
    const holderNumber = (name: string): number => Number(name.slice(backend.clientId.length + 1)) - 1
    const holderIndex = (name: string): number => holderNumber(name) % holderStride
    const holderLabel = (name: string): string => {
      if (!name.startsWith(`${backend.clientId}:`)) return name
      const generation = Math.floor(holderNumber(name) / holderStride)
      return `h${holderIndex(name)}${generation === 0 ? "" : `'${generation}`}`
    }

    // Fences differ between backends (a counter, a clock); compared as their rank on the key, and
    // checked to go up with every new grant.
    const ranks = { expected: new Map<string, Map<number, number>>(), actual: new Map<string, Map<number, number>>() }
    const fenceFailures: Array<string> = []
    const rankOf = (side: "expected" | "actual", key: string, fence: number): string => {
      let seen = ranks[side].get(key)
      if (seen === undefined) {
        seen = new Map()
        ranks[side].set(key, seen)
      }
      let rank = seen.get(fence)
      if (rank === undefined) {
        const highest = Math.max(0, ...seen.keys())
        if (fence <= highest) fenceFailures.push(`${side} fence ${fence} issued after ${highest}`)
        rank = seen.size + 1
        seen.set(fence, rank)
      }
      return `#${rank}`
    }
    const renderAcquireOn = (side: "expected" | "actual", key: string) => (result: AcquireResult): string =>
      result._tag === "Granted"
        ? `Granted(fence=${rankOf(side, key, result.fence)}, count=${result.count})`
        : `Denied(retryAfterMs=${result.retryAfterMs})`
    const renderStateOn = (side: "expected" | "actual") => (state: KeyState): string => {
      const holders = state.holders
        .map((h) =>
          `${holderLabel(h.holder)}{x=${h.exclusive} s=${h.shared} permits=${h.permits} fence=${
            rankOf(side, state.key, h.fence)
          } ttl=${h.ttlMs}}`
        )
        .sort()
      if (state.fence !== 0 && state.holders.some((h) => h.fence > state.fence)) {
        fenceFailures.push(`${side} key fence ${state.fence} below a holder's fence`)
      }
      const queue = state.queue.map((w) => `${holderLabel(w.holder)}{ttl=${w.ttlMs}}`)
      const key = state.key.startsWith(`${prefix}:`) ? state.key.slice(prefix.length + 1) : state.key
      return `${key} limit=${state.limit ?? "none"} holders=[${holders.join(" ")}] queue=[${queue.join(" ")}]`
    }
    const inspectedKeys = Array.from(
      new Set(
        commands.flatMap((c) =>
          c._tag === "Advance" || c._tag === "Replay" || c._tag.startsWith("Latch")
            ? []
            : c._tag === "Renew"
            ? c.leases.map((l) => l.key)
            : [c.key]
        )
      )
    ).sort((a, b) => a - b)

    const latchKeys = Array.from(
      new Set(commands.flatMap((c) => (c._tag === "LatchSetCount" || c._tag === "LatchCountDown" || c._tag === "LatchCount" ? [c.key] : [])))
    ).sort((a, b) => a - b)

    let model = Model.empty
    const resolved: Array<Command> = []
    const sent: Array<Sent> = []
    const compare = (step: number, what: string, expected: string, actual: string) => {
      const fences = fenceFailures.splice(0)
      if (fences.length > 0) {
        return Effect.fail<Divergence>({ commands: resolved, step, what, expected: "fences that only go up", actual: fences.join("; ") })
      }
      return (toleranceMs === undefined ? expected === actual : agreeWithin(expected, actual, toleranceMs))
        ? Effect.void
        : Effect.fail<Divergence>({
          commands: resolved,
          step,
          what,
          expected,
          actual,
          ...(toleranceMs === undefined ? {} : { toleranceMs })
        })
    }

    // Live holds and queue entries of the model, as pool indices, for `pick`.
    const keyIndex = (name: string): number => Number(name.slice(prefix.length + 2))
    const liveHolds = (now: number) =>
      Array.from(model.keys.keys()).sort().flatMap((name) =>
        Model.liveKey(model, name, now).holders.flatMap((h) => [
          ...(h.exclusive > 0 ? [{ key: keyIndex(name), holder: holderIndex(h.holder), mode: "exclusive" as const }] : []),
          ...(h.shared > 0 ? [{ key: keyIndex(name), holder: holderIndex(h.holder), mode: "shared" as const }] : [])
        ])
      )
    const liveWaiters = (now: number) =>
      Array.from(model.keys.keys()).sort().flatMap((name) =>
        Model.liveKey(model, name, now).queue.map((w) => ({ key: keyIndex(name), holder: holderIndex(w.holder) }))
      )
    const pickFrom = <A>(items: ReadonlyArray<A>, pick: number | undefined): A | undefined =>
      pick === undefined || items.length === 0 ? undefined : items[pick % items.length]
    /** The command with its `pick`s replaced by the literal targets they select now. */
    const resolve = (command: Command, now: number): Command => {
      switch (command._tag) {
        case "Release": {
          const target = pickFrom(liveHolds(now), command.pick)
          return Command.Release(target ?? { key: command.key, holder: command.holder, mode: command.mode })
        }
        case "Renew": {
          const holders = liveHolds(now).filter((h, i, all) =>
            all.findIndex((o) => o.key === h.key && o.holder === h.holder) === i
          )
          return Command.Renew({
            leases: command.leases.map((l) => {
              const target = pickFrom(holders, l.pick)
              return { key: target?.key ?? l.key, holder: target?.holder ?? l.holder, leaseMs: l.leaseMs }
            })
          })
        }
        case "Cancel": {
          const target = pickFrom(liveWaiters(now), command.pick)
          return Command.Cancel(target ?? { key: command.key, holder: command.holder })
        }
        case "Replay":
          return sent.length === 0 ? command : Command.Replay({ pick: command.pick % sent.length })
        default:
          return command
      }
    }
    const compareInspect = (step: number, key: number, what: string) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const expected = Model.inspect(model, keyName(key), now)
        model = expected.state
        const actual = yield* Effect.either(backend.inspect(keyName(key)))
        yield* compare(step, what, renderStateOn("expected")(expected.result), renderEither(actual, renderStateOn("actual")))
      })

    // Each sends one request to both sides, compares, and answers with the model's result.
    const deliverAcquire = (step: number, request: AcquireRequest, now: number, what: string) =>
      Effect.gen(function*() {
        const expected = Model.acquire(model, request, now)
        model = expected.state
        const actual = yield* Effect.either(backend.acquire(request))
        yield* compare(
          step,
          `${what} result`,
          renderEither(expected.result, renderAcquireOn("expected", request.key)),
          renderEither(actual, renderAcquireOn("actual", request.key))
        )
        return expected.result
      })
    const deliverRelease = (step: number, request: ReleaseRequest, now: number, what: string) =>
      Effect.gen(function*() {
        const expected = Model.release(model, request, now)
        model = expected.state
        const actual = yield* Effect.either(backend.release(request))
        yield* compare(step, `${what} result`, renderEither(expected.result, String), renderEither(actual, String))
        return expected.result
      })
    const deliverCancel = (step: number, request: CancelRequest, now: number, what: string) =>
      Effect.gen(function*() {
        model = Model.cancel(model, request, now).state
        const actual = yield* Effect.either(backend.cancel(request))
        yield* compare(step, `${what} result`, "void", renderEither(actual, () => "void"))
      })
    const deliverForceRelease = (step: number, request: ForceReleaseRequest, now: number, what: string) =>
      Effect.gen(function*() {
        const expected = Model.forceRelease(model, request, now)
        model = expected.state
        const actual = yield* Effect.either(backend.forceRelease(request))
        yield* compare(step, `${what} result`, String(expected.result), renderEither(actual, String))
      })
    /** One latch call to both sides (the model's step, the backend's call), compared; `render` shows a success. */
    const deliverLatch = <A>(
      step: number,
      what: string,
      expected: Model.Step<Either.Either<A, InvalidLockOptions>>,
      actual: Effect.Effect<A, BackendError | InvalidLockOptions>,
      render: (a: A) => string = String
    ) =>
      Effect.gen(function*() {
        model = expected.state
        const got = yield* Effect.either(actual)
        yield* compare(step, what, renderEither(expected.result, render), renderEither(got, render))
      })
    const compareLatchCount = (step: number, key: number, what: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        deliverLatch(
          step,
          what,
          Model.latchCount(model, latchName(key), now),
          backend.latchCount(latchName(key)),
          (n) => `count=${n}`
        ))
    const deliverLatchSetCount = (step: number, request: SetCountRequest, now: number, what: string) =>
      deliverLatch(step, `${what} result`, Model.latchSetCount(model, request, now), backend.latchSetCount(request))
    const deliverLatchCountDown = (step: number, request: LatchRequest, now: number, what: string) =>
      deliverLatch(step, `${what} result`, Model.latchCountDown(model, request, now), backend.latchCountDown(request))
    const redeliver = (step: number, item: Sent, now: number): Effect.Effect<void, Divergence> => {
      const what = `replayed ${item._tag.toLowerCase()}`
      switch (item._tag) {
        case "Acquire":
          return Effect.asVoid(deliverAcquire(step, item.request, now, what))
        case "Release":
          return Effect.asVoid(deliverRelease(step, item.request, now, what))
        case "Cancel":
          return deliverCancel(step, item.request, now, what)
        case "ForceRelease":
          return deliverForceRelease(step, item.request, now, what)
        case "LatchSetCount":
          return deliverLatchSetCount(step, item.request, now, what)
        case "LatchCountDown":
          return deliverLatchCountDown(step, item.request, now, what)
      }
    }

    const steps = Effect.gen(function*() {
      for (const [step, original] of commands.entries()) {
        const now = yield* Clock.currentTimeMillis
        const command = resolve(original, now)
        resolved.push(command)
        switch (command._tag) {
          case "Advance": {
            yield* advance(command.ms)
            break
          }
          case "Acquire": {
            const counts = believedOf(command.key, command.holder)
            const request: AcquireRequest = {
              key: keyName(command.key),
              holder: holderName(command.key, command.holder),
              mode: command.mode,
              permits: command.permits,
              limit: command.limit,
              leaseMs: command.leaseMs,
              fair: command.fair,
              waiterTtlMs: command.waiterTtlMs,
              count: counts[command.mode] + 1
            }
            sent.push({ _tag: "Acquire", request })
            const result = yield* deliverAcquire(step, request, now, "acquire")
            if (Either.isRight(result) && result.right._tag === "Granted") counts[command.mode] = request.count
            // the hold it meant to re-enter is gone: the client starts afresh
            if (Either.isLeft(result) && result.left._tag === "NotHeld") retire(command.key, command.holder)
            break
          }
          case "Release": {
            const counts = believedOf(command.key, command.holder)
            const request: ReleaseRequest = {
              key: keyName(command.key),
              holder: holderName(command.key, command.holder),
              mode: command.mode,
              count: Math.max(1, counts[command.mode]),
              leaseMs: endedMs
            }
            sent.push({ _tag: "Release", request })
            const result = yield* deliverRelease(step, request, now, "release")
            if (Either.isRight(result)) counts[command.mode] = result.right
            if (Either.isLeft(result) || (counts.exclusive === 0 && counts.shared === 0)) retire(command.key, command.holder)
            break
          }
          case "Renew": {
            const requests = command.leases.map((l) => ({
              key: keyName(l.key),
              holder: holderName(l.key, l.holder),
              leaseMs: l.leaseMs
            }))
            const expected = Model.renew(model, requests, now)
            model = expected.state
            const actual = yield* Effect.either(backend.renew(requests))
            yield* compare(step, "renew result", renderRenew(expected.result), renderEither(actual, renderRenew))
            break
          }
          case "Inspect": {
            yield* compareInspect(step, command.key, `inspect ${keyLabel(command.key)}`)
            break
          }
          case "ForceRelease": {
            const request: ForceReleaseRequest = { key: keyName(command.key), id: `force-${step}` }
            sent.push({ _tag: "ForceRelease", request })
            yield* deliverForceRelease(step, request, now, "forceRelease")
            for (const [name] of believed) {
              const [key, holder] = name.split("/").map(Number) as [number, number]
              if (key === command.key) retire(key, holder)
            }
            break
          }
          case "Cancel": {
            const request: CancelRequest = {
              key: keyName(command.key),
              holder: holderName(command.key, command.holder),
              leaseMs: endedMs
            }
            const held = Model.liveKey(model, request.key, now).holders.some((h) => h.holder === request.holder)
            sent.push({ _tag: "Cancel", request })
            yield* deliverCancel(step, request, now, "cancel")
            if (!held) retire(command.key, command.holder)
            break
          }
          case "LatchSetCount": {
            const request: SetCountRequest = { key: latchName(command.key), id: `latch-${step}`, count: command.count }
            sent.push({ _tag: "LatchSetCount", request })
            yield* deliverLatchSetCount(step, request, now, "latchSetCount")
            break
          }
          case "LatchCountDown": {
            const request: LatchRequest = { key: latchName(command.key), id: `latch-${step}` }
            sent.push({ _tag: "LatchCountDown", request })
            yield* deliverLatchCountDown(step, request, now, "latchCountDown")
            break
          }
          case "LatchCount": {
            yield* compareLatchCount(step, command.key, `latchCount l${command.key}`)
            break
          }
          case "Replay": {
            const item = sent[command.pick]
            if (item !== undefined) yield* redeliver(step, item, now)
            break
          }
        }
        if (options.inspectEveryStep !== false && command._tag !== "Inspect") {
          for (const key of inspectedKeys) {
            yield* compareInspect(step, key, `state of ${keyLabel(key)} after the step`)
          }
          if (command._tag !== "LatchCount") {
            for (const key of latchKeys) yield* compareLatchCount(step, key, `count of l${key} after the step`)
          }
        }
      }
    })
    // Leave nothing held or queued behind on a shared backend, whatever the outcome.
    const cleanup = Effect.forEach(
      inspectedKeys,
      (key) =>
        Effect.ignore(Effect.gen(function*() {
          const state = yield* backend.inspect(keyName(key))
          yield* Effect.forEach(
            state.queue,
            (w) => backend.cancel({ key: keyName(key), holder: w.holder, leaseMs: 1 }),
            { discard: true }
          )
          yield* backend.forceRelease({ key: keyName(key), id: crypto.randomUUID() })
        })),
      { discard: true }
    )
    // and no latch left counting
    const latchCleanup = Effect.forEach(
      latchKeys,
      (key) =>
        Effect.ignore(
          // a fresh id per call: a repeated id would be a copy, which counts nothing
          Effect.suspend(() => backend.latchCountDown({ key: latchName(key), id: crypto.randomUUID() })).pipe(
            Effect.repeat({ until: (n) => n === 0 })
          )
        ),
      { discard: true }
    )
    yield* Effect.ensuring(steps, Effect.zipRight(cleanup, latchCleanup))
  })
