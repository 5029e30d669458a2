/**
 * One model-based run: a command sequence against the model and a backend side by side, every
 * result compared.
 */
import { Clock, Effect, Either } from "effect"
import type {
  AcquireRequest,
  AcquireResult,
  CancelRequest,
  ForceReleaseRequest,
  KeyState,
  LatchRequest,
  ReleaseRequest,
  RenewResult,
  Service,
  SetCountRequest
} from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import * as Model from "../Model.js"
import type { Divergence, ExecuteOptions } from "./modelCheck.js"
import { agreeWithin, Command, keyLabel, renderEither, renderError, toleranceOf } from "./modelCheck.js"

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

/** Which side a rendering is of: the model's (`expected`) or the backend's (`actual`). */
type Side = "expected" | "actual"

/**
 * The run's holders. A holder of the pool is a client's holder identity on one key. Once it ends
 * (its last release, leaving the queue, a forced release, a lost hold) the client takes a fresh
 * identity, as the lock API does: `generation` counts them. `believed` is the client's view of its
 * counts, so a re-entry after a silent loss is sent as the lock API would send it.
 */
class HolderPool {
  private static readonly stride = 1000
  private readonly generations = new Map<string, number>()
  private readonly believed = new Map<string, { exclusive: number; shared: number }>()
  constructor(private readonly clientId: string) {}

  private slot(key: number, holder: number): string {
    return `${key}/${holder}`
  }
  /** The backend's name of pool holder `holder` on pool key `key`, in its current generation. */
  name(key: number, holder: number): string {
    return `${this.clientId}:${holder + 1 + HolderPool.stride * (this.generations.get(this.slot(key, holder)) ?? 0)}`
  }
  /** The client's view of the holder's counts (made at 0 on first use). */
  believedOf(key: number, holder: number): { exclusive: number; shared: number } {
    let counts = this.believed.get(this.slot(key, holder))
    if (counts === undefined) {
      counts = { exclusive: 0, shared: 0 }
      this.believed.set(this.slot(key, holder), counts)
    }
    return counts
  }
  /** The holder ended: the next call takes a fresh identity. */
  retire(key: number, holder: number): void {
    this.generations.set(this.slot(key, holder), (this.generations.get(this.slot(key, holder)) ?? 0) + 1)
    this.believed.delete(this.slot(key, holder))
  }
  /** Retires every holder the client believes holds something on `key` (a forced release). */
  retireAll(key: number): void {
    for (const [name] of this.believed) {
      const [k, holder] = name.split("/").map(Number) as [number, number]
      if (k === key) this.retire(k, holder)
    }
  }
  private number(name: string): number {
    return Number(name.slice(this.clientId.length + 1)) - 1
  }
  /** The pool index of a holder name. */
  index(name: string): number {
    return this.number(name) % HolderPool.stride
  }
  /** `h<index>`, with `'<generation>` after the first: how reports name holders. */
  label(name: string): string {
    if (!name.startsWith(`${this.clientId}:`)) return name
    const generation = Math.floor(this.number(name) / HolderPool.stride)
    return `h${this.index(name)}${generation === 0 ? "" : `'${generation}`}`
  }
}

/**
 * Fences differ between backends (a counter, a clock): each side's are compared as their rank on
 * the key, and checked to go up with every new grant (failures are kept until `takeFailures`).
 */
class FenceRanks {
  private readonly ranks = { expected: new Map<string, Map<number, number>>(), actual: new Map<string, Map<number, number>>() }
  private readonly failures: Array<string> = []

  /** `#<rank>` of `fence` among the fences `side` issued on `key`. */
  rankOf(side: Side, key: string, fence: number): string {
    let seen = this.ranks[side].get(key)
    if (seen === undefined) {
      seen = new Map()
      this.ranks[side].set(key, seen)
    }
    let rank = seen.get(fence)
    if (rank === undefined) {
      const highest = Math.max(0, ...seen.keys())
      if (fence <= highest) this.failures.push(`${side} fence ${fence} issued after ${highest}`)
      rank = seen.size + 1
      seen.set(fence, rank)
    }
    return `#${rank}`
  }
  fail(failure: string): void {
    this.failures.push(failure)
  }
  takeFailures(): ReadonlyArray<string> {
    return this.failures.splice(0)
  }
}

