import { Duration, Effect, ExecutionStrategy, Exit, Option, Scope } from "effect"
import type { Lease, LeaseState } from "../Lease.js"
import type { LockLost } from "../LockError.js"
import { InvalidLockOptions, LockTimeout } from "../LockError.js"
import { monotonicMillis } from "./time.js"
import type { AttemptError, LeaseRequest, Waiting } from "./acquisition.js"
import { scopedLease } from "./acquisition.js"
import { whileHeld } from "./criticalSection.js"
import type { LockSpec, Restore, Retry } from "./spec.js"

/**
 * The order every multi-lock takes its parts in: by key, a write view before a read view of the
 * same key, then as given. Two multi-locks over overlapping sets try the shared parts in the same
 * order, so neither grabs what the other waits for first.
 */
export const canonicalOrder = (specs: ReadonlyArray<LockSpec>): ReadonlyArray<LockSpec> =>
  specs
    .map((spec, index) => ({ spec, index }))
    .sort((a, b) =>
      a.spec.key < b.spec.key ? -1 : a.spec.key > b.spec.key ? 1 : a.spec.mode !== b.spec.mode
        ? (a.spec.mode === "exclusive" ? -1 : 1)
        : a.index - b.index
    )
    .map(({ spec }) => spec)

/** Why a list of parts cannot make a multi-lock, if it cannot. */
export const invalidParts = (specs: ReadonlyArray<LockSpec>): InvalidLockOptions | undefined => {
  if (specs.length === 0) return new InvalidLockOptions({ field: "locks", reason: "a multi-lock needs at least one lock" })
  for (const [i, spec] of specs.entries()) {
    const same = specs.findIndex((other) => other.backend === spec.backend && other.key === spec.key)
    if (same !== i && specs[same]!.mode !== spec.mode) {
      return new InvalidLockOptions({
        field: "locks",
        reason: `the read and the write view of "${spec.key}" cannot be parts of one multi-lock: a holder cannot take both at once`
      })
    }
  }
  return undefined
}

/** The parts' leases, in canonical order, and the scope they are bound to. */
export interface Parts {
  readonly leases: ReadonlyArray<Lease>
  readonly scope: Scope.CloseableScope
}

type Round = { readonly _tag: "Held" } | { readonly _tag: "Busy"; readonly index: number }

/** How long a multi-lock waits for a part while it holds the parts before it. */
export const holdWhileWaitingMs = 1_000

/** A part's request: wait up to `waitMs` for it, or (`waitMs` 0, a part it only tries) one attempt. */
const partRequest = (spec: LockSpec, waitMs: number, retry: Retry): LeaseRequest => ({
  spec,
  permits: 1,
  singleAttempt: waitMs === 0,
  timeoutMs: waitMs,
  retry
})

/**
 * Takes every part, or none. A round takes the parts in canonical order: it waits for the first
 * holding nothing, and for each next one up to `holdWhileWaitingMs` while holding the ones before
 * it (ordered, so two multi-locks never wait for each other in a cycle, and the one that holds the
 * first part they share goes on). When that bound passes (a part held long, by a lock or another
 * multi-lock), the round releases what it took and the next one waits for that part holding
 * nothing; once granted it keeps it, tries the parts before it without waiting (one busy: release
 * all, wait for that one) and goes on in order. So no part is held for longer than the bound while
 * another is awaited. A single attempt is a single round that waits for nothing. The parts are
 * bound to a scope forked from `into`; a failure or an interruption at any point closes it,
 * releasing every part taken.
 */
export const acquireAll = (
  specs: ReadonlyArray<LockSpec>,
  waiting: Waiting,
  into: Scope.Scope
): Effect.Effect<Option.Option<Parts>, AttemptError | LockTimeout> =>
  Effect.uninterruptibleMask((restore) => takeAll(specs, waiting, into, restore))

/**
 * `acquireAll` for a caller that runs uninterruptibly already: `restore` is where it may be
 * interrupted (the waiting, between attempts), as for a single lock.
 */
