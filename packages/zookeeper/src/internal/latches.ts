/**
 * Count-down latches: a persistent node per latch holding its count and the calls it remembers as
 * JSON, changed by core's latch rules with a compare-and-set on the node's version. A latch's
 * local waiters watch its node. A key with contenders under its lock node counts as locked, and
 * the rules refuse a latch call on a locked key.
 */
import type { Scope } from "effect"
import { Effect, Either } from "effect"
import type { LockBackend } from "@lockstep/core"
import { Rules } from "@lockstep/core"
import type { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import * as Zk from "node-zookeeper-client"
import type { BackendContext } from "./context.js"
import { contendersOf } from "./reading.js"
import { Code, codeOf, replyOf } from "./zk.js"

/** A latch node's data. */
interface LatchDocument {
  readonly count: number
  readonly applied: ReadonlyArray<readonly [string, number]>
}

/** The waiters of each latch in this process: every read of the latch re-arms their watch. */
export interface LatchWaiters {
  readonly of: (key: string) => ReadonlySet<string> | undefined
  /** Lists `id` among the waiters of `key` while the scope lasts. */
  readonly listed: (key: string, id: string) => Effect.Effect<void, never, Scope.Scope>
}

export const makeLatchWaiters = (): LatchWaiters => {
  const byKey = new Map<string, Set<string>>()
  return {
    of: (key) => byKey.get(key),
    listed: (key, id) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          let set = byKey.get(key)
          if (set === undefined) {
            set = new Set()
            byKey.set(key, set)
          }
          set.add(id)
        }),
        () =>
          Effect.sync(() => {
            const set = byKey.get(key)
            set?.delete(id)
            if (set?.size === 0) byKey.delete(key)
          })
      )
  }
}

/** The latch (and whether its key is locked) as the rules' state. */
const latchState = (key: string, document: LatchDocument | undefined, locked: boolean): Rules.State => ({
  keys: locked
    ? new Map([[key, { ...Rules.emptyKey, holders: [{ holder: "", exclusive: 1, shared: 0, permits: 0, fence: 0, expiresAt: Infinity }] }]])
    : new Map(),
  latches: document === undefined ? new Map() : new Map([[key, { count: document.count, applied: new Map(document.applied) }]])
})

/** Applies a latch rule with a compare-and-set on the latch's node, read again when it changed meanwhile. */
export const onLatch = <A>(
  ctx: BackendContext,
  operation: string,
  key: string,
  step: (state: Rules.State, now: number) => Rules.Step<Either.Either<A, InvalidLockOptions>>
): Effect.Effect<A, BackendError | InvalidLockOptions> =>
  Effect.gen(function*() {
    const path = ctx.layout.latch(key)
    for (let tries = 0; tries < 20; tries++) {
      // a read re-arms the watch of the latch's local waiters (a watch fires once)
      const waiting = ctx.latchWaiters.of(key)
      if (waiting !== undefined) for (const id of waiting) ctx.wakeups.watch(path, id, true)
      const read = yield* ctx.send(operation, [
        { _tag: "getData", path },
        { _tag: "getChildren", path: ctx.layout.lock(key) },
        ...(waiting === undefined ? [] : [{ _tag: "exists", path, watch: ctx.wakeups.watcher } as const])
      ])
      yield* ctx.expect(operation, read[0], Code.noNode)
      const data = replyOf(read[0], "data")
      const document = data === undefined ? undefined : (JSON.parse(data.data.toString("utf8") || "null") as LatchDocument | null) ?? undefined
      const locked = contendersOf(read[1]).length > 0
      const now = ctx.clock.now()
      const { result, state } = step(latchState(key, document, locked), now)
      if (Either.isLeft(result)) return yield* Effect.fail(result.left)
      const next = state.latches.get(key)
      const encoded = next === undefined ? { count: 0, applied: [] } : { count: next.count, applied: [...next.applied] }
      const same = document !== undefined && JSON.stringify(document) === JSON.stringify(encoded)
      if (same || (document === undefined && encoded.count === 0 && encoded.applied.length === 0)) return result.right
      const buffer = Buffer.from(JSON.stringify(encoded))
      // an empty latch is no node at all
      const written = (yield* ctx.send(operation, [
        data === undefined
          ? { _tag: "create", path, data: buffer, mode: Zk.CreateMode.PERSISTENT }
          : encoded.count === 0 && encoded.applied.length === 0
          ? { _tag: "remove", path, version: data.stat.version }
          : { _tag: "setData", path, data: buffer, version: data.stat.version }
      ]))[0]
      if (codeOf(written) === Code.badVersion || codeOf(written) === Code.nodeExists || codeOf(written) === Code.noNode) continue
      yield* ctx.expect(operation, written)
      return result.right
    }
    return yield* Effect.fail(ctx.lifecycle.failure(operation)(new Error("the latch kept changing")))
  })

/** A waiter of the latch: woken by any change of the latch's node. */
export const latchSubscribe = (
  ctx: BackendContext,
  key: string,
  waiter: string
): Effect.Effect<LockBackend.Subscription, BackendError, Scope.Scope> => {
  const path = ctx.layout.latch(key)
  const id = `latch\u0000${key}\u0000${waiter}`
  return Effect.tap(Effect.zipRight(ctx.latchWaiters.listed(key, id), ctx.wakeups.subscribe(id, Effect.void)), () => {
    ctx.wakeups.watch(path, id, true)
    return Effect.flatMap(
      ctx.send("latchSubscribe", [{ _tag: "exists", path, watch: ctx.wakeups.watcher }]),
      (outcomes) => ctx.expect("latchSubscribe", outcomes[0])
    )
  })
}
