/**
 * Acquiring: a holder's re-entry on the node it has, or an attempt with a node of its own (a new
 * one, or its waiting node refreshed). The attempt's two round trips find where the node stands;
 * the nodes before it decide (`queue.ts`) whether it holds now or waits, watching what blocks it.
 */
import { Effect } from "effect"
import type { LockBackend } from "@lockstep/core"
import { Rules } from "@lockstep/core"
import type { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import { LockUpgradeNotSupported, NotHeld } from "@lockstep/core/LockError"
import * as Zk from "node-zookeeper-client"
import type { BackendContext } from "./context.js"
import type { Holder } from "./holders.js"
import { heldData, idOf, newHolder } from "./holders.js"
import type { Contender } from "./layout.js"
import { encodeData, nodeName } from "./layout.js"
import type { Judged, Seen } from "./queue.js"
import { excludesReaders, isHolder, judge, mayHold } from "./queue.js"
import { contendersOf, dropExpired, floorOf, limitConflict, readKey, readNodes } from "./reading.js"
import type { Outcome, Request, Stat } from "./zk.js"
import { Code, codeOf, replyOf } from "./zk.js"

/**
 * The data an attempt writes to its node: a new node says it holds at once (the common case:
 * nobody before it), a waiting node's heartbeat says it waits; `granted` with the fence of a
 * waiter let in.
 */
const attemptData = (
  request: LockBackend.AcquireRequest,
  state: Holder,
  fresh: boolean,
  granted: 0 | 1,
  fence?: number
): Buffer =>
  encodeData({
    f: fence,
    x: request.mode === "exclusive" ? 1 : 0,
    s: request.mode === "shared" ? 1 : 0,
    p: request.mode === "shared" ? request.permits : 0,
    m: request.mode === "shared" ? request.limit : 1,
    l: request.leaseMs,
    w: request.fair && !fresh ? request.waiterTtlMs : state.waiterTtlMs,
    g: granted
  })

/** Where an attempt's node stands, as its two round trips found it. */
interface Standing {
  readonly _tag: "Standing"
  readonly lockPath: string
  /** The attempt made a new node (rather than refreshing its waiting one). */
  readonly fresh: boolean
  /** What the waiting node said before this attempt's heartbeat. */
  readonly previous: Buffer | undefined
  /** The outcome of the node's own write. */
  readonly written: Outcome | undefined
  /** The outcome of reading the key's fence floor. */
  readonly floor: Outcome | undefined
  readonly ownPath: string
  /** The node after the write: its zxids, and the server's time of the write. */
  readonly ownStat: Stat
  /** The nodes before it, in sequence order. */
  readonly before: ReadonlyArray<Seen>
}

/** What an attempt's round trips found: where its node stands, or why it must start again. */
type Sighting = { readonly _tag: "Vanished"; readonly why: string } | Standing

/**
 * The attempt's round trips: the contender's own write (a new node, or its waiting node
 * refreshed: a heartbeat) with the key's children and fence floor, then the data of the nodes
 * before it with its own node's stat.
 */
const sight = (ctx: BackendContext, request: LockBackend.AcquireRequest, state: Holder): Effect.Effect<Sighting, BackendError> =>
  Effect.gen(function*() {
    const lockPath = ctx.layout.lock(request.key)
    if (state.path !== undefined && state.epoch !== ctx.session.epoch()) state.path = undefined // gone with its session
    const fresh = state.path === undefined
    if (fresh) state.epoch = ctx.session.epoch()
    const previous = state.waiting
    if (!fresh) state.waiting = attemptData(request, state, fresh, 0)
    // the key's node is created only when this backend has not seen it lately: a create that
    // finds it is a write through the leader all the same
    const known = ctx.keyNodes.has(lockPath)
    const sent = yield* ctx.send("acquire", [
      ...(known ? [] : [{ _tag: "create", path: lockPath, data: Buffer.alloc(0), mode: Zk.CreateMode.PERSISTENT } as const]),
      fresh
        ? {
          _tag: "create",
          path: `${lockPath}/${nodeName(request)}`,
          data: attemptData(request, state, fresh, 1),
          mode: Zk.CreateMode.EPHEMERAL_SEQUENTIAL
        }
        : { _tag: "setData", path: state.path!, data: attemptData(request, state, fresh, 0), version: -1 },
      { _tag: "getChildren", path: lockPath },
      { _tag: "getData", path: ctx.layout.fence(request.key) }
    ])
    if (!known) yield* ctx.expect("acquire", sent[0], Code.nodeExists)
    const first = known ? sent : sent.slice(1)
    const written = first[0]
    if (codeOf(written) === Code.noNode) {
      // fresh: the key's node is gone (swept, its contenders all gone); else our waiting node
      // is gone (expired, or forced out): a new node either way
      ctx.keyNodes.delete(lockPath)
      state.path = undefined
      return { _tag: "Vanished", why: "the key's node kept vanishing" } as const
    }
    ctx.keyNodes.used(lockPath)
    yield* ctx.expect("acquire", written)
    yield* ctx.expect("acquire", first[1], Code.noNode)
    yield* ctx.expect("acquire", first[2], Code.noNode)
    if (fresh) {
      state.path = replyOf(written, "created")!.path
      state.unsure = false
    }
    const ownPath = state.path!
    const ownName = ownPath.slice(lockPath.length + 1)
    const all = contendersOf(first[1])
    const index = all.findIndex((c) => c.name === ownName)
    const read = yield* readNodes(ctx, "acquire", lockPath, index === -1 ? [] : all.slice(0, index), [{ _tag: "exists", path: ownPath }])
    const ownStat: Stat | undefined = replyOf(read.extra[0], "exists")?.stat
    if (index === -1 || ownStat === undefined) {
      // deleted as soon as written (expired, or forced out)
      state.path = undefined
      return { _tag: "Vanished", why: "the contender's node kept vanishing" } as const
    }
    state.mtime = ownStat.mtime
    ctx.clock.saw(ownStat.mtime)
    return { _tag: "Standing", lockPath, fresh, previous, written, floor: first[2], ownPath, ownStat, before: read.seen } as const
  })

/**
 * A node of this backend's that none of its holders has, and none is making: left by a create
 * whose answer was lost and whose clean-up failed too.
 */
const isOrphan = (ctx: BackendContext, key: string, lockPath: string, contender: Contender): boolean => {
  if (!contender.holder.startsWith(ctx.ours)) return false
  const id = idOf(key, contender.holder)
  return !ctx.holders.isBusy(id) && ctx.holders.get(id)?.path !== `${lockPath}/${contender.name}`
}

/**
 * One attempt, in two round trips (`sight`). Expired nodes are deleted and the attempt judged
 * again. A denied attempt watches what blocks it and, unless fair, deletes the node it made.
 */
const attempt = (
  ctx: BackendContext,
  request: LockBackend.AcquireRequest,
  state: Holder,
  id: string,
  tries: number
): Effect.Effect<LockBackend.AcquireResult, BackendError | InvalidLockOptions> =>
  Effect.gen(function*() {
    const again = (why: string) =>
      tries >= 5 ? Effect.fail(ctx.lifecycle.failure("acquire")(new Error(why))) : attempt(ctx, request, state, id, tries + 1)
    const sighting = yield* sight(ctx, request, state)
    if (sighting._tag === "Vanished") return yield* again(sighting.why)
    const standing = sighting
    const now = standing.ownStat.mtime
    // an orphan goes like an expired node
    const orphans = standing.before.filter((n) => isOrphan(ctx, request.key, standing.lockPath, n.contender))
    const judged = judge(orphans.length === 0 ? standing.before : standing.before.filter((n) => !orphans.includes(n)), now)
    const live = judged.live
    if (!(yield* dropExpired(ctx, "acquire", standing.lockPath, [...judged.expired, ...orphans]))) {
      return yield* again("expired nodes kept being renewed")
    }
    // a shared request naming another limit than the key's live shared nodes
    if (request.mode === "shared") {
      const other = limitConflict(live, request)
      if (other !== undefined) return yield* refuseLimit(ctx, request, state, id, standing, other)
    }
    // a fair request waits behind every waiter before it, also one that would fit beside it
    if (mayHold(live, request) && !(request.fair && live.some((n) => !isHolder(n)))) {
      const granted = yield* grant(ctx, request, state, standing)
      return granted ?? (yield* again("the contender's node kept vanishing"))
    }
    return yield* deny(ctx, request, state, id, standing, live)
  })

/** Refuses a limit other than the key's: a node the attempt made goes, a queue entry stays as it was. */
const refuseLimit = (
  ctx: BackendContext,
  request: LockBackend.AcquireRequest,
  state: Holder,
  id: string,
  standing: Standing,
  other: Judged
): Effect.Effect<never, BackendError | InvalidLockOptions> =>
  Effect.gen(function*() {
    if (standing.fresh) {
      const outcomes = yield* ctx.send("acquire", [{ _tag: "remove", path: standing.ownPath, version: -1 }])
      state.path = undefined
      yield* ctx.expect("acquire", outcomes[0], Code.noNode)
      ctx.holders.delete(id)
    } else {
      state.waiting = standing.previous
      if (standing.previous !== undefined) {
        const restored = (yield* ctx.send("acquire", [{ _tag: "setData", path: standing.ownPath, data: standing.previous, version: -1 }]))[0]
        yield* ctx.expect("acquire", restored, Code.noNode)
      }
    }
    return yield* Effect.fail(Rules.limitMismatch(request.key, other.data!.m, request.limit))
  })

/** Grants the attempt; `undefined` if the waiting node let in was gone before it could say so. */
const grant = (
  ctx: BackendContext,
  request: LockBackend.AcquireRequest,
  state: Holder,
  standing: Standing
): Effect.Effect<LockBackend.AcquireResult | undefined, BackendError> =>
  Effect.gen(function*() {
    // the fence: the zxid of this attempt's first write (a new node's creation; a waiter's
    // heartbeat, as its node is older than the grants made while it waited)
    const fence = (standing.fresh ? standing.ownStat.czxid : replyOf(standing.written, "stat")!.stat.mzxid) + floorOf(standing.floor)
    if (!standing.fresh) {
      // a waiter let in: its node says so from now on, and lasts its lease
      const confirmed = (yield* ctx.send("acquire", [
        { _tag: "setData", path: standing.ownPath, data: attemptData(request, state, standing.fresh, 1, fence), version: -1 }
      ]))[0]
      const stat = replyOf(confirmed, "stat")
      if (stat === undefined) {
        yield* ctx.expect("acquire", confirmed, Code.noNode)
        state.path = undefined
        return undefined
      }
      state.mtime = stat.stat.mtime
    }
    state.fence = fence
    if (request.mode === "exclusive") state.exclusive = 1
    else {
      state.shared = 1
      state.permits = request.permits
      state.limit = request.limit
    }
    return { _tag: "Granted", fence: state.fence, count: 1 } as const
  })

/**
 * Denies the attempt, and watches what must change to let it in (the recipe: a release wakes the
 * waiter it lets in). A writer watches the node just before it; a reader the nearest writer
 * before it or, kept out by permits, every node before it.
 */
const deny = (
  ctx: BackendContext,
  request: LockBackend.AcquireRequest,
  state: Holder,
  id: string,
  standing: Standing,
  live: ReadonlyArray<Judged>
): Effect.Effect<LockBackend.AcquireResult, BackendError> =>
  Effect.gen(function*() {
    const { fresh, lockPath, ownPath } = standing
    const writers = live.filter(excludesReaders)
    const blockers = request.mode === "exclusive" ? live.slice(-1) : writers.length > 0 ? writers.slice(-1) : live
    if (request.fair && !fresh) state.waiterTtlMs = request.waiterTtlMs
    const requests: Array<Request> = []
    // a node this attempt made: a waiter's stays (now saying it waits), a try's goes
    const keep = request.fair || ctx.wakeups.isWaiting(id)
    if (fresh && keep) state.waiting = attemptData(request, state, fresh, 0)
    if (fresh) {
      requests.push(
        keep
          ? { _tag: "setData", path: ownPath, data: attemptData(request, state, fresh, 0), version: -1 }
          : { _tag: "remove", path: ownPath, version: -1 }
      )
    }
    // an attempt of nobody who waits (a try, or the first attempt before the subscription)
    // watches nothing: there is no one to wake
    if (keep && ctx.wakeups.isWaiting(id)) {
      for (const node of blockers) {
        const path = `${lockPath}/${node.contender.name}`
        ctx.wakeups.watch(path, id, request.mode === "shared")
        requests.push({ _tag: "exists", path, watch: ctx.wakeups.watcher })
      }
    }
    const outcomes = yield* ctx.send("acquire", requests)
    if (fresh) {
      yield* ctx.expect("acquire", outcomes[0], Code.noNode)
      if (!keep || codeOf(outcomes[0]) === Code.noNode) state.path = undefined
      if (!keep) ctx.holders.delete(id)
    }
    // a blocker gone before its watch was set: try again at once
    if (outcomes.slice(fresh ? 1 : 0).some((o) => replyOf(o, "exists")?.stat === undefined)) ctx.wakeups.wake(id)
    return { _tag: "Denied", retryAfterMs: retryAfterMs(request, live, standing.ownStat.mtime) } as const
  })

/**
 * How long waiting is useful: until the earliest of the holds that keep the request out (none,
 * if only waiters before it do) and the waiters before it expires.
 */
const retryAfterMs = (request: LockBackend.AcquireRequest, live: ReadonlyArray<Judged>, now: number): number => {
  const held = live.filter(isHolder)
  const holdsBlock = !mayHold(held, request)
  const heldWriters = held.filter(excludesReaders)
  const blocking = !holdsBlock ? [] : request.mode === "exclusive" || heldWriters.length === 0 ? held : heldWriters
  const earliest = Math.min(...blocking.map((n) => n.expiresAt), ...live.filter((n) => !isHolder(n)).map((n) => n.expiresAt))
  return Math.max(1, Number.isFinite(earliest) ? earliest - now : 1)
}

/**
 * A holder that holds asks again: re-entry, a writer taking the read lock, or a copy of an
 * applied grant, each a write that also renews its node; a reader asking for the write lock is
 * refused.
 */
const reenter = (
  ctx: BackendContext,
  request: LockBackend.AcquireRequest,
  state: Holder,
  id: string
): Effect.Effect<LockBackend.AcquireResult, BackendError | InvalidLockOptions | NotHeld | LockUpgradeNotSupported> =>
  Effect.gen(function*() {
    const notHeld = () => {
      ctx.holders.markEnded(id, request.leaseMs)
      return Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
    }
    if (state.epoch !== ctx.session.epoch()) return yield* notHeld()
    if (request.mode === "shared" && state.shared > 0 && state.limit !== request.limit) {
      return yield* Effect.fail(Rules.limitMismatch(request.key, state.limit, request.limit))
    }
    const count = request.mode === "exclusive" ? state.exclusive : state.shared
    if (count === 0 && request.mode === "exclusive") {
      // a reader asking for the write lock, unless its hold is gone meanwhile
      const found = (yield* ctx.send("acquire", [{ _tag: "exists", path: state.path! }]))[0]
      yield* ctx.expect("acquire", found)
      if (replyOf(found, "exists")?.stat === undefined) return yield* notHeld()
      return yield* Effect.fail(new LockUpgradeNotSupported({ key: request.key, holder: request.holder }))
    }
    // the node must still be there
    const before = { exclusive: state.exclusive, shared: state.shared, permits: state.permits, limit: state.limit, leaseMs: state.leaseMs }
    if (request.mode === "exclusive") state.exclusive = request.count
    else {
      if (count === 0) {
        // a writer taking the read lock: its shared hold counts from now on
        state.permits = request.permits
        state.limit = request.limit
      }
      state.shared = request.count
    }
    state.leaseMs = Math.max(state.leaseMs, request.leaseMs)
    const outcome = (yield* ctx.send("acquire", [{ _tag: "setData", path: state.path!, data: heldData(state), version: -1 }]))[0]
    const stat = replyOf(outcome, "stat")
    if (stat === undefined) {
      Object.assign(state, before)
      yield* ctx.expect("acquire", outcome, Code.noNode)
      return yield* notHeld()
    }
    state.mtime = stat.stat.mtime
    return { _tag: "Granted", fence: state.fence!, count: request.count } as const
  })

/** A request refused either way; a limit that differs from the key's is named first, as the rules do. */
const refuse = (ctx: BackendContext, request: LockBackend.AcquireRequest): Effect.Effect<never, BackendError | InvalidLockOptions | NotHeld> =>
  Effect.gen(function*() {
    if (request.mode === "shared") {
      const { seen } = yield* readKey(ctx, "acquire", request.key)
      const other = limitConflict(judge(seen, ctx.clock.now()).live, request)
      if (other !== undefined) return yield* Effect.fail(Rules.limitMismatch(request.key, other.data!.m, request.limit))
    }
    return yield* Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
  })

export const acquire = (
  ctx: BackendContext,
  request: LockBackend.AcquireRequest
): Effect.Effect<LockBackend.AcquireResult, BackendError | InvalidLockOptions | LockUpgradeNotSupported | NotHeld> =>
  ctx.holders.inTurn(request.key, request.holder, (id, known) =>
    Effect.gen(function*() {
      if (request.mode === "shared" && request.permits > request.limit) {
        return yield* Effect.fail(Rules.permitsExceedLimit(request.key, request.permits, request.limit))
      }
      if (known !== undefined && known.fence !== undefined) return yield* reenter(ctx, request, known, id)
      // more than one: the caller believes it holds; ended: a late copy of a request
      if (request.count > 1 || ctx.holders.hasEnded(id) || ctx.holders.wasUnheld(id)) return yield* refuse(ctx, request)
      const state = known ?? newHolder(request, ctx.session.epoch())
      state.leaseMs = request.leaseMs
      // a waiting node keeps the timeout of the fair request that queued it
      if (state.path === undefined) {
        state.fair = request.fair
        // a non-fair waiter tries again once per waiter timeout, a fair one three times
        state.waiterTtlMs = request.fair ? request.waiterTtlMs : 3 * request.waiterTtlMs
      }
      ctx.holders.set(id, state)
      return yield* attempt(ctx, request, state, id, 0).pipe(
        Effect.tapError((error) =>
          Effect.sync(() => {
            // no answer to a create: the node may exist; a clean-up looks for it by prefix
            if (error._tag === "BackendError" && state.path === undefined) state.unsure = true
          })
        )
      )
    }))
