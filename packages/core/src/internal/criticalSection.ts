/**
 * Critical sections: a body run under leases in a fiber of its own, interrupted when a hold is
 * lost, and the leases released once its scope closed.
 */
import { Cause, Context, Effect, Equal, Exit, Fiber, FiberId, FiberRef, Option, RuntimeFlags, RuntimeFlagsPatch, Scope } from "effect"
import type { Lease } from "../Lease.js"
import type { LockLost, LockTimeout } from "../LockError.js"
import type { AttemptError } from "./acquisition.js"
import { takeGrant } from "./acquisition.js"
import type { HeldLeases } from "./fiberHolds.js"
import { addHeld, heldLeases } from "./fiberHolds.js"
import type { Grant } from "./lease.js"
import { recordOf } from "./lease.js"
import type { Body, LockSpec, Restore, Retry } from "./spec.js"

/**
 * Runs `body` under `leases` (one for a lock, one per part for a multi-lock) in a fiber of its
 * own, with the current fiber's holds (it re-enters them as the current fiber would: it is still
 * this fiber's critical section) and a scope of its own, closed when it ends. If any hold is lost
 * meanwhile, the body is interrupted and this fails with that `LockLost`; otherwise it ends as the
 * body did, and the body's fiber refs are inherited as with `Fiber.join`. `close` ends the leases
 * after the body's scope closed, however it ended. Call it uninterruptibly; `restore` is where it
 * may be interrupted.
 */
export const whileHeld = <A, E, R>(
  leases: ReadonlyArray<Lease>,
  body: Effect.Effect<A, E, R>,
  restore: Restore,
  close: Effect.Effect<void>
): Effect.Effect<A, E | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.flatMap(Scope.make(), (scope) => Effect.withFiberRuntime((parent) => {
    const helds = leases.map(recordOf)
    // withLock leaves the caller's holds alone: the records are the body's
    let all = parent.getFiberRef(heldLeases).all
    for (const held of helds) if (!all.includes(held)) all = addHeld(all, held)
    const holds: HeldLeases = { all, taken: [] }
    const callerContext = parent.getFiberRef(FiberRef.currentContext)
    // the body's fiber is new and ends with the body: its refs are set, not scoped
    const inside = Effect.zipRight(
      Effect.zipRight(
        FiberRef.set(heldLeases, holds),
        FiberRef.set(FiberRef.currentContext, Context.add(callerContext, Scope.Scope, scope))
      ),
      body as Effect.Effect<A, E, Exclude<R, Scope.Scope>>
    )
    return Effect.flatMap(
      Effect.fork(restore(inside)),
      (fiber) => {
        for (const held of helds) held.bodies.push(fiber)
        if (helds.some((held) => held.dead)) fiber.unsafeInterruptAsFork(FiberId.none)
        // the body's scoped resources close before the lease does
        const done = (exit: Exit.Exit<unknown, unknown>) => {
          for (const held of helds) {
            const i = held.bodies.indexOf(fiber)
            if (i !== -1) held.bodies.splice(i, 1)
          }
          // the lease ends even if a finalizer of the body dies
          return Effect.ensuring(Scope.close(scope, exit), close)
        }
        return Effect.matchCauseEffect(restore(Fiber.await(fiber)), {
          // interrupted while waiting for the body: interrupt it too
          onFailure: (cause) => Effect.zipRight(Effect.flatMap(Fiber.interrupt(fiber), done), Effect.failCause(cause)),
          onSuccess: (exit) => {
            const dead = Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause) ? helds.find((held) => held.dead) : undefined
            if (dead !== undefined) return Effect.zipRight(done(exit), dead.lost)
            return Effect.withFiberRuntime((_, status) =>
              inheritsNothing(fiber, parent, holds, status.runtimeFlags)
                ? Effect.zipRight(done(exit), exit)
                // inherited before the body's scope closes, so that what its finalizers restore
                // (a scoped fiber ref) stays restored; the body's context carries that scope: the
                // caller keeps its own
                : Effect.zipRight(
                  Effect.zipRight(Fiber.inheritAll(fiber), FiberRef.set(FiberRef.currentContext, callerContext)),
                  Effect.zipRight(done(exit), exit)
                )
            )
          }
        })
      }
    )
  }))

