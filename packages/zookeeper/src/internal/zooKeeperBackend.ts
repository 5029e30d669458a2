/**
 * The ZooKeeper interpreter of the lock algebra: every hold and every waiter is an ephemeral
 * sequential node under the key's node; a node's standing follows from the nodes before it
 * (`queue.ts`); a waiter watches the one live node just before it; a fence is the zxid of the
 * first write of the attempt that was granted (a new node's creation, a waiter's heartbeat), plus
 * the key's raised floor, if any.
 *
 * A holder's own bookkeeping (its counts, its node, whether it ended) lives in this process:
 * only this backend acts as its holders, so every copy of a request of theirs passes here, one
 * at a time per holder. What others must see (the node, its counts, its lease) is in ZooKeeper.
 */
import type { Scope } from "effect"
import { Duration, Effect, Either, Schedule } from "effect"
import { LockBackend, Rules } from "@lockstep/core"
import type { InvalidLockOptions } from "@lockstep/core/LockError"
import { backendClosed, BackendError, LockUpgradeNotSupported, NotHeld } from "@lockstep/core/LockError"
import * as Zk from "node-zookeeper-client"
import type { Contender } from "./layout.js"
import { decodeData, decodeFloor, encodeData, encodeFloor, nodeName, parseContender, paths, prefixOf } from "./layout.js"
import type { Judged, Seen } from "./queue.js"
import { excludesReaders, isHolder, judge, mayHold } from "./queue.js"
import type { Session } from "./session.js"
import type { Outcome, Reply, Request, Stat } from "./zk.js"
import { batch, Code, codeOf, ZkFailure } from "./zk.js"

export interface Settings {
  readonly namespace: string
  readonly commandTimeoutMs: number
  readonly sweepIntervalMs: number
  readonly endpoint: string
}

/** One holder of one key, as this backend keeps it. */
interface Holder {
  readonly key: string
  readonly holder: string
  /** Its node's full path once known. */
  path: string | undefined
  /** A `create` was sent whose answer never came: the node may exist under the holder's prefix. */
  unsure: boolean
  exclusive: number
  shared: number
  permits: number
  limit: number
  /** Its node is a fair queue entry, which only `cancel` gives up. */
  fair: boolean
  /** What its waiting node last said. */
  waiting: Buffer | undefined
  /** Set once granted. */
  fence: number | undefined
  /** The session its node belongs to: gone with it. */
  epoch: number
  /** Server time of the node's last write, and the lease and waiter timeout it wrote. */
  mtime: number
  leaseMs: number
  waiterTtlMs: number
}

/** A holder's node data once it holds. */
const bufferOf = (holder: Holder): Buffer =>
  encodeData({
    x: holder.exclusive,
    s: holder.shared,
    p: holder.permits,
    m: holder.limit,
    l: holder.leaseMs,
    w: holder.waiterTtlMs,
    g: 1,
    f: holder.fence
  })

/** A shared holder of the key whose limit is not the request's: the key's stored limit, as the rules keep it. */
const limitConflict = (live: ReadonlyArray<Judged>, request: LockBackend.AcquireRequest): Judged | undefined =>
  live.find((n) => isHolder(n) && n.data!.s > 0 && n.data!.m !== request.limit)

const reply = <T extends Reply["_tag"]>(outcome: Outcome | undefined, tag: T): Extract<Reply, { _tag: T }> | undefined =>
  outcome !== undefined && !(outcome instanceof ZkFailure) && outcome._tag === tag ? (outcome as Extract<Reply, { _tag: T }>) : undefined

const describe = (cause: unknown): string =>
  cause instanceof ZkFailure && cause.code === Code.sessionExpired
    ? "the ZooKeeper session expired: its holds are gone"
    : cause instanceof ZkFailure && cause.code === Code.connectionLoss
    ? "the connection to ZooKeeper was lost (the request may or may not have been applied)"
    : cause instanceof ZkFailure && cause.code === Code.noAuth
    ? `not allowed by ZooKeeper's ACL (${cause.message})`
    : cause instanceof Error
    ? cause.message
    : String(cause)