/** The keys of the commands' pool (locks) and of their latch pool, each sorted. */
const poolKeys = (commands: ReadonlyArray<Command>) => {
  const sorted = (keys: Iterable<number>) => Array.from(new Set(keys)).sort((a, b) => a - b)
  return {
    locks: sorted(commands.flatMap((c) =>
      c._tag === "Advance" || c._tag === "Replay" || c._tag.startsWith("Latch")
        ? []
        : c._tag === "Renew"
        ? c.leases.map((l) => l.key)
        : [c.key]
    )),
    latches: sorted(commands.flatMap((c) => (c._tag === "LatchSetCount" || c._tag === "LatchCountDown" || c._tag === "LatchCount" ? [c.key] : [])))
  }
}

const pickFrom = <A>(items: ReadonlyArray<A>, pick: number | undefined): A | undefined =>
  pick === undefined || items.length === 0 ? undefined : items[pick % items.length]

/**
 * One run of a command sequence: the model's state beside the backend, the commands run so far
 * (with their `pick`s resolved) and the requests sent, for `Replay`. Each `deliver*` sends one
 * request to both sides, compares the results and answers with the model's.
 */
class ModelRun {
  readonly toleranceMs: number | undefined
  readonly advance: (ms: number) => Effect.Effect<void>
  /** Fresh keys per sequence, unique across processes sharing a server (whatever Random is seeded with). */
  readonly prefix: string
  /**
   * How long ended holders are remembered: short under exact timing so that forgetting is
   * exercised, far beyond the tolerance in live timing so that no comparison straddles it.
   */
  readonly endedMs: number
  readonly holders: HolderPool
  readonly fences = new FenceRanks()
  readonly keys: { readonly locks: ReadonlyArray<number>; readonly latches: ReadonlyArray<number> }
  model = Model.empty
  readonly resolved: Array<Command> = []
  readonly sent: Array<Sent> = []

  constructor(readonly backend: Service, readonly commands: ReadonlyArray<Command>, readonly options: ExecuteOptions) {
    const toleranceMs = toleranceOf(options.timing)
    this.toleranceMs = toleranceMs
    this.advance = options.advance ??
      (toleranceMs === undefined
        ? () => Effect.dieMessage("ModelCheck: exact timing needs `advance` to move the backend's clock")
        : (ms: number) => Effect.sleep(ms))
    this.prefix = `${options.keyPrefix ?? "lockstep-model"}:${crypto.randomUUID()}`
    this.endedMs = toleranceMs === undefined ? 100 : 600_000
    this.holders = new HolderPool(backend.clientId)
    this.keys = poolKeys(commands)
  }

  keyName(key: number): string {
    return `${this.prefix}:k${key}`
  }
  latchName(key: number): string {
    return `${this.prefix}:l${key}`
  }
  /** The pool index of a key name. */
  private keyIndex(name: string): number {
    return Number(name.slice(this.prefix.length + 2))
  }

  compare(step: number, what: string, expected: string, actual: string): Effect.Effect<void, Divergence> {
    const fences = this.fences.takeFailures()
    if (fences.length > 0) {
      return Effect.fail({ commands: this.resolved, step, what, expected: "fences that only go up", actual: fences.join("; ") })
    }
    const toleranceMs = this.toleranceMs
    return (toleranceMs === undefined ? expected === actual : agreeWithin(expected, actual, toleranceMs))
      ? Effect.void
      : Effect.fail({
        commands: this.resolved,
        step,
        what,
        expected,
        actual,
        ...(toleranceMs === undefined ? {} : { toleranceMs })
      })
  }

  renderAcquire(side: Side, key: string): (result: AcquireResult) => string {
    return (result) =>
      result._tag === "Granted"
        ? `Granted(fence=${this.fences.rankOf(side, key, result.fence)}, count=${result.count})`
        : `Denied(retryAfterMs=${result.retryAfterMs})`
  }

  renderState(side: Side): (state: KeyState) => string {
    return (state) => {
      const holders = state.holders
        .map((h) =>
          `${this.holders.label(h.holder)}{x=${h.exclusive} s=${h.shared} permits=${h.permits} fence=${
            this.fences.rankOf(side, state.key, h.fence)
          } ttl=${h.ttlMs}}`
        )
        .sort()
      if (state.fence !== 0 && state.holders.some((h) => h.fence > state.fence)) {
        this.fences.fail(`${side} key fence ${state.fence} below a holder's fence`)
      }
      const queue = state.queue.map((w) => `${this.holders.label(w.holder)}{ttl=${w.ttlMs}}`)
      const key = state.key.startsWith(`${this.prefix}:`) ? state.key.slice(this.prefix.length + 1) : state.key
      return `${key} limit=${state.limit ?? "none"} holders=[${holders.join(" ")}] queue=[${queue.join(" ")}]`
    }
  }

