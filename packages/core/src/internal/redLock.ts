import type { Scope } from "effect"
import { Effect, Either, Fiber, Random } from "effect"
import type * as LockBackend from "../LockBackend.js"
import type { NodeAnswer } from "../LockError.js"
import type { LockUpgradeNotSupported } from "../LockError.js"
import { BackendError, InvalidLockOptions, NotHeld, QuorumNotReached } from "../LockError.js"
import type { Lifecycle } from "../BackendKit.js"
import { driftMs, monotonicMillis } from "./time.js"

/** A quorum's settings, validated. */
export interface Settings {
  readonly nodeTimeoutMs: number
  readonly retryJitterMs: number
}

const unsupported: LockBackend.Unsupported = {
  fair: "a quorum of independent servers keeps no common queue (each would order the waiters its own way)",
  shared: "a quorum of independent servers cannot bound shared holds (each counts only the permits it granted)",
  latch: "a latch's count is not a lock: a quorum of independent servers could count one call twice or lose it"
}

/** What a node answered, or how it failed (including the quorum's own time limit). */
type Answer<A, E> = Either.Either<A, E | BackendError>

/**
 * The node's answer within `ms` on the monotonic clock, or a `BackendError` after that. The call
 * runs in a fiber of its own, which only the time limit interrupts: an interruption of the
 * caller (while a grant is in flight, the lock API holds it back until the answers are in) must
 * not cut a node's call short, or a grant on that node would be neither counted nor given back.
 */
const timed = <A, E>(node: number, operation: string, ms: number, call: Effect.Effect<A, E>): Effect.Effect<Answer<A, E>> =>
  Effect.flatMap(
    Effect.forkDaemon(Effect.either(
      Effect.timeoutFail(Effect.interruptible(call), {
        duration: ms,
        onTimeout: () =>
          new BackendError({ operation, cause: new Error(`node ${node}: no answer within ${ms}ms`), detail: `node ${node}: no answer within ${ms}ms` })
      })
    )),
    Fiber.join
  )

/** How an error reads in a `NodeAnswer`. */
const describeError = (error: unknown): string => (error instanceof Error ? error.message : String(error))

/** A quorum over its nodes, and what it remembers: what every operation of it works on. */
interface Quorum {
  readonly nodes: ReadonlyArray<LockBackend.Service>
  /** How many nodes make a majority. */
  readonly quorum: number
  readonly settings: Settings
  /**
   * The fence each holder was handed at its first grant: a re-entry answers with it, whichever
   * majority granted the re-entry.
   */
  readonly fences: Map<string, number>
}

/** The same call on every node, in parallel, each within the node time limit. */
const onAll = <A, E>(q: Quorum, operation: string, call: (node: LockBackend.Service) => Effect.Effect<A, E>) =>
  Effect.forEach(q.nodes, (node, i) => timed(i, operation, q.settings.nodeTimeoutMs, call(node)), { concurrency: "unbounded" })

const noQuorum = (q: Quorum, key: string, operation: string, answers: ReadonlyArray<NodeAnswer>) => {
  const cause = new QuorumNotReached({ key, operation, quorum: q.quorum, answers })
  return new BackendError({ operation, cause, detail: cause.message })
}

const failedAnswer = (node: number, error: unknown): NodeAnswer => ({ node, outcome: "failed", detail: describeError(error) })

/** Each node's answer as a `NodeAnswer`: done, or how it failed. */
const doneOrFailed = <A>(answers: ReadonlyArray<Answer<A, unknown>>): Array<NodeAnswer> =>
  answers.map((a, i) => (Either.isRight(a) ? { node: i, outcome: "done" } : failedAnswer(i, a.left)))

/**
 * Gives a hold back (best-effort) on the nodes that may have granted it: those that did and those
 * whose answer was lost. A node that denied holds nothing of the attempt, and a release there
 * would only mark the holder as ended, refusing its next attempt as a late copy.
 */
const giveBack = (q: Quorum, request: LockBackend.AcquireRequest, on: ReadonlyArray<number>) =>
  Effect.forEach(
    on,
    (i) =>
      timed(
        i,
        "release",
        q.settings.nodeTimeoutMs,
        q.nodes[i]!.release({ key: request.key, holder: request.holder, mode: request.mode, count: request.count, leaseMs: request.leaseMs })
      ),
    { concurrency: "unbounded", discard: true }
  )

