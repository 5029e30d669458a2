/**
 * What ends or keeps a holder's node: a release (a count down, or the node deleted), a renewal
 * (a rewrite of the node, which its lease counts from), a cancelled queue entry, and a waiter
 * leaving the queue.
 */
import { Effect, Either } from "effect"
import type { LockBackend } from "@lockstep/core"
import type { BackendError } from "@lockstep/core/LockError"
import { NotHeld } from "@lockstep/core/LockError"
import type { BackendContext } from "./context.js"
import type { Holder } from "./holders.js"
import { heldData } from "./holders.js"
import { prefixOf } from "./layout.js"
import type { Request } from "./zk.js"
import { Code, codeOf, replyOf } from "./zk.js"

/**
 * Drops the holder's node: whether one was there. When a `create` answer was lost the node is
 * searched for by the holder's prefix (best-effort: a name the search misses expires).
 */
export const dropNode = (ctx: BackendContext, operation: string, state: Holder): Effect.Effect<boolean, BackendError> =>
  Effect.gen(function*() {
    const lockPath = ctx.layout.lock(state.key)
    const targets: Array<string> = []
    if (state.path !== undefined) targets.push(state.path)
    if (state.unsure) {
      const listed = yield* ctx.send(operation, [{ _tag: "getChildren", path: lockPath }])
      const prefix = prefixOf(state.holder)
      for (const name of replyOf(listed[0], "children")?.children ?? []) {
        const path = `${lockPath}/${name}`
        if (name.startsWith(prefix) && !targets.includes(path)) targets.push(path)
      }
    }
    if (targets.length === 0) return false
    const outcomes = yield* ctx.send(operation, targets.map((path): Request => ({ _tag: "remove", path, version: -1 })))
    for (const outcome of outcomes) yield* ctx.expect(operation, outcome, Code.noNode)
    ctx.keyNodes.usedIfKnown(lockPath)
    state.path = undefined
    state.unsure = false
    return outcomes.some((o) => codeOf(o) === 0)
  })

export const release = (ctx: BackendContext, request: LockBackend.ReleaseRequest): Effect.Effect<number, BackendError | NotHeld> => {
  const { holders } = ctx
  return holders.inTurn(request.key, request.holder, (id, state) =>
    Effect.gen(function*() {
      const notHeld = new NotHeld({ key: request.key, holder: request.holder })
      if (state === undefined || state.fence === undefined) {
        if (holders.hasEnded(id)) return 0
        // a holder with no hold: a node left by an attempt that failed (its answer lost, or
        // a later request of it) goes; a queue entry stays until it is cancelled or expires
        if (state !== undefined && (state.unsure || (!state.fair && !ctx.wakeups.isWaiting(id)))) {
          yield* dropNode(ctx, "release", state)
          if (!state.fair) holders.delete(id)
        }
        holders.markUnheld(id, request.leaseMs)
        return yield* Effect.fail(notHeld)
      }
      if (state.epoch !== ctx.session.epoch()) {
        holders.markEnded(id, request.leaseMs)
        return yield* Effect.fail(notHeld)
      }
      const current = request.mode === "exclusive" ? state.exclusive : state.shared
      // a count below the caller's: a copy of a release already applied
      const remaining = current >= request.count ? request.count - 1 : current
      const next = request.mode === "exclusive"
        ? { exclusive: remaining, shared: state.shared }
        : { exclusive: state.exclusive, shared: remaining }
      if (next.exclusive === 0 && next.shared === 0) {
        const removed = yield* dropNode(ctx, "release", state)
        holders.markEnded(id, request.leaseMs)
        if (!removed) return yield* Effect.fail(notHeld)
        return remaining
      }
      const before = { exclusive: state.exclusive, shared: state.shared }
      state.exclusive = next.exclusive
      state.shared = next.shared
      if (state.shared === 0) state.permits = 0
      const outcome = (yield* ctx.send("release", [{ _tag: "setData", path: state.path!, data: heldData(state), version: -1 }]))[0]
      if (codeOf(outcome) === Code.noNode) {
        Object.assign(state, before)
        holders.markEnded(id, request.leaseMs)
        return yield* Effect.fail(notHeld)
      }
      yield* ctx.expect("release", outcome)
      state.mtime = replyOf(outcome, "stat")!.stat.mtime
      return remaining
    }))
}

const renewOne = (ctx: BackendContext, request: LockBackend.RenewRequest): Effect.Effect<LockBackend.RenewResult, BackendError> => {
  const { holders } = ctx
  return holders.inTurn(request.key, request.holder, (id, state) =>
    Effect.gen(function*() {
      if (state === undefined || state.fence === undefined || state.path === undefined) return Either.right(false)
      if (state.epoch !== ctx.session.epoch()) {
        holders.markEnded(id, request.leaseMs)
        return Either.right(false)
      }
      const leaseMs = state.leaseMs
      const lastWrite = state.mtime
      state.leaseMs = Math.max(state.leaseMs, request.leaseMs)
      const outcome = (yield* ctx.send("renew", [{ _tag: "setData", path: state.path, data: heldData(state), version: -1 }]))[0]
      const stat = replyOf(outcome, "stat")
      if (stat === undefined) {
        if (codeOf(outcome) !== Code.noNode) return Either.left(ctx.lifecycle.failure("renew")(outcome))
        holders.markEnded(id, request.leaseMs)
        return Either.right(false)
      }
      state.mtime = stat.stat.mtime
      ctx.clock.saw(stat.stat.mtime)
      if (stat.stat.mtime > lastWrite + leaseMs) {
        // the hold had expired before this write brought its node back: it is over
        yield* Effect.ignore(dropNode(ctx, "renew", state))
        holders.markEnded(id, request.leaseMs)
        return Either.right(false)
      }
      return Either.right(true)
    }))
}

/** Each renewal on its own, all at once: one holder's failure is its own result. */
export const renew = (
  ctx: BackendContext,
  requests: ReadonlyArray<LockBackend.RenewRequest>
): Effect.Effect<ReadonlyArray<LockBackend.RenewResult>, BackendError> =>
  Effect.forEach(requests, (request) => renewOne(ctx, request), { concurrency: "unbounded" })

export const cancel = (ctx: BackendContext, request: LockBackend.CancelRequest): Effect.Effect<void, BackendError> =>
  ctx.holders.inTurn(request.key, request.holder, (id, state) =>
    Effect.gen(function*() {
      if (state !== undefined && state.fence !== undefined) return // a holder: the queue no longer applies
      if (state !== undefined) yield* dropNode(ctx, "cancel", state)
      ctx.holders.markEnded(id, request.leaseMs)
    }))

/**
 * A waiter of a non-fair kind keeps its node while subscribed (its place: no herd, no attempts
 * that keep cancelling each other) and gives it up when it leaves ungranted. A fair waiter's
 * place is given up by `cancel`.
 */
export const leaveQueue = (ctx: BackendContext, key: string, holder: string): Effect.Effect<void> =>
  Effect.ignore(ctx.holders.inTurn(key, holder, (id, state) => {
    if (state === undefined || state.fence !== undefined || state.fair || state.path === undefined) return Effect.void
    ctx.holders.delete(id)
    return Effect.asVoid(dropNode(ctx, "leave", state))
  }))