  /** Live holds of the model, as pool indices, for `pick`. */
  private liveHolds(now: number) {
    return Array.from(this.model.keys.keys()).sort().flatMap((name) =>
      Model.liveKey(this.model, name, now).holders.flatMap((h) => [
        ...(h.exclusive > 0 ? [{ key: this.keyIndex(name), holder: this.holders.index(h.holder), mode: "exclusive" as const }] : []),
        ...(h.shared > 0 ? [{ key: this.keyIndex(name), holder: this.holders.index(h.holder), mode: "shared" as const }] : [])
      ])
    )
  }

  /** Live queue entries of the model, as pool indices, for `pick`. */
  private liveWaiters(now: number) {
    return Array.from(this.model.keys.keys()).sort().flatMap((name) =>
      Model.liveKey(this.model, name, now).queue.map((w) => ({ key: this.keyIndex(name), holder: this.holders.index(w.holder) }))
    )
  }

  /** The command with its `pick`s replaced by the literal targets they select now. */
  resolve(command: Command, now: number): Command {
    switch (command._tag) {
      case "Release": {
        const target = pickFrom(this.liveHolds(now), command.pick)
        return Command.Release(target ?? { key: command.key, holder: command.holder, mode: command.mode })
      }
      case "Renew": {
        const holders = this.liveHolds(now).filter((h, i, all) =>
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
        const target = pickFrom(this.liveWaiters(now), command.pick)
        return Command.Cancel(target ?? { key: command.key, holder: command.holder })
      }
      case "Replay":
        return this.sent.length === 0 ? command : Command.Replay({ pick: command.pick % this.sent.length })
      default:
        return command
    }
  }

  compareInspect(step: number, key: number, what: string): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      const now = yield* Clock.currentTimeMillis
      const expected = Model.inspect(this.model, this.keyName(key), now)
      this.model = expected.state
      const actual = yield* Effect.either(this.backend.inspect(this.keyName(key)))
      yield* this.compare(step, what, this.renderState("expected")(expected.result), renderEither(actual, this.renderState("actual")))
    })
  }

  deliverAcquire(step: number, request: AcquireRequest, now: number, what: string) {
    return Effect.gen(this, function*() {
      const expected = Model.acquire(this.model, request, now)
      this.model = expected.state
      const actual = yield* Effect.either(this.backend.acquire(request))
      yield* this.compare(
        step,
        `${what} result`,
        renderEither(expected.result, this.renderAcquire("expected", request.key)),
        renderEither(actual, this.renderAcquire("actual", request.key))
      )
      return expected.result
    })
  }

  deliverRelease(step: number, request: ReleaseRequest, now: number, what: string) {
    return Effect.gen(this, function*() {
      const expected = Model.release(this.model, request, now)
      this.model = expected.state
      const actual = yield* Effect.either(this.backend.release(request))
      yield* this.compare(step, `${what} result`, renderEither(expected.result, String), renderEither(actual, String))
      return expected.result
    })
  }

  deliverCancel(step: number, request: CancelRequest, now: number, what: string): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      this.model = Model.cancel(this.model, request, now).state
      const actual = yield* Effect.either(this.backend.cancel(request))
      yield* this.compare(step, `${what} result`, "void", renderEither(actual, () => "void"))
    })
  }

  deliverForceRelease(step: number, request: ForceReleaseRequest, now: number, what: string): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      const expected = Model.forceRelease(this.model, request, now)
      this.model = expected.state
      const actual = yield* Effect.either(this.backend.forceRelease(request))
      yield* this.compare(step, `${what} result`, String(expected.result), renderEither(actual, String))
    })
  }

  /** One latch call to both sides (the model's step, the backend's call), compared; `render` shows a success. */
  deliverLatch<A>(
    step: number,
    what: string,
    expected: Model.Step<Either.Either<A, InvalidLockOptions>>,
    actual: Effect.Effect<A, BackendError | InvalidLockOptions>,
    render: (a: A) => string = String
  ): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      this.model = expected.state
      const got = yield* Effect.either(actual)
      yield* this.compare(step, what, renderEither(expected.result, render), renderEither(got, render))
    })
  }

  compareLatchCount(step: number, key: number, what: string): Effect.Effect<void, Divergence> {
    return Effect.flatMap(Clock.currentTimeMillis, (now) =>
      this.deliverLatch(
        step,
        what,
        Model.latchCount(this.model, this.latchName(key), now),
        this.backend.latchCount(this.latchName(key)),
        (n) => `count=${n}`
      ))
  }

  deliverLatchSetCount(step: number, request: SetCountRequest, now: number, what: string): Effect.Effect<void, Divergence> {
    return this.deliverLatch(step, `${what} result`, Model.latchSetCount(this.model, request, now), this.backend.latchSetCount(request))
  }

  deliverLatchCountDown(step: number, request: LatchRequest, now: number, what: string): Effect.Effect<void, Divergence> {
    return this.deliverLatch(step, `${what} result`, Model.latchCountDown(this.model, request, now), this.backend.latchCountDown(request))
  }

  redeliver(step: number, item: Sent, now: number): Effect.Effect<void, Divergence> {
    const what = `replayed ${item._tag.toLowerCase()}`
    switch (item._tag) {
      case "Acquire":
        return Effect.asVoid(this.deliverAcquire(step, item.request, now, what))
      case "Release":
        return Effect.asVoid(this.deliverRelease(step, item.request, now, what))
      case "Cancel":
        return this.deliverCancel(step, item.request, now, what)
      case "ForceRelease":
        return this.deliverForceRelease(step, item.request, now, what)
      case "LatchSetCount":
        return this.deliverLatchSetCount(step, item.request, now, what)
      case "LatchCountDown":
        return this.deliverLatchCountDown(step, item.request, now, what)
    }
  }

  /** An acquire as the lock API would send it (its count the client's believed count + 1). */
  acquire(step: number, command: Extract<Command, { _tag: "Acquire" }>, now: number): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      const counts = this.holders.believedOf(command.key, command.holder)
      const request: AcquireRequest = {
        key: this.keyName(command.key),
        holder: this.holders.name(command.key, command.holder),
        mode: command.mode,
        permits: command.permits,
        limit: command.limit,
        leaseMs: command.leaseMs,
        fair: command.fair,
        waiterTtlMs: command.waiterTtlMs,
        count: counts[command.mode] + 1
      }
      this.sent.push({ _tag: "Acquire", request })
      const result = yield* this.deliverAcquire(step, request, now, "acquire")
      if (Either.isRight(result) && result.right._tag === "Granted") counts[command.mode] = request.count
      // the hold it meant to re-enter is gone: the client starts afresh
      if (Either.isLeft(result) && result.left._tag === "NotHeld") this.holders.retire(command.key, command.holder)
    })
  }

  /** A release from the client's believed count. */
  release(step: number, command: Extract<Command, { _tag: "Release" }>, now: number): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      const counts = this.holders.believedOf(command.key, command.holder)
      const request: ReleaseRequest = {
        key: this.keyName(command.key),
        holder: this.holders.name(command.key, command.holder),
        mode: command.mode,
        count: Math.max(1, counts[command.mode]),
        leaseMs: this.endedMs
      }
      this.sent.push({ _tag: "Release", request })
      const result = yield* this.deliverRelease(step, request, now, "release")
      if (Either.isRight(result)) counts[command.mode] = result.right
      if (Either.isLeft(result) || (counts.exclusive === 0 && counts.shared === 0)) this.holders.retire(command.key, command.holder)
    })
  }

  renew(step: number, command: Extract<Command, { _tag: "Renew" }>, now: number): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      const requests = command.leases.map((l) => ({
        key: this.keyName(l.key),
        holder: this.holders.name(l.key, l.holder),
        leaseMs: l.leaseMs
      }))
      const expected = Model.renew(this.model, requests, now)
      this.model = expected.state
      const actual = yield* Effect.either(this.backend.renew(requests))
      yield* this.compare(step, "renew result", renderRenew(expected.result), renderEither(actual, renderRenew))
    })
  }

  cancel(step: number, command: Extract<Command, { _tag: "Cancel" }>, now: number): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      const request: CancelRequest = {
        key: this.keyName(command.key),
        holder: this.holders.name(command.key, command.holder),
        leaseMs: this.endedMs
      }
      const held = Model.liveKey(this.model, request.key, now).holders.some((h) => h.holder === request.holder)
      this.sent.push({ _tag: "Cancel", request })
      yield* this.deliverCancel(step, request, now, "cancel")
      if (!held) this.holders.retire(command.key, command.holder)
    })
  }

  /** Runs one (resolved) command on both sides. */
  run(step: number, command: Command, now: number): Effect.Effect<void, Divergence> {
    switch (command._tag) {
      case "Advance":
        return this.advance(command.ms)
      case "Acquire":
        return this.acquire(step, command, now)
      case "Release":
        return this.release(step, command, now)
      case "Renew":
        return this.renew(step, command, now)
      case "Inspect":
        return this.compareInspect(step, command.key, `inspect ${keyLabel(command.key)}`)
      case "ForceRelease": {
        const request: ForceReleaseRequest = { key: this.keyName(command.key), id: `force-${step}` }
        this.sent.push({ _tag: "ForceRelease", request })
        return Effect.zipRight(
          this.deliverForceRelease(step, request, now, "forceRelease"),
          Effect.sync(() => this.holders.retireAll(command.key))
        )
      }
      case "Cancel":
        return this.cancel(step, command, now)
      case "LatchSetCount": {
        const request: SetCountRequest = { key: this.latchName(command.key), id: `latch-${step}`, count: command.count }
        this.sent.push({ _tag: "LatchSetCount", request })
        return this.deliverLatchSetCount(step, request, now, "latchSetCount")
      }
      case "LatchCountDown": {
        const request: LatchRequest = { key: this.latchName(command.key), id: `latch-${step}` }
        this.sent.push({ _tag: "LatchCountDown", request })
        return this.deliverLatchCountDown(step, request, now, "latchCountDown")
      }
      case "LatchCount":
        return this.compareLatchCount(step, command.key, `latchCount l${command.key}`)
      case "Replay": {
        const item = this.sent[command.pick]
        return item === undefined ? Effect.void : this.redeliver(step, item, now)
      }
    }
  }

  /** Every command in turn, each followed (unless told otherwise) by a comparison of every key. */
  get steps(): Effect.Effect<void, Divergence> {
    return Effect.gen(this, function*() {
      for (const [step, original] of this.commands.entries()) {
        const now = yield* Clock.currentTimeMillis
        const command = this.resolve(original, now)
        this.resolved.push(command)
        yield* this.run(step, command, now)
        if (this.options.inspectEveryStep !== false && command._tag !== "Inspect") {
          for (const key of this.keys.locks) {
            yield* this.compareInspect(step, key, `state of ${keyLabel(key)} after the step`)
          }
          if (command._tag !== "LatchCount") {
            for (const key of this.keys.latches) yield* this.compareLatchCount(step, key, `count of l${key} after the step`)
          }
        }
      }
    })
  }

  /** Leaves nothing held or queued behind on a shared backend, and no latch left counting. */
  get cleanup(): Effect.Effect<void> {
    const backend = this.backend
    const locks = Effect.forEach(
      this.keys.locks,
      (key) =>
        Effect.ignore(Effect.gen(this, function*() {
          const state = yield* backend.inspect(this.keyName(key))
          yield* Effect.forEach(
            state.queue,
            (w) => backend.cancel({ key: this.keyName(key), holder: w.holder, leaseMs: 1 }),
            { discard: true }
          )
          yield* backend.forceRelease({ key: this.keyName(key), id: crypto.randomUUID() })
        })),
      { discard: true }
    )
    const latches = Effect.forEach(
      this.keys.latches,
      (key) =>
        Effect.ignore(
          // a fresh id per call: a repeated id would be a copy, which counts nothing
          Effect.suspend(() => backend.latchCountDown({ key: this.latchName(key), id: crypto.randomUUID() })).pipe(
            Effect.repeat({ until: (n) => n === 0 })
          )
        ),
      { discard: true }
    )
    return Effect.zipRight(locks, latches)
  }
}

/** Runs `commands` against the model and the current backend side by side; fails at the first disagreement. */
export const execute = (
  commands: ReadonlyArray<Command>,
  options: ExecuteOptions
): Effect.Effect<void, Divergence, LockBackend> =>
  Effect.flatMap(LockBackend, (backend) => {
    const run = new ModelRun(backend, commands, options)
    return Effect.ensuring(run.steps, run.cleanup)
  })