/** What the nodes answered to an acquire, counted. */
interface AcquireTally {
  readonly grants: Array<{ readonly node: number; readonly fence: number }>
  readonly said: Array<NodeAnswer>
  notHeld: number
  denied: number
  /** Per node, how long until it could grant (0: granted; Infinity: never, as far as it said). */
  readonly waits: Array<number>
  /** The nodes that granted or did not answer: where a failed attempt has something to undo. */
  readonly touched: Array<number>
  /** An error a node refused the request with itself (bad options, an upgrade): the same on every node. */
  refused: InvalidLockOptions | LockUpgradeNotSupported | undefined
}

type AcquireAnswer = Answer<LockBackend.AcquireResult, BackendError | InvalidLockOptions | LockUpgradeNotSupported | NotHeld>

const tallyAcquire = (answers: ReadonlyArray<AcquireAnswer>): AcquireTally => {
  const tally: AcquireTally = { grants: [], said: [], notHeld: 0, denied: 0, waits: [], touched: [], refused: undefined }
  for (const [i, answer] of answers.entries()) {
    if (Either.isRight(answer)) {
      if (answer.right._tag === "Granted") {
        tally.grants.push({ node: i, fence: answer.right.fence })
        tally.touched.push(i)
        tally.said.push({ node: i, outcome: "granted" })
        tally.waits.push(0)
      } else {
        tally.denied++
        tally.said.push({ node: i, outcome: "denied" })
        tally.waits.push(answer.right.retryAfterMs)
      }
      continue
    }
    const error = answer.left
    switch (error._tag) {
      case "NotHeld":
        tally.notHeld++
        tally.said.push({ node: i, outcome: "not held" })
        tally.waits.push(Infinity)
        break
      case "BackendError":
        tally.touched.push(i)
        tally.said.push(failedAnswer(i, error))
        tally.waits.push(Infinity)
        break
      default:
        tally.refused = error
    }
  }
  return tally
}

const acquire = (q: Quorum) => (request: LockBackend.AcquireRequest): ReturnType<LockBackend.Service["acquire"]> =>
  Effect.gen(function*() {
    if (request.fair || request.mode === "shared") {
      return yield* new InvalidLockOptions({ field: "kind", reason: request.fair ? unsupported.fair! : unsupported.shared! })
    }
    // the validity left of a lease taken at `startedAt`: what the lock API counts on (its
    // deadline gives the same drift away), less the time the attempt has taken
    const startedAt = yield* monotonicMillis
    const validity = Effect.map(monotonicMillis, (now) => request.leaseMs - (now - startedAt) - driftMs(request.leaseMs))
    const tally = tallyAcquire(yield* onAll(q, "acquire", (node) => node.acquire(request)))
    if (tally.refused !== undefined) {
      yield* giveBack(q, request, q.nodes.map((_, i) => i))
      return yield* Effect.fail(tally.refused)
    }
    const { grants } = tally
    const { quorum } = q
    if (grants.length >= quorum && (yield* validity) > 0) {
      const granted = Math.max(...grants.map((g) => g.fence))
      if (request.count > 1) {
        return { _tag: "Granted" as const, fence: q.fences.get(request.holder) ?? granted, count: request.count }
      }
      // every node that granted keeps the fence handed out as a floor: a later majority shares
      // one of them with this one, and that node's next fence is above it
      const raised = yield* Effect.forEach(
        grants,
        (g) => timed(g.node, "acquire", q.settings.nodeTimeoutMs, q.nodes[g.node]!.raiseFence({ key: request.key, fence: granted, leaseMs: request.leaseMs })),
        { concurrency: "unbounded" }
      )
      const kept = raised.filter(Either.isRight).length
      if (kept >= quorum && (yield* validity) > 0) {
        q.fences.set(request.holder, granted)
        return { _tag: "Granted" as const, fence: granted, count: request.count }
      }
    }
    yield* giveBack(q, request, tally.touched)
    if (tally.notHeld >= quorum) return yield* new NotHeld({ key: request.key, holder: request.holder })
    if (grants.length + tally.denied + tally.notHeld < quorum) return yield* noQuorum(q, request.key, "acquire", tally.said)
    // how long until a majority could be free: the quorum-th shortest wait
    const wait = tally.waits.sort((a, b) => a - b)[quorum - 1]!
    if (wait > 0 && Number.isFinite(wait)) return { _tag: "Denied" as const, retryAfterMs: wait }
    // a majority could be free now: contenders split the nodes, or the attempt came too late.
    // Retrying at once would split them again: wait a random while, as the algorithm says
    const jitter = yield* Random.nextIntBetween(1, q.settings.retryJitterMs + 1)
    yield* Effect.interruptible(Effect.sleep(jitter))
    return { _tag: "Denied" as const, retryAfterMs: jitter }
  })