/**
 * Whether joining `body`, a body's fiber that has ended, would change nothing of `parent`, the
 * fiber that forked it and has been waiting for it since, whose runtime flags are `flags` now:
 * the body wrote no fiber ref (a ref it wrote, even back to the value it had, is joined as
 * `Fiber.join` joins it: a ref's `join` may combine equal values), and left the runtime flags
 * that a join passes on as they are. Its holds and context are not inherited this way (the
 * caller keeps its own).
 */
const inheritsNothing = (
  body: Fiber.RuntimeFiber<unknown, unknown>,
  parent: Fiber.RuntimeFiber<unknown, unknown>,
  holds: HeldLeases,
  flags: RuntimeFlags.RuntimeFlags
): boolean => {
  const id = body.id()
  for (const [ref, stack] of body.getFiberRefs().locals) {
    const [writer, value] = stack[0]
    if (ref === FiberRef.currentContext) continue
    if (ref === FiberRef.currentRuntimeFlags) {
      // what `Fiber.inheritAll` applies: the difference, less interruptibility and wind-down
      const patch = RuntimeFlagsPatch.exclude(
        RuntimeFlagsPatch.exclude(RuntimeFlags.diff(flags, value as RuntimeFlags.RuntimeFlags), RuntimeFlags.Interruption),
        RuntimeFlags.WindDown
      )
      if (!RuntimeFlagsPatch.isEmpty(patch)) return false
    } else if (ref === heldLeases) {
      if (value !== holds) return false
    } else if (Equal.equals(writer, id) || value !== parent.getFiberRef(ref)) {
      return false
    }
  }
  return true
}

/**
 * Runs `body` while holding a lease (waiting forever, or up to `timeoutMs`): the body's own scoped
 * resources close before the release, and the body is interrupted with `LockLost` if the lease is
 * lost. No scope is made for the lease: it ends when the body does.
 */
export const runUnderLease = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  timeoutMs: number | undefined,
  retry?: Retry
): Effect.Effect<A, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(takeGrant(spec, permits, timeoutMs, retry, restore), (grant) =>
      // only a zero timeout ends without a grant or a LockTimeout, and withLock never makes one
      Option.isNone(grant)
        ? Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")
        : runGranted(grant.value, body, restore))
  )

/**
 * `runUnderLease` when the lock is free within `waitMs` (0: a single attempt): `Some` of what the body
 * returned, or `None` without running it.
 */
export const runUnderLeaseIfGranted = <A, E, R>(
  body: Body<A, E, R>,
  spec: LockSpec,
  permits: number,
  waitMs: number,
  retry?: Retry
): Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(
      Effect.catchTag(takeGrant(spec, permits, waitMs, retry, restore), "LockTimeout", () => Effect.succeedNone),
      (grant) => Option.isNone(grant) ? Effect.succeedNone : Effect.asSome(runGranted(grant.value, body, restore))
    )
  )

/** Runs a body under a grant just made (uninterruptibly: `restore` is where it may be interrupted). */
const runGranted = <A, E, R>(
  grant: Grant,
  body: Body<A, E, R>,
  restore: Restore
): Effect.Effect<A, E | LockLost, Exclude<R, Scope.Scope>> => {
  const { close, lease } = grant
  // an interruption that arrived while the grant was in flight stops here, before the body
  return Effect.matchCauseEffect(restore(Effect.void), {
    onFailure: (cause) => Effect.zipRight(close, Effect.failCause(cause)),
    onSuccess: () => whileHeld([lease], typeof body === "function" ? Effect.suspend(() => body(lease)) : body, restore, close)
  })
}

