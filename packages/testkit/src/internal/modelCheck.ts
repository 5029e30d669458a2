/**
 * Running command sequences against the model and a backend side by side.
 *
 * @since 0.1.0
 * @internal
 */
import { Clock, Data, Effect, Either } from "effect"
import type { AcquireRequest, AcquireResult, HoldMode, KeyState } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
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
    Advance: (c) => `advance ${c.ms}ms`
  })

const renderError = (error: { readonly _tag: string; readonly message: string; readonly field?: string }): string => {
  switch (error._tag) {
    case "InvalidLockOptions":
      return `InvalidLockOptions(${error.field ?? "?"})`
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

const renderAcquire = (result: AcquireResult): string =>
  result._tag === "Granted"
    ? `Granted(fence=${result.fence}, count=${result.count})`
    : `Denied(retryAfterMs=${result.retryAfterMs})`

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
    const holderName = (holder: number): string => `${backend.clientId}:${holder + 1}`
    const holderLabel = (name: string): string =>
      name.startsWith(`${backend.clientId}:`) ? `h${Number(name.slice(backend.clientId.length + 1)) - 1}` : name
    const renderState = (state: KeyState): string => {
      const holders = state.holders
        .map((h) =>
          `${holderLabel(h.holder)}{x=${h.exclusive} s=${h.shared} permits=${h.permits} fence=${h.fence} ttl=${h.ttlMs}}`
        )
        .sort()
      const queue = state.queue.map((w) => `${holderLabel(w.holder)}{ttl=${w.ttlMs}}`)
      const key = state.key.startsWith(`${prefix}:`) ? state.key.slice(prefix.length + 1) : state.key
      return `${key} fence=${state.fence} limit=${state.limit ?? "none"} holders=[${holders.join(" ")}] queue=[${
        queue.join(" ")
      }]`
    }
    const inspectedKeys = Array.from(
      new Set(
        commands.flatMap((c) =>
          c._tag === "Advance" ? [] : c._tag === "Renew" ? c.leases.map((l) => l.key) : [c.key]
        )
      )
    ).sort((a, b) => a - b)

    let model = Model.empty
    const resolved: Array<Command> = []
    const compare = (step: number, what: string, expected: string, actual: string) =>
      (toleranceMs === undefined ? expected === actual : agreeWithin(expected, actual, toleranceMs))
        ? Effect.void
        : Effect.fail<Divergence>({
          commands: resolved,
          step,
          what,
          expected,
          actual,
          ...(toleranceMs === undefined ? {} : { toleranceMs })
        })

    // Live holds and queue entries of the model, as pool indices, for `pick`.
    const keyIndex = (name: string): number => Number(name.slice(prefix.length + 2))
    const holderIndex = (name: string): number => Number(name.slice(backend.clientId.length + 1)) - 1
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
        yield* compare(step, what, renderState(expected.result), renderEither(actual, renderState))
      })

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
            const request: AcquireRequest = {
              key: keyName(command.key),
              holder: holderName(command.holder),
              mode: command.mode,
              permits: command.permits,
              limit: command.limit,
              leaseMs: command.leaseMs,
              fair: command.fair,
              waiterTtlMs: command.waiterTtlMs
            }
            const expected = Model.acquire(model, request, now)
            model = expected.state
            const actual = yield* Effect.either(backend.acquire(request))
            yield* compare(
              step,
              "acquire result",
              renderEither(expected.result, renderAcquire),
              renderEither(actual, renderAcquire)
            )
            break
          }
          case "Release": {
            const request = { key: keyName(command.key), holder: holderName(command.holder), mode: command.mode }
            const expected = Model.release(model, request, now)
            model = expected.state
            const actual = yield* Effect.either(backend.release(request))
            yield* compare(step, "release result", renderEither(expected.result, String), renderEither(actual, String))
            break
          }
          case "Renew": {
            const requests = command.leases.map((l) => ({
              key: keyName(l.key),
              holder: holderName(l.holder),
              leaseMs: l.leaseMs
            }))
            const expected = Model.renew(model, requests, now)
            model = expected.state
            const actual = yield* Effect.either(backend.renew(requests))
            const render = (results: ReadonlyArray<boolean>) => `[${results.join(", ")}]`
            yield* compare(step, "renew result", render(expected.result), renderEither(actual, render))
            break
          }
          case "Inspect": {
            yield* compareInspect(step, command.key, `inspect ${keyLabel(command.key)}`)
            break
          }
          case "ForceRelease": {
            const expected = Model.forceRelease(model, keyName(command.key), now)
            model = expected.state
            const actual = yield* Effect.either(backend.forceRelease(keyName(command.key)))
            yield* compare(step, "forceRelease result", String(expected.result), renderEither(actual, String))
            break
          }
          case "Cancel": {
            const expected = Model.cancel(model, keyName(command.key), holderName(command.holder), now)
            model = expected.state
            const actual = yield* Effect.either(backend.cancel(keyName(command.key), holderName(command.holder)))
            yield* compare(step, "cancel result", "void", renderEither(actual, () => "void"))
            break
          }
        }
        if (options.inspectEveryStep !== false && command._tag !== "Inspect") {
          for (const key of inspectedKeys) {
            yield* compareInspect(step, key, `state of ${keyLabel(key)} after the step`)
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
          yield* Effect.forEach(state.queue, (w) => backend.cancel(keyName(key), w.holder), { discard: true })
          yield* backend.forceRelease(keyName(key))
        })),
      { discard: true }
    )
    yield* Effect.ensuring(steps, cleanup)
  })
