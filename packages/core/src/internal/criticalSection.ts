/**
 * Critical sections: a body run under leases in a fiber of its own, interrupted when a hold is
 * lost, and the leases released once its scope closed.
 */
import { Cause, Context, Effect, Equal, Exit, Fiber, FiberId, FiberRef, FiberRefs, Option, Runtime, RuntimeFlags, RuntimeFlagsPatch, Scope } from "effect"
import type * as Arr from "effect/Array"
import type { Lease } from "../Lease.js"
import type { LockLost, LockTimeout } from "../LockError.js"
import type { AttemptError, LeaseRequest } from "./acquisition.js"
import { takeGrant } from "./acquisition.js"
import type { FiberHolds } from "./fiberHolds.js"
import { fiberHolds } from "./fiberHolds.js"
import type { Hold } from "./hold.js"
import * as HoldSet from "./holdSet.js"
import type { Grant } from "./lease.js"
import { holdOf } from "./lease.js"
import type { Body, Restore } from "./spec.js"

/**
 * How many body fibers are being started on the current stack, one inside another: past
 * `maxImmediateDepth`, a body fiber is scheduled rather than started at once, so that bodies
 * nested without end (a recursion under a lock) cannot overflow the stack.
 */
let immediateDepth = 0
const maxImmediateDepth = 16

/**
 * Runs `body` under `leases` (one for a lock, one per part for a multi-lock) in a fiber of its
 * own, with the current fiber's holds (it re-enters them as the current fiber would: it is still
 * this fiber's critical section) and a scope of its own, closed when it ends. If any hold is lost
 * meanwhile, the body is interrupted and this fails with that `LockLost`; otherwise it ends as the
 * body did, and the body's fiber refs are inherited as with `Fiber.join`. `close` ends the leases
 * after the body's scope closed, however it ended. Call it uninterruptibly; `restore` is where it
 * may be interrupted.
 *
 * The body's fiber is forked as `Effect.fork` forks (the caller's fiber refs, each through its
 * `fork`; the caller's runtime flags) but started at once on the current stack rather than
 * scheduled, and its end is read at once when it ended there: a body that never suspends costs
 * no trip through the scheduler. The caller stays its supervisor in effect: an interruption of
 * the caller interrupts the body.
 */
export const whileHeld = <A, E, R>(
  leases: ReadonlyArray<Lease>,
  body: Effect.Effect<A, E, R>,
  restore: Restore,
  close: Effect.Effect<void>
): Effect.Effect<A, E | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.suspend(() => {
    const holds = leases.map(holdOf)
    // a hold lost before the body could start (a multi-lock's first part, while it waited for
    // the others): the body never runs
    const lostBefore = holds.find((hold) => hold.dead)
    if (lostBefore !== undefined) return Effect.zipRight(close, lostBefore.lost)
    // a scope of Effect's own: Effect's functions (forkScoped, Stream.broadcast) read its state
    return Effect.flatMap(Scope.make(), (scope) => runBody(holds, scope, body, restore, close))
  })