const release = (q: Quorum): LockBackend.Service["release"] => (request) =>
  Effect.gen(function*() {
    const answers = yield* onAll(q, "release", (node) => node.release(request))
    let remaining: number | undefined
    let notHeld = 0
    const said: Array<NodeAnswer> = []
    for (const [i, answer] of answers.entries()) {
      if (Either.isRight(answer)) {
        remaining = answer.right
        said.push({ node: i, outcome: "done" })
      } else if (answer.left._tag === "NotHeld") {
        notHeld++
        said.push({ node: i, outcome: "not held" })
      } else {
        said.push(failedAnswer(i, answer.left))
      }
    }
    if (remaining === 0 || notHeld >= q.quorum) q.fences.delete(request.holder)
    if (notHeld >= q.quorum) return yield* new NotHeld({ key: request.key, holder: request.holder })
    if (remaining !== undefined) return remaining
    return yield* noQuorum(q, request.key, "release", said)
  })

/** One lease's renewal from every node's answers to the batch (`r`: its place in the batch). */
const renewalOf = (
  q: Quorum,
  request: LockBackend.RenewRequest,
  r: number,
  answers: ReadonlyArray<Answer<ReadonlyArray<LockBackend.RenewResult>, BackendError>>
): LockBackend.RenewResult => {
  let renewed = 0
  let gone = 0
  const said: Array<NodeAnswer> = []
  for (const [i, answer] of answers.entries()) {
    const result: LockBackend.RenewResult | undefined = Either.isRight(answer) ? answer.right[r] : Either.left(answer.left)
    if (result !== undefined && Either.isRight(result)) {
      if (result.right) renewed++
      else gone++
      said.push({ node: i, outcome: result.right ? "done" : "not held" })
    } else {
      said.push(failedAnswer(i, result === undefined ? "no result" : result.left))
    }
  }
  if (renewed >= q.quorum) return Either.right(true)
  // a majority can no longer renew it: the hold is lost
  if (gone > q.nodes.length - q.quorum) {
    q.fences.delete(request.holder)
    return Either.right(false)
  }
  return Either.left(noQuorum(q, request.key, "renew", said))
}

const renew = (q: Quorum): LockBackend.Service["renew"] => (requests) =>
  Effect.gen(function*() {
    const answers = yield* onAll(q, "renew", (node) => node.renew(requests))
    if (answers.every(Either.isLeft)) {
      return yield* noQuorum(q, requests[0]?.key ?? "", "renew", answers.map((a, i) => failedAnswer(i, Either.isLeft(a) ? a.left : "")))
    }
    return requests.map((request, r) => renewalOf(q, request, r, answers))
  })

