/**
 * The ZooKeeper interpreter of the lock algebra: every hold and every waiter is an ephemeral
 * sequential node under the key's node; a node's standing follows from the nodes before it
 * (`queue.ts`); a waiter watches the one live node just before it (`wakeups.ts`); a fence is the
 * zxid of the first write of the attempt that was granted (a new node's creation, a waiter's
 * heartbeat), plus the key's raised floor, if any.
 *
 * This module assembles the parts, each in a module of its own: holders' bookkeeping
 * (`holders.ts`), acquiring (`acquire.ts`), releasing, renewing and cancelling (`release.ts`),
 * operations on a whole key (`keys.ts`), latches (`latches.ts`), the sweep of idle key nodes
 * (`keyNodes.ts`) and the ensemble's clock (`serverTime.ts`), all sharing one `BackendContext`.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import type { LockBackend } from "@lockstep/core"
import { Rules } from "@lockstep/core"
import { makeLifecycle } from "@lockstep/core/BackendKit"
import type { BackendError } from "@lockstep/core/LockError"
import * as Zk from "node-zookeeper-client"
import { acquire } from "./acquire.js"
import { describeCause, makeCalls } from "./calls.js"
import type { BackendContext, Settings } from "./context.js"
import { idOf, makeHolders } from "./holders.js"
import { makeKeyNodes, sweepIdle } from "./keyNodes.js"
import { forceRelease, inspect, raiseFence } from "./keys.js"
import { latchSubscribe, makeLatchWaiters, onLatch } from "./latches.js"
import { paths } from "./layout.js"
import { cancel, leaveQueue, release, renew } from "./release.js"
import { makeServerClock } from "./serverTime.js"
import type { Session } from "./session.js"
import { makeWakeups } from "./wakeups.js"
import { Code } from "./zk.js"

export type { Settings } from "./context.js"

/** Creates the namespace (each of its ancestors too) and its three folders, where absent. */
const prepareFolders = (ctx: BackendContext): Effect.Effect<void, BackendError> =>
  Effect.gen(function*() {
    const { layout } = ctx
    const ancestors = layout.root.split("/").filter((part) => part !== "").map((_, i, parts) => `/${parts.slice(0, i + 1).join("/")}`)
    const folders = [...ancestors, layout.locks, layout.latches, layout.fences]
    const prepared = yield* ctx.send(
      "connect",
      folders.map((path) => ({ _tag: "create", path, data: Buffer.alloc(0), mode: Zk.CreateMode.PERSISTENT }))
    )
    for (const outcome of prepared) yield* ctx.expect("connect", outcome, Code.nodeExists)
  })

/**
 * The backend on `session`. Once its scope closes every call fails with the closed-backend error,
 * and the waiters blocked at that moment wake and fail with it.
 */
export const make = (
  session: Session,
  settings: Settings
): Effect.Effect<LockBackend.Service, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const clientId = crypto.randomUUID()
    const lifecycle = makeLifecycle({ backend: "ZooKeeper backend", endpoint: settings.endpoint, detailOf: describeCause })
    const ctx: BackendContext = {
      ...makeCalls(session, lifecycle, settings.commandTimeoutMs),
      session,
      layout: paths(settings.namespace),
      lifecycle,
      ours: `${clientId}:`,
      clock: makeServerClock(),
      keyNodes: makeKeyNodes(),
      holders: makeHolders(),
      wakeups: makeWakeups(session, lifecycle),
      latchWaiters: makeLatchWaiters(),
      forced: new Map()
    }
    yield* prepareFolders(ctx)
    yield* sweepIdle(ctx.keyNodes, ctx, settings.sweepIntervalMs)

    // every call starts only while the backend is open, also those that would not reach ZooKeeper
    const { whileOpen } = lifecycle
    const service: LockBackend.Service = {
      clientId,
      acquire: (request) => whileOpen("acquire", acquire(ctx, request)),
      release: (request) => whileOpen("release", release(ctx, request)),
      renew: (requests) => whileOpen("renew", renew(ctx, requests)),
      inspect: (key) => whileOpen("inspect", inspect(ctx, key)),
      raiseFence: (request) => whileOpen("raiseFence", raiseFence(ctx, request)),
      forceRelease: (request) => whileOpen("forceRelease", forceRelease(ctx, request)),
      cancel: (request) => whileOpen("cancel", cancel(ctx, request)),
      subscribe: (key, holder) => whileOpen("subscribe", ctx.wakeups.subscribe(idOf(key, holder), leaveQueue(ctx, key, holder))),
      latchSetCount: (request) =>
        whileOpen("latchSetCount", onLatch(ctx, "latchSetCount", request.key, (state, now) => Rules.latchSetCount(state, request, now))),
      latchCountDown: (request) =>
        whileOpen("latchCountDown", onLatch(ctx, "latchCountDown", request.key, (state, now) => Rules.latchCountDown(state, request, now))),
      latchCount: (key) => whileOpen("latchCount", onLatch(ctx, "latchCount", key, (state, now) => Rules.latchCount(state, key, now))),
      latchSubscribe: (key, waiter) => whileOpen("latchSubscribe", latchSubscribe(ctx, key, waiter))
    }
    // last, so it runs first at the close: calls fail as closed while the session is still there
    yield* lifecycle.closeWithScope
    return service
  })