const takeAll = (
  specs: ReadonlyArray<LockSpec>,
  waiting: Waiting,
  into: Scope.Scope,
  restore: Restore
): Effect.Effect<Option.Option<Parts>, AttemptError | LockTimeout> =>
  Effect.gen(function*() {
    const { retry, singleAttempt, timeoutMs } = waiting
    const startedAt = yield* monotonicMillis
    // the part the next round waits for first, holding nothing; none: the first in order
    let waitFor: number | undefined = undefined
    while (true) {
      const now = yield* monotonicMillis
      // how long the caller may still wait (0 for a single round: every part is only tried)
      const left = singleAttempt ? 0 : timeoutMs - (now - startedAt)
      if (!singleAttempt && left <= 0) {
        return yield* new LockTimeout({ key: specs[waitFor ?? 0]!.key, timeout: Duration.millis(timeoutMs) })
      }
      const scope = yield* Scope.fork(into, ExecutionStrategy.sequential)
      const leases: Array<Lease | undefined> = specs.map(() => undefined)
      const busy = (index: number): Round => ({ _tag: "Busy", index })
      /** Waits up to `waitMs` for part `index` (0: try once); `false` if it was not granted. */
      const take = (index: number, waitMs: number) =>
        Effect.map(
          Effect.catchTag(scopedLease(partRequest(specs[index]!, waitMs, retry)), "LockTimeout", (e) =>
            // the bound passed, not the caller's timeout: the next round sees to that
            waitMs !== left ? Effect.succeedNone : Effect.fail(e)),
          (lease) => {
            if (Option.isSome(lease)) leases[index] = lease.value
            return Option.isSome(lease)
          }
        )
      const bounded = Math.min(left, holdWhileWaitingMs)
      const round = Effect.gen(function*() {
        if (waitFor !== undefined && !(yield* take(waitFor, left))) return busy(waitFor)
        for (let index = 0; index < specs.length; index++) {
          if (index === waitFor) continue
          // nothing held yet: wait as long as the caller does; before the awaited part: try only
          const waitMs = index === 0 && waitFor === undefined ? left : index < (waitFor ?? 0) ? 0 : bounded
          if (!(yield* take(index, waitMs))) return busy(index)
        }
        return { _tag: "Held" } as Round
      }).pipe(
        Scope.extend(scope),
        Effect.catchTag("LockTimeout", (e) => Effect.fail(new LockTimeout({ key: e.key, timeout: Duration.millis(timeoutMs) })))
      )
      const exit = yield* Effect.exit(restore(round))
      if (Exit.isSuccess(exit) && exit.value._tag === "Held") {
        return Option.some({ leases: leases as ReadonlyArray<Lease>, scope })
      }
      yield* Scope.close(scope, exit)
      if (Exit.isFailure(exit)) return yield* Effect.failCause(exit.cause)
      if (singleAttempt) return Option.none()
      waitFor = (exit.value as Extract<Round, { _tag: "Busy" }>).index
    }
  })

/** Fails as soon as any of the leases is lost. */
export const lostOf = (leases: ReadonlyArray<Lease>): Effect.Effect<never, LockLost> =>
  // raceAll ends with the first success: race the losses as successes
  leases.length === 1 ? leases[0]!.lost : Effect.flip(Effect.raceAll(leases.map((lease) => Effect.flip(lease.lost))))

/** `Lost` if any part was lost, `Released` once all were released, else `Held`. */
export const stateOf = (leases: ReadonlyArray<Lease>): Effect.Effect<LeaseState> =>
  Effect.map(Effect.forEach(leases, (lease) => lease.state), (states) =>
    states.includes("Lost") ? "Lost" : states.every((state) => state === "Released") ? "Released" : "Held")

/** The least time left among the leases. */
export const expiresInOf = (leases: ReadonlyArray<Lease>): Effect.Effect<Duration.Duration> =>
  Effect.map(Effect.forEach(leases, (lease) => lease.expiresIn), (left) => Duration.millis(Math.min(...left.map(Duration.toMillis))))

type MultiBody<A, E, R> = Effect.Effect<A, E, R> | ((leases: ReadonlyArray<Lease>) => Effect.Effect<A, E, R>)

/**
 * Runs `body` while holding every part (waiting as `waiting` says): the body's own scoped
 * resources close before the parts are released, and the body is interrupted with `LockLost` as
 * soon as any part is lost.
 */
export const withAll = <A, E, R>(
  body: MultiBody<A, E, R>,
  specs: ReadonlyArray<LockSpec>,
  waiting: Waiting
): Effect.Effect<A, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.flatMap(
    runWithAll(body, specs, waiting, false),
    // only a single round ends without the parts or a LockTimeout, and withLock never makes one
    (result) => Option.isSome(result) ? Effect.succeed(result.value) : Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")
  )

/**
 * `withAll` when every part is granted in a single round (or within a try's `wait`): `Some` of
 * what the body returned, or `None` without running it.
 */
export const withAllIfGranted = <A, E, R>(
  body: MultiBody<A, E, R>,
  specs: ReadonlyArray<LockSpec>,
  waiting: Waiting
): Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>> =>
  runWithAll(body, specs, waiting, true) as Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>>

const runWithAll = <A, E, R>(
  body: MultiBody<A, E, R>,
  specs: ReadonlyArray<LockSpec>,
  waiting: Waiting,
  ifGranted: boolean
): Effect.Effect<Option.Option<A>, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(Scope.make(), (into) => {
      // whatever ends the acquisition without the parts releases what it took
      const taken = Effect.onExit(
        takeAll(specs, waiting, into, restore),
        (exit) => (Exit.isFailure(exit) ? Scope.close(into, exit) : Effect.void)
      )
      // the acquisition's own timeout only (not the body's): not granted in time
      const parts = ifGranted ? Effect.catchTag(taken, "LockTimeout", () => Effect.succeedNone) : taken
      return Effect.flatMap(parts, (parts) => {
        if (Option.isNone(parts)) return Effect.succeedNone
        const close = Scope.close(into, Exit.void)
        // an interruption that arrived while the last grant was in flight stops here, before the body
        return Effect.matchCauseEffect(restore(Effect.void), {
          onFailure: (cause) => Effect.zipRight(close, Effect.failCause(cause)),
          onSuccess: () => {
            const leases = parts.value.leases
            const effect = typeof body === "function" ? Effect.suspend(() => body(leases)) : body
            return Effect.asSome(whileHeld(leases, effect, restore, close))
          }
        })
      })
    })
  )