const runBody = <A, E, R>(
  holds: ReadonlyArray<Hold>,
  scope: Scope.CloseableScope,
  body: Effect.Effect<A, E, R>,
  restore: Restore,
  close: Effect.Effect<void>
): Effect.Effect<A, E | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.withFiberRuntime((parent, status) => {
    const flags = status.runtimeFlags
    // withLock leaves the caller's holds alone: these are the body's
    let all = parent.getFiberRef(fiberHolds).all
    for (const hold of holds) if (!HoldSet.has(all, hold)) all = HoldSet.add(all, hold)
    const bodyHolds: FiberHolds = { all, taken: HoldSet.empty }
    const callerContext = parent.getFiberRef(FiberRef.currentContext)
    const parentRefs = parent.getFiberRefs()
    const runtime = Runtime.make({
      context: Context.add(callerContext, Scope.Scope, scope),
      runtimeFlags: flags,
      fiberRefs: parentRefs
    })
    // the body's fiber is new and ends with the body: its holds are set, not scoped
    let forked: FiberRefs.FiberRefs = parentRefs
    const withHolds = (refs: FiberRefs.FiberRefs, id: FiberId.Runtime) =>
      (forked = FiberRefs.updateAs(refs, { fiberId: id, fiberRef: fiberHolds, value: bodyHolds }))
    const effect = restore(body) as Effect.Effect<A, E, never>
    let fiber: Fiber.RuntimeFiber<A, E>
    if (immediateDepth < maxImmediateDepth) {
      immediateDepth++
      try {
        fiber = Runtime.runFork(runtime, effect, { updateRefs: withHolds, immediate: true })
      } finally {
        immediateDepth--
      }
    } else {
      fiber = Runtime.runFork(runtime, effect, { updateRefs: withHolds, immediate: false })
    }
    for (const hold of holds) hold.bodies.push(fiber)
    // a hold lost before the body's fiber was listed (the body may have run already)
    if (holds.some((hold) => hold.dead)) fiber.unsafeInterruptAsFork(FiberId.none)
    // the body's scoped resources close before the lease does
    const done = (exit: Exit.Exit<unknown, unknown>) => {
      for (const hold of holds) {
        const i = hold.bodies.indexOf(fiber)
        if (i !== -1) hold.bodies.splice(i, 1)
      }
      // the lease ends even if a finalizer of the body dies
      return Effect.ensuring(Scope.close(scope, exit), close)
    }
    const ended = (exit: Exit.Exit<A, E>): Effect.Effect<A, E | LockLost> => {
      const dead = Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause) ? holds.find((hold) => hold.dead) : undefined
      if (dead !== undefined) return Effect.zipRight(done(exit), dead.lost)
      // the caller's runtime flags are those it had when it forked the body (it waited with
      // them restored)
      return inheritsNothing(fiber, parent, parentRefs, forked, bodyHolds, flags)
        ? Effect.zipRight(done(exit), exit)
        // inherited before the body's scope closes, so that what its finalizers restore
        // (a scoped fiber ref) stays restored; the body's context carries that scope: the
        // caller keeps its own
        : Effect.zipRight(
          Effect.zipRight(Fiber.inheritAll(fiber), FiberRef.set(FiberRef.currentContext, callerContext)),
          Effect.zipRight(done(exit), exit)
        )
    }
    // ended on this stack: no need to wait for it
    const exit = fiber.unsafePoll()
    if (exit !== null) return ended(exit)
    return Effect.matchCauseEffect(restore(Fiber.await(fiber)), {
      // interrupted while waiting for the body: interrupt it too
      onFailure: (cause) => Effect.zipRight(Effect.flatMap(Fiber.interrupt(fiber), done), Effect.failCause(cause)),
      onSuccess: ended
    })
  })

/**
 * Whether joining `body`, a body's fiber that has ended, would change nothing of `parent`, the
 * fiber that forked it (its refs then: `parentRefs`; the body's refs as forked: `forked`) and has
 * been waiting for it since, whose runtime flags are `flags` now: the body wrote no fiber ref (a
 * ref it wrote, even back to the value it had, is joined as `Fiber.join` joins it: a ref's `join`
 * may combine equal values), what the refs' `fork` changed joins back to what the caller has, and
 * the body left the runtime flags that a join passes on as they are. Its holds and context are not
 * inherited this way (the caller keeps its own).
 */
