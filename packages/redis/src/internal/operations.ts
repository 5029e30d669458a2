/**
 * The operations of the Redis backend (`LockBackend.Service`): each is one script (scripts/),
 * run by the backend's `ScriptRunner`; the waits go through its wake-up hub.
 */
import type { Runtime as RuntimeType } from "effect"
import { Effect, Either, Runtime } from "effect"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import type * as LockBackend from "@lockstep/core/LockBackend"
import { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import type { ScriptRunner, Target } from "./runner.js"
import * as latch from "./scripts/latch.js"
import * as lock from "./scripts/lock.js"
import { waiterMember } from "./scripts/members.js"
import type { ClientTracker } from "./tracker.js"
import type { Wakeups } from "./subscriber.js"
import { wakeCode } from "./wakeups.js"

/**
 * The longest claim a release grants a waiter (a hand-off: see `wake` in scripts/shared.ts): long
 * enough for its message to arrive and the holder to confirm it, short enough that a waiter that
 * died (or lost the message) holds the lock back for no longer. Never longer than the lease asked
 * for.
 */
export const maxClaimMs = 2_000

/** What the operations of one backend run on. */
export interface Backend {
  readonly target: Target
  readonly runner: ScriptRunner
  readonly wakeups: Wakeups
  readonly tracker: ClientTracker
  /** The quarantine's longest lease in ms, or why there can be none (see `quarantineOf` in redisBackend.ts). */
  readonly quarantine: number | string | undefined
  /** Most renewals sent in one script. */
  readonly renewBatchSize: number
  /** Runs what the operations leave behind (an abandoned waiter's entry). */
  readonly runtime: RuntimeType.Runtime<never>
}

/**
 * The claim a waiter asks a release to grant it (0: wake it only). None under a quarantine
 * (a release does not look at it, and must not grant while it lasts) nor with replica
 * acknowledgement (a claim is granted by a release, which no replica acknowledged before the
 * waiter would rely on it): there, the woken waiter's own acquire grants it.
 */
const claimsOf = (backend: Backend) => {
  const noClaims = backend.quarantine !== undefined || backend.runner.acknowledged
  return (leaseMs: number): number => noClaims ? 0 : Math.min(leaseMs, maxClaimMs)
}

/** Why the quarantine refuses `request`, if it does. */
const quarantineRefusal = (
  quarantine: number | string,
  request: LockBackend.AcquireRequest
): InvalidLockOptions | undefined =>
  typeof quarantine === "string"
    ? new InvalidLockOptions({ field: "quarantine", reason: quarantine })
    : request.leaseMs > quarantine
    ? new InvalidLockOptions({
      field: "lease",
      reason: `a lease of ${request.leaseMs}ms is longer than the Redis backend's quarantine.longestLease (${quarantine}ms), ` +
        "which must cover every lease its server grants"
    })
    : undefined

/** The backend's acquire: one attempt per call, after the eviction guard let it through. */
const acquireOn = (backend: Backend): LockBackend.Service["acquire"] => {
  const { quarantine, runner, tracker, wakeups } = backend
  const { evictionGuard } = runner
  const claimMsOf = claimsOf(backend)
  /** The quarantine's longest lease, once it is known to be valid. */
  const longestLease = typeof quarantine === "number" ? quarantine : undefined
  /**
   * The BackendError of an acquisition that failed for `cause`, named like every other one (see
   * `ClientTracker.locateAll`).
   */
  const acquireFailed = (cause: Error) => tracker.fail("acquire", cause)

  /** One acquisition: call it when the effect runs (it notes the waiter's registration). */
  const attempt = (request: LockBackend.AcquireRequest): ReturnType<LockBackend.Service["acquire"]> => {
    const keys = lock.acquire.keys(request.key, request.holder, longestLease)
    const channel = keys[2]!
    const code = wakeCode(request.holder)
    const claimMs = claimMsOf(request.leaseMs)
    // only a waiter on a subscription registers: a release may then wake it by its code
    const waiting = wakeups.isWaiting(channel, request.holder, code)
    // (a fair waiter is queued by any denied attempt; on a subscription, its entry asks for hand-offs)
    const register = waiting
    if (register && !request.fair) {
      // its entry in the waiters set, as the script writes it; noted before the call, so that a
      // registration whose reply is lost is taken out too when the waiter gives up
      wakeups.registered(channel, request.holder, code, waiterMember(request, code, claimMs), request.leaseMs)
    }
    if (quarantine !== undefined) {
      const refused = quarantineRefusal(quarantine, request)
      if (refused !== undefined) return Effect.fail(refused)
    }
    return Effect.flatMap(
      // a grant is confirmed by the replicas (with `replication`); a failure here is a
      // BackendError, after which the caller releases what the attempt may have been granted
      runner.runAcknowledged(
        lock.acquire,
        keys,
        lock.acquire.args(request, code, register, claimMs, longestLease),
        "grant",
        lock.acquire.wrote
      ),
      (reply) => {
        // a subscribed waiter's denial: the fence floor above which a hand-off is relied on
        if (waiting) {
          const floor = lock.acquire.fenceFloor(reply)
          if (floor !== null) wakeups.denied(channel, request.holder, code, floor, claimMs)
        }
        return lock.acquire.decode(reply, request, acquireFailed)
      }
    )
  }

  // no grant from a server that may evict lock keys (unless accepted); nothing to wait for on
  // the usual path, where the eviction verdict is known
  return (request) =>
    Effect.suspend(() => {
      const first = evictionGuard.beforeAcquire()
      return first === undefined ? attempt(request) : Effect.zipRight(first, Effect.suspend(() => attempt(request)))
    })
}

/** The backend's renew: the lock API's keeper sends every renewal that is due in one call. */
const renewOn = (backend: Backend, lifecycle: Lifecycle): LockBackend.Service["renew"] => {
  const { renewBatchSize, runner, target } = backend
  const { isCluster, slotOf } = target

  /** Sends a batch of renewals: one script per cluster slot (all of them at once on a single server). */
  const renewBatch = (requests: ReadonlyArray<LockBackend.RenewRequest>) => {
    const groups: Array<Array<number>> = []
    const open = new Map<number, Array<number>>()
    requests.forEach((request, i) => {
      const slot = isCluster ? slotOf(request.key) : 0
      let group = open.get(slot)
      if (group === undefined || group.length >= renewBatchSize) {
        group = []
        open.set(slot, group)
        groups.push(group)
      }
      group.push(i)
    })
    return Effect.map(
      Effect.forEach(
        groups,
        (indexes) =>
          Effect.map(
            runner.runConfirmed(
              lock.renew,
              lock.renew.keys(requests, indexes),
              lock.renew.args(requests, indexes),
              lock.renew.wrote
            ),
            (outcome) => {
              // renewals the replicas did not acknowledge are not confirmed
              const notAcknowledged = runner.unconfirmed("renew", "renewal", outcome)
              return indexes.map((index, j) => [index, lock.renew.decode(outcome.reply, j, notAcknowledged)] as const)
            }
          ),
        { concurrency: "unbounded" }
      ),
      (parts) => {
        const out = new Array<LockBackend.RenewResult>(requests.length).fill(Either.right(false))
        for (const part of parts) for (const [index, ok] of part) out[index] = ok
        return out
      }
    )
  }

  // the batch goes out as it is
  return (requests) =>
    requests.length === 0
      ? lifecycle.whileOpen("renew", Effect.succeed([]))
      : Effect.catchAllDefect(
        // renewals keep the eviction verdict fresh: a policy changed at run time is noticed
        // within one renewal period
        Effect.zipRight(Effect.sync(runner.evictionGuard.touch), renewBatch(requests)),
        (cause) => Effect.fail(new BackendError({ operation: "renew", cause }))
      )
}

/** A subscription's failure as a BackendError (the hub's SUBSCRIBE may fail with anything). */
const subscribeFailed = (cause: unknown): BackendError =>
  cause instanceof BackendError ? cause : new BackendError({ operation: "subscribe", cause })

/** The operations on latches. */
type LatchOperations = Pick<LockBackend.Service, "latchSetCount" | "latchCountDown" | "latchCount" | "latchSubscribe">

/** The operations on locks. */
type LockOperations = Omit<LockBackend.Service, "clientId" | keyof LatchOperations>

/** The lock operations of the backend (latches apart: `latchOperations`). */
const lockOperations = (backend: Backend): LockOperations => {
  const { runner, runtime, target, wakeups } = backend
  const { lifecycle } = backend.tracker
  const { run } = runner
  const claimMsOf = claimsOf(backend)

  /**
   * A registered waiter gave up without a grant: its entry leaves the waiters set, and a wake-up
   * a release had already aimed at it goes on. Not awaited: the waiter's exit does not wait for
   * it, and a failure only leaves the entry to expire.
   */
  const abandon = (key: string, holder: string, member: string, leaseMs: number) => {
    Runtime.runFork(runtime)(
      Effect.ignore(run(lock.leave, lock.leave.keys(key, holder), lock.leave.args(member, holder, leaseMs)))
    )
  }

  return {
    acquire: acquireOn(backend),
    release: (request) =>
      Effect.flatMap(
        run(lock.release, lock.release.keys(request.key, request.holder), lock.release.args(request)),
        (reply) => lock.release.decode(reply, request)
      ),
    renew: renewOn(backend, lifecycle),
    inspect: (key) =>
      Effect.map(run(lock.inspect, lock.inspect.keys(key), lock.inspect.args()), (reply) => lock.inspect.decode(reply, key)),
    forceRelease: ({ id, key }) =>
      Effect.map(
        run(lock.forceRelease, lock.forceRelease.keys(key, id), lock.forceRelease.args(key, target.namespace)),
        lock.forceRelease.decode
      ),
    raiseFence: ({ fence, key, leaseMs }) =>
      Effect.asVoid(
        runner.runAcknowledged(
          lock.raiseFence,
          lock.raiseFence.keys(key),
          lock.raiseFence.args(fence, leaseMs),
          "fence raise",
          lock.raiseFence.wrote
        )
      ),
    cancel: ({ holder, key, leaseMs }) =>
      Effect.asVoid(run(lock.cancel, lock.cancel.keys(key, holder), lock.cancel.args(holder, leaseMs, claimMsOf(leaseMs)))),
    // calls that send nothing check the lifecycle here
    subscribe: (key, holder, mode) =>
      lifecycle.whileOpen(
        "subscribe",
        Effect.mapError(
          wakeups.subscribe(lock.channelOf(key), holder, mode, (member, leaseMs) => abandon(key, holder, member, leaseMs)),
          subscribeFailed
        )
      )
  }
}

/** The latch operations of the backend. */
const latchOperations = (backend: Backend): LatchOperations => {
  const { runner, target, wakeups } = backend
  const { namespace } = target
  return {
    latchSetCount: ({ count, id, key }) =>
      Effect.flatMap(
        runner.runAcknowledged(
          latch.setCount,
          latch.setCount.keys(key),
          latch.setCount.args(key, id, count, namespace),
          "latch change",
          latch.setCount.wrote
        ),
        (reply) => latch.setCount.decode(reply, key)
      ),
    latchCountDown: ({ id, key }) =>
      Effect.flatMap(
        runner.runAcknowledged(
          latch.countDown,
          latch.countDown.keys(key),
          latch.countDown.args(key, id, namespace),
          "latch change",
          latch.countDown.wrote
        ),
        (reply) => latch.countDown.decode(reply, key)
      ),
    latchCount: (key) =>
      Effect.flatMap(runner.run(latch.count, latch.count.keys(key), latch.count.args()), (reply) => latch.count.decode(reply, key)),
    // a message on the latch's channel wakes every latch waiter
    latchSubscribe: (key, waiter) =>
      backend.tracker.lifecycle.whileOpen(
        "latchSubscribe",
        Effect.mapError(wakeups.subscribe(latch.latchChannelOf(key), waiter, "latch"), subscribeFailed)
      )
  }
}

/** The backend's operations, with a fresh `clientId`. */
export const operationsOf = (backend: Backend): LockBackend.Service => ({
  clientId: crypto.randomUUID(),
  ...lockOperations(backend),
  ...latchOperations(backend)
})
