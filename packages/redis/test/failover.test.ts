/**
 * The flaw every Redis lock shares, made deterministic on real processes (a primary, two replicas
 * behind links the test can cut, three sentinels): client A is granted a lock by the primary while
 * its replicas are cut off, so the grant never reaches them; the primary dies; a stale replica is
 * promoted; client B asks for the same lock.
 *
 * - With the defaults through sentinels (every replica acknowledges a grant, and the quarantine),
 *   A's acquisition fails and B is granted only after the quarantine: no double grant.
 * - With both turned off, B is granted while A still holds a valid lease: the double grant. The
 *   test asserts it, so that it documents what the options are for.
 * - With replica acknowledgement, A's acquisition fails (no replica acknowledged it) and leaves
 *   nothing held.
 * - With the quarantine, B is not granted before A's lease would have run out, and A learns it
 *   lost the lease (through its renewal on the new master) before B is granted.
 *
 * In every case B's fence is above every fence issued before.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Context, Duration, Effect, Either, Fiber, Layer, Option, Schedule } from "effect"
import { Lock } from "@lockstep/core"
import type { Lease } from "@lockstep/core/Lease"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { RedisSentinel } from "@lockstep/servers"
import { backendOn, call, eventually, nowMs, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis failover scenarios (failover.test.ts)")

/** A backend reaching the topology's master through its sentinels, closed with the scope. */
const backendOf = (
  topology: RedisSentinel.RedisSentinel,
  tuning: RedisBackend.Tuning
): Effect.Effect<Service, BackendError, Scope.Scope> =>
  Effect.map(
    Layer.build(RedisBackend.layerFrom({
      sentinels: topology.sentinelAddresses.map((a) => ({ host: a.host, port: a.port })),
      name: topology.name
    }, tuning)),
    Context.get(LockBackend)
  )

interface Scenario {
  readonly topology: RedisSentinel.RedisSentinel
  readonly a: Service
  readonly b: Service
  /** The largest fence issued before the scenario (a warm-up grant of the same key). */
  readonly fenceBefore: number
  /** When the topology was asked for, before any of its servers started. */
  readonly startedAt: number
  /** When the warm-up grant (the topology's first) came. */
  readonly firstGrantAt: number
}

/**
 * Starts the topology, warms both backends up (scripts loaded, the server's epoch recorded and
 * replicated; with the default quarantine, a new primary's first grant waits until it has been up
 * for the longest lease), makes replica 0 the only candidate for promotion and cuts both replicas off.
 */
const setUp = (key: string, tuning: RedisBackend.Tuning): Effect.Effect<Scenario, unknown, Scope.Scope> =>
  Effect.gen(function*() {
    const startedAt = nowMs()
    const topology = yield* RedisSentinel.make()
    const a = yield* backendOf(topology, tuning)
    const b = yield* backendOf(topology, tuning)
    const warm = yield* Lock.make(key, { lease: "1 second" }).pipe(withBackend(a))
    const fenceBefore = yield* Effect.scoped(Effect.map(Lock.acquire(warm, { timeout: "45 seconds" }), (lease) => lease.fence))
    const firstGrantAt = nowMs()
    yield* topology.awaitSync()
    yield* topology.preferReplica(0)
    yield* topology.cutReplication(0)
    yield* topology.cutReplication(1)
    return { topology, a, b, fenceBefore, startedAt, firstGrantAt }
  })

/** Kills the primary and waits until a sentinel-promoted replica answers as master. */
const failOver = (topology: RedisSentinel.RedisSentinel) =>
  Effect.gen(function*() {
    yield* topology.primary.kill
    const master = yield* topology.awaitMaster({ filter: (node) => node !== topology.primary, timeout: "20 seconds" })
    return { master, promotedAt: nowMs() }
  })

/** Takes the lock through `backend`, retrying while the backend follows the failover. */
const takeAfterFailover = (backend: Service, key: string, options: Lock.Options) =>
  Effect.gen(function*() {
    const lock = yield* Lock.make(key, options).pipe(withBackend(backend))
    const lease = yield* Lock.acquire(lock, { timeout: "45 seconds", retry: Schedule.spaced("100 millis") })
    return { lease, at: nowMs() }
  })

