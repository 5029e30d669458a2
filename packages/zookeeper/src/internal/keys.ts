/**
 * The operations on a key as a whole rather than on one holder: what it looks like (`inspect`),
 * every hold of it ended (`forceRelease`), and its fence floor raised (`raiseFence`).
 */
import { Effect } from "effect"
import { LockBackend } from "@lockstep/core"
import type { BackendError } from "@lockstep/core/LockError"
import * as Zk from "node-zookeeper-client"
import type { BackendContext } from "./context.js"
import { idOf } from "./holders.js"
import { decodeFloor, encodeFloor } from "./layout.js"
import type { Seen } from "./queue.js"
import { isHolder, judge } from "./queue.js"
import { readKey } from "./reading.js"
import type { Request } from "./zk.js"
import { Code, codeOf, replyOf } from "./zk.js"

/** A node's fence: the one a waiter let in wrote, else its creation's zxid; plus the key's floor. */
const fenceOf = (node: Seen, floor: number) => node.data?.f ?? node.czxid + floor

export const inspect = (ctx: BackendContext, key: string): Effect.Effect<LockBackend.KeyState, BackendError> =>
  Effect.map(readKey(ctx, "inspect", key), ({ floor, seen }) => {
    const now = ctx.clock.now()
    const { live } = judge(seen, now)
    const holding = live.filter(isHolder)
    const shared = holding.find((n) => n.data!.s > 0)
    return {
      key,
      fence: holding.reduce((max, n) => Math.max(max, fenceOf(n, floor)), 0),
      limit: shared?.data!.m,
      holders: holding.map((n) => ({
        holder: n.contender.holder,
        exclusive: n.data!.x,
        shared: n.data!.s,
        permits: n.data!.s > 0 ? n.data!.p : 0,
        fence: fenceOf(n, floor),
        ttlMs: n.expiresAt - now
      })),
      queue: live
        .filter((n) => n.contender.fair && !holding.includes(n))
        .map((n) => ({ holder: n.contender.holder, ttlMs: n.expiresAt - now }))
    }
  })

/** Deletes every live holder's node, once per request id: a copy of the request answers as the first did. */
export const forceRelease = (ctx: BackendContext, request: LockBackend.ForceReleaseRequest): Effect.Effect<boolean, BackendError> =>
  ctx.holders.serialized(
    `force\u0000${request.key}\u0000${request.id}`,
    Effect.suspend(() => {
      // an id is remembered with its key, as the rules remember it
      const known = ctx.forced.get(`${request.key}\u0000${request.id}`)
      if (known !== undefined && known.until > Date.now()) return Effect.succeed(known.result)
      return Effect.gen(function*() {
        const { lockPath, seen } = yield* readKey(ctx, "forceRelease", request.key)
        const { live } = judge(seen, ctx.clock.now())
        const holding = live.filter(isHolder)
        const outcomes = yield* ctx.send(
          "forceRelease",
          holding.map((n): Request => ({ _tag: "remove", path: `${lockPath}/${n.contender.name}`, version: -1 }))
        )
        for (const outcome of outcomes) yield* ctx.expect("forceRelease", outcome, Code.noNode)
        // this backend's own holders forced out are remembered as ended, as the rules do: a
        // late copy of their last release succeeds, one of their acquisitions grants nothing
        const now = ctx.clock.now()
        for (const node of holding) {
          if (node.contender.holder.startsWith(ctx.ours)) {
            ctx.holders.markEnded(idOf(request.key, node.contender.holder), Math.max(1, node.expiresAt - now))
          }
        }
        const result = outcomes.some((o) => codeOf(o) === 0)
        ctx.forced.set(`${request.key}\u0000${request.id}`, { until: Date.now() + LockBackend.forceReleaseMemoryMs, result })
        for (const [old, entry] of ctx.forced) if (entry.until <= Date.now()) ctx.forced.delete(old)
        return result
      })
    })
  )

/**
 * A floor `f` is met by a base `f - z`, `z` a zxid the ensemble has passed: every node created
 * later has a greater zxid, so its fence (zxid + base) is above `f`. `z` is read off a write to
 * the floor's own node (its `mzxid`), so later fences are only a few above `f`. The base only
 * grows; a copy of a raise, or a lower one, finds it high enough and changes nothing.
 */
export const raiseFence = (ctx: BackendContext, request: LockBackend.RaiseFenceRequest): Effect.Effect<void, BackendError> =>
  Effect.gen(function*() {
    const path = ctx.layout.fence(request.key)
    for (let tries = 0; tries < 10; tries++) {
      const read = (yield* ctx.send("raiseFence", [{ _tag: "getData", path }]))[0]
      yield* ctx.expect("raiseFence", read, Code.noNode)
      const data = replyOf(read, "data")
      if (data === undefined) {
        const created = (yield* ctx.send("raiseFence", [{ _tag: "create", path, data: encodeFloor(0), mode: Zk.CreateMode.PERSISTENT }]))[0]
        yield* ctx.expect("raiseFence", created, Code.nodeExists)
        continue
      }
      const base = decodeFloor(data.data)
      // a write that changes nothing, for its zxid; a version check keeps a concurrent raise whole
      const touched = (yield* ctx.send("raiseFence", [{ _tag: "setData", path, data: data.data, version: data.stat.version }]))[0]
      if (codeOf(touched) === Code.badVersion) continue
      yield* ctx.expect("raiseFence", touched)
      const { mzxid, version } = replyOf(touched, "stat")!.stat
      const wanted = request.fence - mzxid
      if (wanted <= base) return
      const written = (yield* ctx.send("raiseFence", [{ _tag: "setData", path, data: encodeFloor(wanted), version }]))[0]
      if (codeOf(written) === Code.badVersion) continue
      return yield* ctx.expect("raiseFence", written)
    }
    return yield* Effect.fail(ctx.lifecycle.failure("raiseFence")(new Error("the fence floor kept changing")))
  })