const inspect = (q: Quorum): LockBackend.Service["inspect"] => (key) =>
  Effect.gen(function*() {
    const answers = yield* onAll(q, "inspect", (node) => node.inspect(key))
    const states = answers.filter(Either.isRight).map((a) => a.right)
    if (states.length < q.quorum) return yield* noQuorum(q, key, "inspect", doneOrFailed(answers))
    // a holder holds the key if a majority has it; it has the time left on the nodes it has the least on
    const byHolder = new Map<string, Array<LockBackend.HolderState>>()
    for (const state of states) {
      for (const holder of state.holders) byHolder.set(holder.holder, [...(byHolder.get(holder.holder) ?? []), holder])
    }
    const holders: Array<LockBackend.HolderState> = []
    for (const [holder, seen] of byHolder) {
      if (seen.length < q.quorum) continue
      const ttls = seen.map((h) => h.ttlMs).sort((a, b) => a - b)
      const first = seen[0]!
      holders.push({
        ...first,
        exclusive: Math.min(...seen.map((h) => h.exclusive)),
        fence: q.fences.get(holder) ?? Math.max(...seen.map((h) => h.fence)),
        // the majority's shortest: the hold is a majority's for that long at least
        ttlMs: ttls[seen.length - q.quorum]!
      })
    }
    return { key, fence: Math.max(...states.map((s) => s.fence)), limit: undefined, holders, queue: [] }
  })

/** An operation every node must carry out, done once a majority did. */
const onMajority = <A>(
  q: Quorum,
  operation: string,
  key: string,
  call: (node: LockBackend.Service) => Effect.Effect<A, BackendError>
): Effect.Effect<ReadonlyArray<A>, BackendError> =>
  Effect.flatMap(onAll(q, operation, call), (answers) => {
    const done = answers.filter(Either.isRight).map((a) => a.right)
    return done.length >= q.quorum ? Effect.succeed(done) : Effect.fail(noQuorum(q, key, operation, doneOrFailed(answers)))
  })

/**
 * A `LockBackend` over independent nodes: a hold is taken on all of them at once and counts when a
 * majority granted it within its validity (the lease less the time the attempt took and the
 * clocks' drift); otherwise it is given back on every node, those that did not answer included.
 * With `lifecycle`, every call starts only while it is open: a quorum built by a layer is closed
 * with the layer, as its nodes are.
 */
export const make = (nodes: ReadonlyArray<LockBackend.Service>, settings: Settings, lifecycle?: Lifecycle): LockBackend.Service => {
  const q: Quorum = { nodes, quorum: Math.floor(nodes.length / 2) + 1, settings, fences: new Map() }
  const latchRefusal = new InvalidLockOptions({ field: "kind", reason: `CountDownLatch: ${unsupported.latch}` })
  const refused = Effect.fail(latchRefusal)

  const acquireOf = acquire(q)
  const releaseOf = release(q)
  const renewOf = renew(q)
  const inspectOf = inspect(q)
  const open = <A, E, R>(operation: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | BackendError, R> =>
    lifecycle === undefined ? effect : lifecycle.whileOpen(operation, effect)

  return {
    clientId: nodes.map((node) => node.clientId).join("+"),
    unsupported,
    acquire: (request) => open("acquire", acquireOf(request)),
    release: (request) => open("release", releaseOf(request)),
    renew: (requests) => open("renew", renewOf(requests)),
    inspect: (key) => open("inspect", inspectOf(key)),
    forceRelease: (request) =>
      open("forceRelease", Effect.map(onMajority(q, "forceRelease", request.key, (node) => node.forceRelease(request)), (held) => held.some((h) => h))),
    raiseFence: (request) => open("raiseFence", Effect.asVoid(onMajority(q, "raiseFence", request.key, (node) => node.raiseFence(request)))),
    cancel: (request) => open("cancel", Effect.asVoid(onAll(q, "cancel", (node) => node.cancel(request)))),
    // a release on any node may be the one that frees a majority: wake on the first signal
    subscribe: (key, holder, mode): Effect.Effect<LockBackend.Subscription, BackendError, Scope.Scope> =>
      open("subscribe", Effect.gen(function*() {
        const subscribed = yield* Effect.forEach(nodes, (node) => Effect.either(node.subscribe(key, holder, mode)), { concurrency: "unbounded" })
        const live = subscribed.filter(Either.isRight).map((s) => s.right)
        const first = subscribed.find(Either.isLeft)
        if (live.length === 0 && first !== undefined) return yield* Effect.fail(first.left)
        return { await: Effect.raceAll(live.map((s) => s.await)) }
      })),
    latchSetCount: () => refused,
    latchCountDown: () => refused,
    latchCount: () => refused,
    latchSubscribe: () => Effect.fail(new BackendError({ operation: "subscribe", cause: latchRefusal, detail: latchRefusal.message }))
  }
}