describe.skipIf(!runnable)("Redis failover: the grant lost with its master", () => {
  it.live("with the defaults: A's unacknowledged grant fails, and B is granted after the quarantine, alone", () =>
    Effect.gen(function*() {
      const key = "failover:defaults"
      const { a, b, fenceBefore, firstGrantAt, startedAt, topology } = yield* setUp(key, { commandTimeout: "1 second" })
      // the quarantine of a new master: its first grant comes a whole longest lease (30 s) after
      // its start, which came after the topology was asked for
      assert.isAtLeast(firstGrantAt - startedAt, 30_000)
      const lockA = yield* Lock.make(key).pipe(withBackend(a))
      const refused = yield* Effect.flip(Effect.scoped(Lock.acquire(lockA)))
      assert.isTrue(RedisBackend.isReplicationNotAcknowledged(refused), refused.message)
      if (RedisBackend.isReplicationNotAcknowledged(refused)) {
        assert.strictEqual(refused.cause.acknowledged, 0)
        assert.strictEqual(refused.cause.required, 2, "every replica the master has")
      }
      assert.isFalse(yield* Lock.isLocked(lockA), "the unacknowledged grant was released on the primary")
      const { promotedAt } = yield* failOver(topology)
      yield* topology.restoreReplication(1)
      const granted = yield* takeAfterFailover(b, key, {})
      // the quarantine: no new grant on the promoted replica for the default longest lease (30 s)
      assert.isAtLeast(granted.at - promotedAt, 29_000)
      assert.isAbove(granted.lease.fence, fenceBefore)
      console.log(
        `defaults: the first grant on a new topology came ${Math.round(firstGrantAt - startedAt)} ms after it was asked for; ` +
          `A refused with "${refused.message}"; B granted ${Math.round(granted.at - promotedAt)} ms after the promotion, alone`
      )
    }).pipe(Effect.scoped), 150_000)

  it.live("with the defaults on the master directly: replicas that dropped off are still waited for", () =>
    Effect.gen(function*() {
      const key = "failover:dropped"
      const topology = yield* RedisSentinel.make()
      const a = yield* backendOn(topology.primary.url, { commandTimeout: "1 second" })
      const lock = yield* Lock.make(key, { lease: "1 second" }).pipe(withBackend(a))
      yield* Effect.scoped(Lock.acquire(lock))
      yield* topology.awaitSync()
      yield* topology.cutReplication(0)
      yield* topology.cutReplication(1)
      // the cut closed the replicas' connections: the master no longer lists them
      const probe = yield* rawClient(topology.primary.url)
      yield* eventually("the master has dropped its replicas", Effect.map(call(probe, "INFO", "replication"), (info) => String(info).includes("connected_slaves:0")), 10_000)
      // both attempts come after the backend has read the master again (a reading is at most a second old)
      for (const attempt of [1, 2]) {
        yield* Effect.sleep("1100 millis")
        const refused = yield* Effect.flip(Effect.scoped(Lock.acquire(lock)))
        assert.isTrue(RedisBackend.isReplicationNotAcknowledged(refused), `attempt ${attempt}: ${refused.message}`)
        if (RedisBackend.isReplicationNotAcknowledged(refused)) {
          assert.strictEqual(refused.cause.required, 2, `attempt ${attempt}: the replicas the master had`)
        }
      }
      assert.isFalse(yield* Lock.isLocked(lock))
      // once they are back, grants are acknowledged again
      yield* topology.restoreReplication(0)
      yield* topology.restoreReplication(1)
      const lease = yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence))
      assert.isAbove(lease, 0)
    }).pipe(Effect.scoped), 90_000)

  it.live("with both turned off: the promoted replica grants B while A's lease is valid (the double grant)", () =>
    Effect.gen(function*() {
      const key = "failover:plain"
      const { a, b, fenceBefore, topology } = yield* setUp(key, { commandTimeout: "1 second", replication: false, quarantine: false })
      // a long watchdog: A's first renewal comes long after the failover, as in a slow network
      const lockA = yield* Lock.make(key, { watchdog: "30 seconds" }).pipe(withBackend(a))
      const leaseA = yield* Lock.acquire(lockA)
      const lostA = yield* Effect.fork(Effect.either(leaseA.lost))
      const { master } = yield* failOver(topology)
      assert.notStrictEqual(master, topology.primary)
      const granted = yield* takeAfterFailover(b, key, { watchdog: "30 seconds" })
      // A still holds a lease it believes valid: both are in the critical section
      assert.strictEqual(yield* leaseA.state, "Held")
      assert.isAbove(Duration.toMillis(yield* leaseA.expiresIn), 10_000)
      assert.isAbove(granted.lease.fence, leaseA.fence, "fences keep increasing (the servers share a clock)")
      assert.isAbove(leaseA.fence, fenceBefore)
      assert.isTrue(Option.isNone(yield* Fiber.poll(lostA)), "A has not learnt of the loss yet")
      console.log(`plain: B granted ${Duration.format(Duration.millis(Math.round(Duration.toMillis(yield* leaseA.expiresIn))))} before A's lease ends: a double grant`)
    }).pipe(Effect.scoped), 90_000)

  it.live("with replica acknowledgement: A's acquisition fails (no replica has it) and leaves nothing held", () =>
    Effect.gen(function*() {
      const key = "failover:acknowledged"
      const tuning: RedisBackend.Tuning = {
        commandTimeout: "1 second",
        replication: { replicas: 1, timeout: "200 millis" },
        quarantine: false
      }
      const { a, b, fenceBefore, topology } = yield* setUp(key, tuning)
      const lockA = yield* Lock.make(key, { watchdog: "30 seconds" }).pipe(withBackend(a))
      const refused = yield* Effect.flip(Effect.scoped(Lock.acquire(lockA)))
      assert.isTrue(RedisBackend.isReplicationNotAcknowledged(refused), refused.message)
      if (RedisBackend.isReplicationNotAcknowledged(refused)) {
        assert.strictEqual(refused.cause.acknowledged, 0)
        assert.strictEqual(refused.cause.required, 1)
      }
      assert.isFalse(yield* Lock.isLocked(lockA), "the unacknowledged grant was released on the primary")
      const { promotedAt } = yield* failOver(topology)
      // the new master needs a replica to acknowledge B's grant: the other one follows it
      yield* topology.restoreReplication(1)
      const granted = yield* takeAfterFailover(b, key, { watchdog: "30 seconds" })
      assert.isAbove(granted.lease.fence, fenceBefore)
      console.log(`acknowledged: A refused with "${refused.message}"; B granted ${Math.round(granted.at - promotedAt)} ms after the promotion, alone`)
    }).pipe(Effect.scoped), 90_000)

  it.live("with the quarantine: B waits out A's lease; A learns of the loss first", () =>
    Effect.gen(function*() {
      const key = "failover:quarantine"
      const lease = "4 seconds"
      const tuning: RedisBackend.Tuning = { commandTimeout: "1 second", quarantine: { longestLease: lease }, replication: false }
      const { a, b, fenceBefore, topology } = yield* setUp(key, tuning)
      const lockA = yield* Lock.make(key, { watchdog: lease }).pipe(withBackend(a))
      const acquiredAt = nowMs()
      const leaseA: Lease = yield* Lock.acquire(lockA)
      const lostA = yield* Effect.fork(Effect.flatMap(Effect.either(leaseA.lost), (lost) => Effect.succeed({ lost, at: nowMs() })))
      const { promotedAt } = yield* failOver(topology)
      const granted = yield* takeAfterFailover(b, key, { watchdog: lease })
      const lost = yield* Fiber.join(lostA)
      assert.isTrue(Either.isLeft(lost.lost), "A's lease is lost")
      assert.isBelow(lost.at, granted.at, "A learnt of the loss before B was granted")
      // A's lease, measured from before its grant: B is granted only after it would have ended
      assert.isAtLeast(granted.at, acquiredAt + Duration.toMillis(Duration.decode(lease)))
      assert.isAtLeast(granted.at - promotedAt, Duration.toMillis(Duration.decode(lease)) - 1_000)
      assert.isAbove(granted.lease.fence, leaseA.fence)
      assert.isAbove(leaseA.fence, fenceBefore)
      console.log(
        `quarantine: A lost its lease ${Math.round(lost.at - promotedAt)} ms after the promotion` +
          ` (${Either.isLeft(lost.lost) ? lost.lost.left.reason : "?"}); B granted ${Math.round(granted.at - promotedAt)} ms after it` +
          ` and ${Math.round(granted.at - acquiredAt)} ms after A's grant`
      )
    }).pipe(Effect.scoped), 90_000)
})