export const make = (
  session: Session,
  settings: Settings
): Effect.Effect<LockBackend.Service, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const { commandTimeoutMs, endpoint } = settings
    const layout = paths(settings.namespace)
    const clientId = crypto.randomUUID()
    let closed = false
    const failure = (operation: string) => (cause: unknown): BackendError =>
      closed
        ? backendClosed({ operation, backend: "ZooKeeper backend", endpoint })
        : new BackendError({ operation, cause, endpoint, detail: describe(cause) })

    /** One round trip: the requests in order, each with its own outcome. */
    const send = (operation: string, requests: ReadonlyArray<Request>): Effect.Effect<ReadonlyArray<Outcome>, BackendError> =>
      closed
        ? Effect.fail(failure(operation)(undefined))
        : Effect.mapError(batch(session.client(), requests, commandTimeoutMs), failure(operation))

    /** A request whose refusal is an error of the operation, unless `allowed`. */
    const expect = (operation: string, outcome: Outcome | undefined, ...allowed: ReadonlyArray<number>): Effect.Effect<void, BackendError> =>
      outcome instanceof ZkFailure && !allowed.includes(outcome.code) ? Effect.fail(failure(operation)(outcome)) : Effect.void

    // the namespace (each of its ancestors too) and its three folders
    const ancestors = layout.root.split("/").filter((part) => part !== "").map((_, i, parts) => `/${parts.slice(0, i + 1).join("/")}`)
    const folders = [...ancestors, layout.locks, layout.latches, layout.fences]
    const prepared = yield* send(
      "connect",
      folders.map((path) => ({ _tag: "create", path, data: Buffer.alloc(0), mode: Zk.CreateMode.PERSISTENT }))
    )
    for (const outcome of prepared) yield* expect("connect", outcome, Code.nodeExists)

    // ---- server time ------------------------------------------------------------------------
    // the ensemble's clock as last seen in a write's answer, carried forward on the local clock:
    // only for what `inspect` reports (every decision uses the time of its own write)
    let clockOffset = 0
    const sawServerTime = (mtime: number) => {
      clockOffset = mtime - Date.now()
    }
    const serverNow = () => Date.now() + clockOffset

    // ---- the keys' nodes -------------------------------------------------------------------
    // A key's node stays between its uses (creating and deleting it for every grant would be two
    // more writes through the leader each time); the keys this backend used are swept: once
    // unused for a sweep interval, their node is deleted if no contender is under it.
    const keyNodes = new Map<string, number>()
    const sweep = Effect.suspend(() => {
      const now = Date.now()
      const idle = [...keyNodes].filter(([, lastUsed]) => now - lastUsed >= settings.sweepIntervalMs).map(([path]) => path)
      for (const path of idle) keyNodes.delete(path)
      return idle.length === 0 ? Effect.void : Effect.ignore(send("sweep", idle.map((path): Request => ({ _tag: "remove", path, version: -1 }))))
    })
    yield* Effect.forkScoped(Effect.interruptible(Effect.repeat(sweep, Schedule.spaced(Duration.millis(settings.sweepIntervalMs)))))

    // ---- holders ----------------------------------------------------------------------------
    const holders = new Map<string, Holder>()
    /** Holders that ended (or that this backend refused), until when they are remembered (local ms). */
    const ended = new Map<string, number>()
    const idOf = (key: string, holder: string) => `${key}\u0000${holder}`
    const hasEnded = (id: string): boolean => {
      const until = ended.get(id)
      if (until === undefined) return false
      if (until > Date.now()) return true
      ended.delete(id)
      return false
    }
    const remember = (id: string, leaseMs: number) => {
      holders.delete(id)
      ended.delete(id)
      ended.set(id, Date.now() + leaseMs)
      // the oldest entries come first: drop those that have passed
      const now = Date.now()
      for (const [old, until] of ended) {
        if (until > now) break
        ended.delete(old)
      }
    }

    /** A holder refused a release (it held nothing): a late copy of its acquisition grants nothing. */
    const rememberUnheld = (id: string, leaseMs: number) => {
      ended.delete(`!${id}`)
      ended.set(`!${id}`, Date.now() + leaseMs)
    }

    // one request at a time per holder: copies of a request, a renewal and a release of the
    // same holder see each other's effects
    const busy = new Map<string, Array<() => void>>()
    const serialized = <A, E>(id: string, effect: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.zipRight(
          Effect.async<void>((resume) => {
            const queue = busy.get(id)
            if (queue === undefined) {
              busy.set(id, [])
              resume(Effect.void)
              return
            }
            const turn = () => resume(Effect.void)
            queue.push(turn)
            return Effect.sync(() => {
              const index = queue.indexOf(turn)
              if (index >= 0) queue.splice(index, 1)
            })
          }),
          Effect.ensuring(restore(effect), Effect.sync(() => {
            const queue = busy.get(id)
            const next = queue?.shift()
            if (next === undefined) busy.delete(id)
            else next()
          }))
        )
      )

    // ---- wake-ups ---------------------------------------------------------------------------
    // A waiter's attempt watches what blocks it (ZooKeeper calls back once, when the node changes
    // or goes): a writer the node just before its own, a reader the nearest writer before it or,
    // blocked by permits, the nodes before it.
    interface Waiter {
      pending: boolean
      readonly resumers: Set<() => void>
    }
    const waiters = new Map<string, Waiter>()
    /**
     * Which waiters a watched node's change wakes: each with whether a rewrite of the node (a
     * heartbeat, a renewal, a holder confirmed, a writer keeping only its read lock) may let it
     * in. Only its deletion lets a writer in: for a writer, a rewrite re-arms the watch.
     */
    const watching = new Map<string, Map<string, boolean>>()
    const wake = (id: string) => {
      const waiter = waiters.get(id)
      if (waiter === undefined) return
      if (waiter.resumers.size === 0) {
        waiter.pending = true
        return
      }
      const resumers = [...waiter.resumers]
      waiter.resumers.clear()
      for (const resumer of resumers) resumer()
    }
    const watch = (path: string, id: string, onRewrite: boolean) => {
      let ids = watching.get(path)
      if (ids === undefined) {
        ids = new Map()
        watching.set(path, ids)
      }
      ids.set(id, onRewrite)
    }
    /** One watcher function for every node: the client registers it once per node. */
    const watcher = (event: Zk.Event) => {
      const path = event.getPath()
      const ids = watching.get(path)
      if (ids === undefined) return
      watching.delete(path)
      const rewritten = event.getType() === Zk.Event.NODE_DATA_CHANGED
      const rearm: Array<string> = []
      for (const [id, onRewrite] of ids) {
        if (!rewritten || onRewrite) wake(id)
        else if (waiters.has(id)) rearm.push(id) // a waiter that left needs no watch
      }
      if (rearm.length === 0 || closed) return
      for (const id of rearm) watch(path, id, false)
      const gone = () => {
        for (const id of rearm) {
          watching.get(path)?.delete(id)
          wake(id)
        }
      }
      try {
        session.client().exists(path, watcher, (error, stat) => {
          if (error || !stat) gone()
        })
      } catch {
        gone()
      }
    }
    /** `leave`: what the waiter's leaving undoes (its place in the queue), best-effort. */
    const subscribeAs = (id: string, leave: Effect.Effect<void>): Effect.Effect<LockBackend.Subscription, never, Scope.Scope> =>
      Effect.map(
        Effect.acquireRelease(
          Effect.sync(() => {
            const waiter: Waiter = { pending: false, resumers: new Set() }
            waiters.set(id, waiter)
            return waiter
          }),
          (waiter) =>
            Effect.suspend(() => {
              if (waiters.get(id) !== waiter) return Effect.void
              waiters.delete(id)
              return leave
            })
        ),
        (waiter) =>
          LockBackend.subscriptionOf((wakeUp) => {
            if (waiter.pending || closed) {
              waiter.pending = false
              wakeUp(Effect.void)
              return () => undefined
            }
            const resumer = () => wakeUp(Effect.void)
            waiter.resumers.add(resumer)
            return () => void waiter.resumers.delete(resumer)
          })
      )

    /**
     * A waiter of a non-fair kind keeps its node while subscribed (its place: no herd, no
     * attempts that keep cancelling each other) and gives it up when it leaves ungranted. A fair
     * waiter's place is given up by `cancel`.
     */
    const leaveQueue = (key: string, holder: string): Effect.Effect<void> => {
      const id = idOf(key, holder)
      return Effect.ignore(serialized(
        id,
        Effect.suspend(() => {
          const state = holders.get(id)
          if (state === undefined || state.fence !== undefined || state.fair || state.path === undefined) return Effect.void
          holders.delete(id)
          return Effect.asVoid(forget("leave", state))
        })
      ))
    }

    // ---- reading a key ----------------------------------------------------------------------
    /** The contenders of a key from its children, in sequence order. */
    const contendersOf = (outcome: Outcome | undefined): Array<Contender> => {
      const children = reply(outcome, "children")?.children ?? []
      const list: Array<Contender> = []
      for (const child of children) {
        const contender = parseContender(child)
        if (contender !== undefined) list.push(contender)
      }
      return list.sort((a, b) => a.sequence - b.sequence)
    }

    /** Reads the data of `contenders` (one round trip); a node that is gone is left out. */
    const readNodes = (
      operation: string,
      lockPath: string,
      contenders: ReadonlyArray<Contender>,
      extra: ReadonlyArray<Request> = []
    ): Effect.Effect<{ readonly seen: Array<Seen>; readonly extra: ReadonlyArray<Outcome> }, BackendError> =>
      Effect.flatMap(
        send(operation, [
          ...extra,
          ...contenders.map((c): Request => ({ _tag: "getData", path: `${lockPath}/${c.name}` }))
        ]),
        (outcomes) =>
          Effect.gen(function*() {
            const seen: Array<Seen> = []
            for (let i = 0; i < contenders.length; i++) {
              const outcome = outcomes[extra.length + i]
              yield* expect(operation, outcome, Code.noNode)
              const data = reply(outcome, "data")
              if (data === undefined) continue
              seen.push({
                contender: contenders[i]!,
                data: decodeData(data.data),
                mtime: data.stat.mtime,
                version: data.stat.version,
                czxid: data.stat.czxid
              })
            }
            return { seen, extra: outcomes.slice(0, extra.length) }
          })
      )

    /** Deletes expired nodes, each only if unchanged since it was judged expired. */
    const dropExpired = (operation: string, lockPath: string, expired: ReadonlyArray<Seen>) =>
      expired.length === 0
        ? Effect.succeed(true)
        : Effect.flatMap(
          send(operation, expired.map((node): Request => ({ _tag: "remove", path: `${lockPath}/${node.contender.name}`, version: node.version }))),
          // a node renewed meanwhile is live after all: judge again
          (outcomes) => Effect.succeed(outcomes.every((o) => codeOf(o) !== Code.badVersion))
        )

    const floorOf = (outcome: Outcome | undefined): number => {
      const data = reply(outcome, "data")
      return data === undefined ? 0 : decodeFloor(data.data)
    }

    const ours = `${clientId}:`
    const isOrphan = (key: string, lockPath: string, contender: Contender): boolean => {
      if (!contender.holder.startsWith(ours)) return false
      const id = idOf(key, contender.holder)
      return !busy.has(id) && holders.get(id)?.path !== `${lockPath}/${contender.name}`
    }

    // ---- acquire ----------------------------------------------------------------------------
    /**
     * One attempt, in two round trips: the contender's own write (a new node, or its waiting
     * node refreshed: a heartbeat) with the key's children and fence floor, then the data of the
     * nodes before it with its own node's stat (its zxid, and the server's time of the write).
     * Expired nodes are deleted and the attempt judged again. A denied attempt watches what
     * blocks it and, unless fair, deletes the node it made.
     */
    const attempt = (
      request: LockBackend.AcquireRequest,
      state: Holder,
      id: string,
      tries: number
    ): Effect.Effect<LockBackend.AcquireResult, BackendError | InvalidLockOptions> =>
      Effect.gen(function*() {
        const again = (why: string) =>
          tries >= 5 ? Effect.fail(failure("acquire")(new Error(why))) : attempt(request, state, id, tries + 1)
        const lockPath = layout.lock(request.key)
        if (state.path !== undefined && state.epoch !== session.epoch()) state.path = undefined // gone with its session
        const fresh = state.path === undefined
        if (fresh) state.epoch = session.epoch()
        // a new node says it holds at once (the common case: nobody before it); a waiting node's
        // heartbeat says it waits
        const intended = (granted: 0 | 1, fence?: number) =>
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
        const previous = state.waiting
        if (!fresh) state.waiting = intended(0)
        // the key's node is created only when this backend has not seen it lately: a create
        // that finds it is a write through the leader all the same
        const known = keyNodes.has(lockPath)
        const sent = yield* send("acquire", [
          ...(known ? [] : [{ _tag: "create", path: lockPath, data: Buffer.alloc(0), mode: Zk.CreateMode.PERSISTENT } as const]),
          fresh
            ? { _tag: "create", path: `${lockPath}/${nodeName(request)}`, data: intended(1), mode: Zk.CreateMode.EPHEMERAL_SEQUENTIAL }
            : { _tag: "setData", path: state.path!, data: intended(0), version: -1 },
          { _tag: "getChildren", path: lockPath },
          { _tag: "getData", path: layout.fence(request.key) }
        ])
        if (!known) yield* expect("acquire", sent[0], Code.nodeExists)
        const first = known ? sent : sent.slice(1)
        const written = first[0]
        if (codeOf(written) === Code.noNode) {
          // fresh: the key's node is gone (swept, its contenders all gone); else our waiting node
          // is gone (expired, or forced out): a new node either way
          keyNodes.delete(lockPath)
          state.path = undefined
          return yield* again("the key's node kept vanishing")
        }
        keyNodes.set(lockPath, Date.now())
        yield* expect("acquire", written)
        yield* expect("acquire", first[1], Code.noNode)
        yield* expect("acquire", first[2], Code.noNode)
        if (fresh) {
          state.path = reply(written, "created")!.path
          state.unsure = false
        }
        const ownPath = state.path!
        const ownName = ownPath.slice(lockPath.length + 1)
        const all = contendersOf(first[1])
        const index = all.findIndex((c) => c.name === ownName)
        const read = yield* readNodes("acquire", lockPath, index === -1 ? [] : all.slice(0, index), [{ _tag: "exists", path: ownPath }])
        const ownStat: Stat | undefined = reply(read.extra[0], "exists")?.stat
        if (index === -1 || ownStat === undefined) {
          // deleted as soon as written (expired, or forced out)
          state.path = undefined
          return yield* again("the contender's node kept vanishing")
        }
        state.mtime = ownStat.mtime
        sawServerTime(ownStat.mtime)
        const now = ownStat.mtime
        // a node of this backend's that none of its holders has, and none is making: left by a
        // create whose answer was lost and whose clean-up failed too; it goes like an expired one
        const orphans = read.seen.filter((n) => isOrphan(request.key, lockPath, n.contender))
        const judged = judge(orphans.length === 0 ? read.seen : read.seen.filter((n) => !orphans.includes(n)), now)
        const live = judged.live
        if (!(yield* dropExpired("acquire", lockPath, [...judged.expired, ...orphans]))) {
          return yield* again("expired nodes kept being renewed")
        }

        const dropOwn = (): Effect.Effect<void, BackendError> =>
          Effect.flatMap(send("acquire", [{ _tag: "remove", path: ownPath, version: -1 }]), (outcomes) => {
            state.path = undefined
            return expect("acquire", outcomes[0], Code.noNode)
          })
        // a shared request naming another limit than the key's live shared nodes
        if (request.mode === "shared") {
          const other = limitConflict(live, request)
          if (other !== undefined) {
            if (fresh) yield* dropOwn()
            else {
              // a refused request leaves the queue entry as it was
              state.waiting = previous
              if (previous !== undefined) {
                const restored = (yield* send("acquire", [{ _tag: "setData", path: ownPath, data: previous, version: -1 }]))[0]
                yield* expect("acquire", restored, Code.noNode)
              }
            }
            if (fresh) holders.delete(id)
            return yield* Effect.fail(Rules.limitMismatch(request.key, other.data!.m, request.limit))
          }
        }
        // a fair request waits behind every waiter before it, also one that would fit beside it
        if (mayHold(live, request) && !(request.fair && live.some((n) => !isHolder(n)))) {
          // the fence: the zxid of this attempt's first write (a new node's creation; a waiter's
          // heartbeat, as its node is older than the grants made while it waited)
          const fence = (fresh ? ownStat.czxid : reply(written, "stat")!.stat.mzxid) + floorOf(first[2])
          if (!fresh) {
            // a waiter let in: its node says so from now on, and lasts its lease
            const confirmed = (yield* send("acquire", [{ _tag: "setData", path: ownPath, data: intended(1, fence), version: -1 }]))[0]
            const stat = reply(confirmed, "stat")
            if (stat === undefined) {
              yield* expect("acquire", confirmed, Code.noNode)
              state.path = undefined
              return yield* again("the contender's node kept vanishing")
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
        }

        // denied: watch what must change to let us in (the recipe: a release wakes the waiter
        // it lets in). A writer watches the node just before it; a reader the nearest writer
        // before it or, kept out by permits, every node before it.
        const writers = live.filter(excludesReaders)
        const blockers = request.mode === "exclusive" ? live.slice(-1) : writers.length > 0 ? writers.slice(-1) : live
        if (request.fair && !fresh) state.waiterTtlMs = request.waiterTtlMs
        const requests: Array<Request> = []
        // a node this attempt made: a waiter's stays (now saying it waits), a try's goes
        const keep = request.fair || waiters.has(id)
        if (fresh && keep) state.waiting = intended(0)
        if (fresh) {
          requests.push(
            keep
              ? { _tag: "setData", path: ownPath, data: intended(0), version: -1 }
              : { _tag: "remove", path: ownPath, version: -1 }
          )
        }
        // an attempt of nobody who waits (a try, or the first attempt before the subscription)
        // watches nothing: there is no one to wake
        if (keep && waiters.has(id)) {
          for (const node of blockers) {
            const path = `${lockPath}/${node.contender.name}`
            watch(path, id, request.mode === "shared")
            requests.push({ _tag: "exists", path, watch: watcher })
          }
        }
        const outcomes = yield* send("acquire", requests)
        if (fresh) {
          yield* expect("acquire", outcomes[0], Code.noNode)
          if (!keep || codeOf(outcomes[0]) === Code.noNode) state.path = undefined
          if (!keep) holders.delete(id)
        }
        // a blocker gone before its watch was set: try again at once
        if (outcomes.slice(fresh ? 1 : 0).some((o) => reply(o, "exists")?.stat === undefined)) wake(id)
        // how long waiting is useful: until the earliest of the holds that keep us out (none, if
        // only waiters before us do) and the waiters before us expires
        const held = live.filter(isHolder)
        const holdsBlock = !mayHold(held, request)
        const heldWriters = held.filter(excludesReaders)
        const blocking = !holdsBlock ? [] : request.mode === "exclusive" || heldWriters.length === 0 ? held : heldWriters
        const earliest = Math.min(...blocking.map((n) => n.expiresAt), ...live.filter((n) => !isHolder(n)).map((n) => n.expiresAt))
        return { _tag: "Denied", retryAfterMs: Math.max(1, Number.isFinite(earliest) ? earliest - now : 1) } as const
      })

    /** Drops the holder's node (best-effort search by prefix when a `create` answer was lost). */
    const forget = (operation: string, state: Holder): Effect.Effect<boolean, BackendError> =>
      Effect.gen(function*() {
        const lockPath = layout.lock(state.key)
        const targets: Array<string> = []
        if (state.path !== undefined) targets.push(state.path)
        if (state.unsure) {
          const listed = yield* send(operation, [{ _tag: "getChildren", path: lockPath }])
          const prefix = prefixOf(state.holder)
          for (const name of reply(listed[0], "children")?.children ?? []) {
            const path = `${lockPath}/${name}`
            if (name.startsWith(prefix) && !targets.includes(path)) targets.push(path)
          }
        }
        if (targets.length === 0) return false
        const outcomes = yield* send(operation, targets.map((path): Request => ({ _tag: "remove", path, version: -1 })))
        for (const outcome of outcomes) yield* expect(operation, outcome, Code.noNode)
        if (keyNodes.has(lockPath)) keyNodes.set(lockPath, Date.now())
        state.path = undefined
        state.unsure = false
        return outcomes.some((o) => codeOf(o) === 0)
      })

    const acquire = (request: LockBackend.AcquireRequest) => {
      const id = idOf(request.key, request.holder)
      return serialized(
        id,
        Effect.gen(function*() {
          if (request.mode === "shared" && request.permits > request.limit) {
            return yield* Effect.fail(Rules.permitsExceedLimit(request.key, request.permits, request.limit))
          }
          const state = holders.get(id)
          if (state !== undefined && state.fence !== undefined && state.epoch !== session.epoch()) {
            remember(id, request.leaseMs)
            return yield* Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
          }
          if (state !== undefined && state.fence !== undefined) {
            if (request.mode === "shared" && state.shared > 0 && state.limit !== request.limit) {
              return yield* Effect.fail(Rules.limitMismatch(request.key, state.limit, request.limit))
            }
            const count = request.mode === "exclusive" ? state.exclusive : state.shared
            if (count === 0 && request.mode === "exclusive") {
              // a reader asking for the write lock, unless its hold is gone meanwhile
              const found = (yield* send("acquire", [{ _tag: "exists", path: state.path! }]))[0]
              yield* expect("acquire", found)
              if (reply(found, "exists")?.stat === undefined) {
                remember(id, request.leaseMs)
                return yield* Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
              }
              return yield* Effect.fail(new LockUpgradeNotSupported({ key: request.key, holder: request.holder }))
            }
            // re-entry, a writer taking the read lock, or a copy of an applied grant: the node
            // must still be there (a write that also renews it)
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
            const outcome = (yield* send("acquire", [{ _tag: "setData", path: state.path!, data: bufferOf(state), version: -1 }]))[0]
            const stat = reply(outcome, "stat")
            if (stat === undefined) {
              Object.assign(state, before)
              yield* expect("acquire", outcome, Code.noNode)
              remember(id, request.leaseMs)
              return yield* Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
            }
            state.mtime = stat.stat.mtime
            return { _tag: "Granted", fence: state.fence, count: request.count } as const
          }
          if (request.count > 1 || hasEnded(id) || hasEnded(`!${id}`)) {
            // refused either way; a limit that differs from the key's is named first, as the rules do
            if (request.mode === "shared") {
              const { seen } = yield* readKey("acquire", request.key)
              const other = limitConflict(judge(seen, serverNow()).live, request)
              if (other !== undefined) return yield* Effect.fail(Rules.limitMismatch(request.key, other.data!.m, request.limit))
            }
            return yield* Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
          }
          const holder: Holder = state ?? {
            key: request.key,
            holder: request.holder,
            path: undefined,
            unsure: false,
            exclusive: 0,
            shared: 0,
            permits: 0,
            limit: request.limit,
            fair: request.fair,
            waiting: undefined,
            fence: undefined,
            epoch: session.epoch(),
            mtime: 0,
            leaseMs: request.leaseMs,
            waiterTtlMs: request.waiterTtlMs
          }
          holder.leaseMs = request.leaseMs
          // a waiting node keeps the timeout of the fair request that queued it
          if (holder.path === undefined) {
            holder.fair = request.fair
            // a non-fair waiter tries again once per waiter timeout, a fair one three times
            holder.waiterTtlMs = request.fair ? request.waiterTtlMs : 3 * request.waiterTtlMs
          }
          holders.set(id, holder)
          return yield* attempt(request, holder, id, 0).pipe(
            Effect.tapError((error) =>
              Effect.sync(() => {
                // no answer to a create: the node may exist; a clean-up looks for it by prefix
                if (error._tag === "BackendError" && holder.path === undefined) holder.unsure = true
              })
            )
          )
        })
      )
    }

    // ---- release, renew, cancel -------------------------------------------------------------
    const release = (request: LockBackend.ReleaseRequest): Effect.Effect<number, BackendError | NotHeld> => {
      const id = idOf(request.key, request.holder)
      return serialized(
        id,
        Effect.gen(function*() {
          const state = holders.get(id)
          const notHeld = new NotHeld({ key: request.key, holder: request.holder })
          if (state === undefined || state.fence === undefined) {
            if (hasEnded(id)) return 0
            // a holder with no hold: a node left by an attempt that failed (its answer lost, or
            // a later request of it) goes; a queue entry stays until it is cancelled or expires
            if (state !== undefined && (state.unsure || (!state.fair && !waiters.has(id)))) {
              yield* forget("release", state)
              if (!state.fair) holders.delete(id)
            }
            rememberUnheld(id, request.leaseMs)
            return yield* Effect.fail(notHeld)
          }
          if (state.epoch !== session.epoch()) {
            remember(id, request.leaseMs)
            return yield* Effect.fail(notHeld)
          }
          const current = request.mode === "exclusive" ? state.exclusive : state.shared
          // a count below the caller's: a copy of a release already applied
          const remaining = current >= request.count ? request.count - 1 : current
          const next = request.mode === "exclusive"
            ? { exclusive: remaining, shared: state.shared }
            : { exclusive: state.exclusive, shared: remaining }
          if (next.exclusive === 0 && next.shared === 0) {
            const removed = yield* forget("release", state)
            remember(id, request.leaseMs)
            if (!removed) return yield* Effect.fail(notHeld)
            return remaining
          }
          const before = { exclusive: state.exclusive, shared: state.shared }
          state.exclusive = next.exclusive
          state.shared = next.shared
          if (state.shared === 0) state.permits = 0
          const outcome = (yield* send("release", [{ _tag: "setData", path: state.path!, data: bufferOf(state), version: -1 }]))[0]
          if (codeOf(outcome) === Code.noNode) {
            Object.assign(state, before)
            remember(id, request.leaseMs)
            return yield* Effect.fail(notHeld)
          }
          yield* expect("release", outcome)
          state.mtime = reply(outcome, "stat")!.stat.mtime
          return remaining
        })
      )
    }

    const renewOne = (request: LockBackend.RenewRequest): Effect.Effect<LockBackend.RenewResult, BackendError> => {
      const id = idOf(request.key, request.holder)
      return serialized(
        id,
        Effect.gen(function*() {
          const state = holders.get(id)
          if (state === undefined || state.fence === undefined || state.path === undefined) return Either.right(false)
          if (state.epoch !== session.epoch()) {
            remember(id, request.leaseMs)
            return Either.right(false)
          }
          const leaseMs = state.leaseMs
          const lastWrite = state.mtime
          state.leaseMs = Math.max(state.leaseMs, request.leaseMs)
          const outcome = (yield* send("renew", [{ _tag: "setData", path: state.path, data: bufferOf(state), version: -1 }]))[0]
          const stat = reply(outcome, "stat")
          if (stat === undefined) {
            if (codeOf(outcome) !== Code.noNode) return Either.left(failure("renew")(outcome))
            remember(id, request.leaseMs)
            return Either.right(false)
          }
          state.mtime = stat.stat.mtime
          sawServerTime(stat.stat.mtime)
          if (stat.stat.mtime > lastWrite + leaseMs) {
            // the hold had expired before this write brought its node back: it is over
            yield* Effect.ignore(forget("renew", state))
            remember(id, request.leaseMs)
            return Either.right(false)
          }
          return Either.right(true)
        })
      )
    }

    const renew = (requests: ReadonlyArray<LockBackend.RenewRequest>) =>
      Effect.forEach(requests, renewOne, { concurrency: "unbounded" })

    const cancel = (request: LockBackend.CancelRequest): Effect.Effect<void, BackendError> => {
      const id = idOf(request.key, request.holder)
      return serialized(
        id,
        Effect.gen(function*() {
          const state = holders.get(id)
          if (state !== undefined && state.fence !== undefined) return // a holder: the queue no longer applies
          if (state !== undefined) yield* forget("cancel", state)
          remember(id, request.leaseMs)
        })
      )
    }

    // ---- inspect, forceRelease, raiseFence --------------------------------------------------
    const readKey = (operation: string, key: string) =>
      Effect.gen(function*() {
        const lockPath = layout.lock(key)
        const first = yield* send(operation, [
          { _tag: "getChildren", path: lockPath },
          { _tag: "getData", path: layout.fence(key) }
        ])
        yield* expect(operation, first[0], Code.noNode)
        const read = yield* readNodes(operation, lockPath, contendersOf(first[0]))
        return { lockPath, seen: read.seen, floor: floorOf(first[1]) }
      })

    const fenceOf = (node: Seen, floor: number) => node.data?.f ?? node.czxid + floor
    const inspect = (key: string): Effect.Effect<LockBackend.KeyState, BackendError> =>
      Effect.map(readKey("inspect", key), ({ floor, seen }) => {
        const now = serverNow()
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

    const forced = new Map<string, { readonly until: number; readonly result: boolean }>()
    const forceRelease = (request: LockBackend.ForceReleaseRequest): Effect.Effect<boolean, BackendError> =>
      serialized(`force\u0000${request.key}\u0000${request.id}`, Effect.suspend(() => {
        // an id is remembered with its key, as the rules remember it
        const known = forced.get(`${request.key}\u0000${request.id}`)
        if (known !== undefined && known.until > Date.now()) return Effect.succeed(known.result)
        return Effect.gen(function*() {
          const { lockPath, seen } = yield* readKey("forceRelease", request.key)
          const { live } = judge(seen, serverNow())
          const holding = live.filter(isHolder)
          const outcomes = yield* send(
            "forceRelease",
            holding.map((n): Request => ({ _tag: "remove", path: `${lockPath}/${n.contender.name}`, version: -1 }))
          )
          for (const outcome of outcomes) yield* expect("forceRelease", outcome, Code.noNode)
          // this backend's own holders forced out are remembered as ended, as the rules do: a
          // late copy of their last release succeeds, one of their acquisitions grants nothing
          const now = serverNow()
          for (const node of holding) {
            if (node.contender.holder.startsWith(ours)) remember(idOf(request.key, node.contender.holder), Math.max(1, node.expiresAt - now))
          }
          const result = outcomes.some((o) => codeOf(o) === 0)
          forced.set(`${request.key}\u0000${request.id}`, { until: Date.now() + LockBackend.forceReleaseMemoryMs, result })
          for (const [old, entry] of forced) if (entry.until <= Date.now()) forced.delete(old)
          return result
        })
      }))

    /**
     * A floor `f` is met by a base `f - z`, `z` a zxid the ensemble has passed: every node
     * created later has a greater zxid, so its fence (zxid + base) is above `f`. `z` is read off a
     * write to the floor's own node (its `mzxid`), so later fences are only a few above `f`. The
     * base only grows; a copy of a raise, or a lower one, finds it high enough and changes nothing.
     */
    const raiseFence = (request: LockBackend.RaiseFenceRequest): Effect.Effect<void, BackendError> =>
      Effect.gen(function*() {
        const path = layout.fence(request.key)
        for (let tries = 0; tries < 10; tries++) {
          const read = (yield* send("raiseFence", [{ _tag: "getData", path }]))[0]
          yield* expect("raiseFence", read, Code.noNode)
          const data = reply(read, "data")
          if (data === undefined) {
            const created = (yield* send("raiseFence", [{ _tag: "create", path, data: encodeFloor(0), mode: Zk.CreateMode.PERSISTENT }]))[0]
            yield* expect("raiseFence", created, Code.nodeExists)
            continue
          }
          const base = decodeFloor(data.data)
          const touched = (yield* send("raiseFence", [{ _tag: "setData", path, data: data.data, version: data.stat.version }]))[0]
          if (codeOf(touched) === Code.badVersion) continue
          yield* expect("raiseFence", touched)
          const { mzxid, version } = reply(touched, "stat")!.stat
          const wanted = request.fence - mzxid
          if (wanted <= base) return
          const written = (yield* send("raiseFence", [{ _tag: "setData", path, data: encodeFloor(wanted), version }]))[0]
          if (codeOf(written) === Code.badVersion) continue
          return yield* expect("raiseFence", written)
        }
        return yield* Effect.fail(failure("raiseFence")(new Error("the fence floor kept changing")))
      })

    // ---- latches ----------------------------------------------------------------------------
    interface LatchDocument {
      readonly count: number
      readonly applied: ReadonlyArray<readonly [string, number]>
    }
    const latchState = (key: string, document: LatchDocument | undefined, locked: boolean): Rules.State => ({
      keys: locked
        ? new Map([[key, { ...Rules.emptyKey, holders: [{ holder: "", exclusive: 1, shared: 0, permits: 0, fence: 0, expiresAt: Infinity }] }]])
        : new Map(),
      latches: document === undefined ? new Map() : new Map([[key, { count: document.count, applied: new Map(document.applied) }]])
    })

    /** Applies a latch rule with a compare-and-set on the latch's node. */
    const onLatch = <A>(
      operation: string,
      key: string,
      step: (state: Rules.State, now: number) => Rules.Step<Either.Either<A, InvalidLockOptions>>
    ): Effect.Effect<A, BackendError | InvalidLockOptions> =>
      Effect.gen(function*() {
        const path = layout.latch(key)
        for (let tries = 0; tries < 20; tries++) {
          // a read re-arms the watch of the latch's local waiters (a watch fires once)
          const waiting = latchWaiters.get(key)
          if (waiting !== undefined) for (const id of waiting) watch(path, id, true)
          const read = yield* send(operation, [
            { _tag: "getData", path },
            { _tag: "getChildren", path: layout.lock(key) },
            ...(waiting === undefined ? [] : [{ _tag: "exists", path, watch: watcher } as const])
          ])
          yield* expect(operation, read[0], Code.noNode)
          const data = reply(read[0], "data")
          const document = data === undefined ? undefined : (JSON.parse(data.data.toString("utf8") || "null") as LatchDocument | null) ?? undefined
          const locked = contendersOf(read[1]).length > 0
          const now = serverNow()
          const { result, state } = step(latchState(key, document, locked), now)
          if (Either.isLeft(result)) return yield* Effect.fail(result.left)
          const next = state.latches.get(key)
          const encoded = next === undefined ? { count: 0, applied: [] } : { count: next.count, applied: [...next.applied] }
          const same = document !== undefined && JSON.stringify(document) === JSON.stringify(encoded)
          if (same || (document === undefined && encoded.count === 0 && encoded.applied.length === 0)) return result.right
          const buffer = Buffer.from(JSON.stringify(encoded))
          const written = (yield* send(operation, [
            data === undefined
              ? { _tag: "create", path, data: buffer, mode: Zk.CreateMode.PERSISTENT }
              : encoded.count === 0 && encoded.applied.length === 0
              ? { _tag: "remove", path, version: data.stat.version }
              : { _tag: "setData", path, data: buffer, version: data.stat.version }
          ]))[0]
          if (codeOf(written) === Code.badVersion || codeOf(written) === Code.nodeExists || codeOf(written) === Code.noNode) continue
          yield* expect(operation, written)
          return result.right
        }
        return yield* Effect.fail(failure(operation)(new Error("the latch kept changing")))
      })

    const latchWaiters = new Map<string, Set<string>>()
    const latchSubscribe = (key: string, waiter: string): Effect.Effect<LockBackend.Subscription, BackendError, Scope.Scope> => {
      const path = layout.latch(key)
      const id = `latch\u0000${key}\u0000${waiter}`
      const listed = Effect.acquireRelease(
        Effect.sync(() => {
          let set = latchWaiters.get(key)
          if (set === undefined) {
            set = new Set()
            latchWaiters.set(key, set)
          }
          set.add(id)
        }),
        () =>
          Effect.sync(() => {
            const set = latchWaiters.get(key)
            set?.delete(id)
            if (set?.size === 0) latchWaiters.delete(key)
          })
      )
      return Effect.tap(Effect.zipRight(listed, subscribeAs(id, Effect.void)), () => {
        watch(path, id, true)
        return Effect.flatMap(send("latchSubscribe", [{ _tag: "exists", path, watch: watcher }]), (outcomes) =>
          expect("latchSubscribe", outcomes[0]))
      })
    }

    const service: LockBackend.Service = {
      clientId,
      acquire,
      release,
      renew,
      inspect,
      raiseFence,
      forceRelease,
      cancel,
      subscribe: (key, holder) => subscribeAs(idOf(key, holder), leaveQueue(key, holder)),
      latchSetCount: (request) => onLatch("latchSetCount", request.key, (state, now) => Rules.latchSetCount(state, request, now)),
      latchCountDown: (request) => onLatch("latchCountDown", request.key, (state, now) => Rules.latchCountDown(state, request, now)),
      latchCount: (key) => onLatch("latchCount", key, (state, now) => Rules.latchCount(state, key, now)),
      latchSubscribe
    }

    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        closed = true
        for (const id of [...waiters.keys()]) wake(id)
      })
    )
    return service
  })