const inheritsNothing = (
  body: Fiber.RuntimeFiber<unknown, unknown>,
  parent: Fiber.RuntimeFiber<unknown, unknown>,
  parentRefs: FiberRefs.FiberRefs,
  forked: FiberRefs.FiberRefs,
  bodyHolds: FiberHolds,
  flags: RuntimeFlags.RuntimeFlags
): boolean => {
  const id = body.id()
  const before = parentRefs.locals
  for (const [ref, stack] of body.getFiberRefs().locals) {
    // the very stack the caller had when the body was forked: neither its fork nor the body changed it
    if (before.get(ref) === stack || ref === FiberRef.currentContext) continue
    const [writer, value] = stack[0]
    if (ref === FiberRef.currentRuntimeFlags) {
      // what `Fiber.inheritAll` applies: the difference, less interruptibility and wind-down
      const patch = RuntimeFlagsPatch.exclude(
        RuntimeFlagsPatch.exclude(RuntimeFlags.diff(flags, value as RuntimeFlags.RuntimeFlags), RuntimeFlags.Interruption),
        RuntimeFlags.WindDown
      )
      if (!RuntimeFlagsPatch.isEmpty(patch)) return false
    } else if (ref === fiberHolds) {
      if (value !== bodyHolds) return false
    } else if (forked.locals.get(ref) === stack) {
      // changed by the ref's `fork` alone (as Effect's own fork-scope override in a fiber that
      // `Effect.forEach` forked), which the body never wrote
      if (!forkJoinsBack(parent.id(), ref, before.get(ref), stack)) return false
    } else if (Equal.equals(writer, id) || value !== parent.getFiberRef(ref)) {
      return false
    }
  }
  return true
}

/**
 * Whether what forking a body made of the caller's ref `ref` (its `parentStack`) through the
 * ref's `fork` (`forkedStack`) would be joined back unchanged through its `join`, as
 * `Fiber.join` joins it. Asked on every critical section of such a caller, with the same answer
 * for the same stack of the caller's (a fork and a join are functions of the values; stacks are
 * never changed in place), so it is worked out once per stack.
 */
const forkJoinsBack = (
  parentId: FiberId.Runtime,
  ref: FiberRef.FiberRef<unknown>,
  parentStack: Stack | undefined,
  forkedStack: Stack
): boolean => {
  const known = parentStack === undefined ? undefined : joinsBack.get(parentStack)
  if (known !== undefined) return known
  const parentRefs = FiberRefs.unsafeMake(parentStack === undefined ? new Map() : new Map([[ref, parentStack]]))
  const joined = FiberRefs.joinAs(parentRefs, parentId, FiberRefs.unsafeMake(new Map([[ref, forkedStack]])))
  const back = joined.locals.get(ref) === parentStack
  if (parentStack !== undefined) joinsBack.set(parentStack, back)
  return back
}

type Stack = Arr.NonEmptyReadonlyArray<readonly [FiberId.Single, unknown]>

const joinsBack = new WeakMap<Stack, boolean>()

/**
 * Runs `body` while holding a lease (waiting as the request says): the body's own scoped
 * resources close before the release, and the body is interrupted with `LockLost` if the lease is
 * lost. No scope is made for the lease: it ends when the body does.
 */
export const runUnderLease = <A, E, R>(
  body: Body<A, E, R>,
  leaseRequest: LeaseRequest
): Effect.Effect<A, E | AttemptError | LockTimeout | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(takeGrant(leaseRequest, restore), (grant) =>
      // only a single attempt ends without a grant or a LockTimeout, and withLock never makes one
      Option.isNone(grant)
        ? Effect.dieMessage("lockstep: a waiting acquisition ended without a lease")
        : runGranted(grant.value, body, restore))
  )

/**
 * `runUnderLease` when the lock is granted at once (or within the request's timeout): `Some` of
 * what the body returned, or `None` without running it.
 */
export const runUnderLeaseIfGranted = <A, E, R>(
  body: Body<A, E, R>,
  leaseRequest: LeaseRequest
): Effect.Effect<Option.Option<A>, E | AttemptError | LockLost, Exclude<R, Scope.Scope>> =>
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(
      Effect.catchTag(takeGrant(leaseRequest, restore), "LockTimeout", () => Effect.succeedNone),
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

