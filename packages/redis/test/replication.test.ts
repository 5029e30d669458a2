/**
 * Replica acknowledgement (`replication`) on real redis-server processes: a primary with two
 * replicas whose replication links the tests cut and restore (`RedisSentinel`, one sentinel,
 * which never fails the primary over here: it stays up), a Redis Cluster whose first master has
 * a replica, and the conformance suite on a primary with one replica. The backend connects to the
 * primary directly.
 *
 * Checked: grants reach the required replicas before the acquisition returns; a grant the
 * replicas did not acknowledge fails with the typed error and is not left held; renewals that are
 * not acknowledged leave the lease's deadline where it was (it is lost at it) and recover with the
 * link; calls that need no acknowledgement are not held up by a WAIT; a connection dropped during
 * a WAIT fails its calls at once; concurrent callers each wait about two timeouts at most; latch
 * changes and fence raises; bad options fail the build; on a cluster each WAIT runs on the node
 * that ran its script.
 *
 * Timing assertions are generous bounds (a loaded two-core machine): each names what it bounds.
 */
import { afterAll, assert, beforeAll, describe, it, layer } from "@effect/vitest"
import { Context, Duration, Effect, Either, Exit, Fiber, Layer, Option, Scope } from "effect"
import calculateSlot from "cluster-key-slot"
import type { Redis } from "ioredis"
import { CountDownLatch, Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { RenewResult, Service } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import { InvalidLockOptions } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { FaultyBackend } from "@lockstep/testkit"
import { RedisSentinel, RedisServer } from "@lockstep/servers"
import * as Conformance from "@lockstep/testkit/Conformance"
import { call, eventually, nowMs, rawClient, runnable, trapRejections, typedFailure, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis replica acknowledgement suite (replication.test.ts)")

// nothing may escape the Effect world (a rejected promise of the acknowledged connection, say)
const escaped = trapRejections()
afterAll(() => {
  assert.deepStrictEqual(escaped, [])
})

class Topology extends Context.Tag("replication.test/Topology")<Topology, RedisSentinel.RedisSentinel>() {}

const topology = Layer.scoped(Topology, RedisSentinel.make({ replicas: 2, sentinels: 1 })).pipe(Layer.orDie)

/** A backend on the topology's primary with `replication`, closed with the scope. */
const replicated = (
  replication: RedisBackend.Replication,
  tuning: RedisBackend.Tuning = {}
): Effect.Effect<Service, BackendError, Topology | Scope.Scope> =>
  Effect.gen(function*() {
    const { primary } = yield* Topology
    const context = yield* Layer.build(RedisBackend.layerFrom(primary.url, { commandTimeout: "2 seconds", ...tuning, replication }))
    return Context.get(context, LockBackend)
  })

/** Cuts the links of replicas `indexes` for the rest of the scope (restored, caught up, when it closes). */
const cut = (...indexes: ReadonlyArray<number>) =>
  Effect.gen(function*() {
    const sentinel = yield* Topology
    for (const i of indexes) {
      yield* Effect.acquireRelease(Effect.orDie(sentinel.cutReplication(i)), () => Effect.orDie(sentinel.restoreReplication(i)))
    }
  })

/** `EXISTS key` on node `node` (the primary, or a replica). */
const existsOn = (node: RedisSentinel.Node, key: string) =>
  Effect.scoped(Effect.flatMap(rawClient(node.url), (raw) => Effect.map(call(raw, "EXISTS", key), (n) => Number(n) === 1)))

/** The `ReplicationNotAcknowledged` behind a failure, if that is what it is. */
const notAcknowledged = (error: unknown): Option.Option<RedisBackend.ReplicationNotAcknowledged> =>
  RedisBackend.isReplicationNotAcknowledged(error) ? Option.some(error.cause) : Option.none()

/** Acquires `key` (exclusive, watchdog) once and releases it: the exit, and how long both took. */
const acquireOnce = (backend: Service, key: string, watchdog: Duration.DurationInput = "10 seconds") =>
  Effect.gen(function*() {
    const lock = yield* Lock.make(key, { watchdog }).pipe(withBackend(backend))
    const start = nowMs()
    const exit = yield* Effect.exit(Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
    return { exit, ms: nowMs() - start }
  })

/** How many `WAIT`s the server `raw` is connected to has run (`INFO commandstats`). */
const waitsOn = (raw: Redis) =>
  Effect.map(Effect.promise(() => raw.info("commandstats")), (info) => Number(/^cmdstat_wait:calls=(\d+)/m.exec(info)?.[1] ?? 0))

/** The typed error of a failed exit, as ReplicationNotAcknowledged; dies with what it was otherwise. */
const expectNotAcknowledged = <A, E>(exit: Exit.Exit<A, E>) =>
  Effect.suspend(() => {
    const failure = typedFailure(exit)
    if (Option.isSome(failure)) {
      const cause = notAcknowledged(failure.value)
      if (Option.isSome(cause)) return Effect.succeed({ error: failure.value as unknown as BackendError, cause: cause.value })
    }
    return Effect.dieMessage(`expected a BackendError caused by ReplicationNotAcknowledged, got ${String(exit)}`)
  })

/** `backend` with every renew result recorded, per lease, with the time it came back. */
const recordRenewals = (
  backend: Service,
  into: Array<{ readonly at: number; readonly result: RenewResult }>
): Service => ({
  ...backend,
  renew: (requests) =>
    Effect.tap(backend.renew(requests), (results) =>
      Effect.sync(() => {
        for (const result of results) into.push({ at: nowMs(), result })
      }))
})

describe.runIf(runnable)("replica acknowledgement on a primary with two replicas", () => {
  // live clock and timers (no TestClock): real servers, real timeouts
  layer(topology, { timeout: 120_000, excludeTestServices: true })("replication", (it) => {
    it.scoped("grants reach the required replicas before the acquisition returns (replicas 1 and 2)", () =>
      Effect.gen(function*() {
        const sentinel = yield* Topology
        const { primary, replicas } = sentinel
        const raw = yield* rawClient(primary.url)
        for (const required of [1, 2]) {
          // a timeout long enough for a link restored below to catch up and acknowledge (the
          // command timeout must be more than twice it)
          const backend = yield* replicated({ replicas: required, timeout: "4500 millis" }, { commandTimeout: "10 seconds" })
          const key = `ack-grant-${required}`
          const lock = yield* Lock.make(key, { watchdog: "10 seconds" }).pipe(withBackend(backend))
          const waitsBefore = yield* waitsOn(raw)
          const { grantedAt, onReplicas, restoredAt, startedAt } = yield* Effect.scoped(
            Effect.gen(function*() {
              // on loopback a replica has a grant within a millisecond, WAIT or not: with both links
              // cut, the grant cannot reach the required replicas until their links are restored,
              // 300 ms after the acquisition starts, so it must not return before that
              yield* cut(0, 1)
              const restore = yield* Effect.fork(
                Effect.zipRight(
                  Effect.sleep("300 millis"),
                  Effect.zipLeft(
                    Effect.sync(nowMs),
                    Effect.forEach(replicas.slice(0, required), (_, i) => Effect.orDie(sentinel.restoreReplication(i)), {
                      concurrency: "unbounded"
                    })
                  )
                )
              )
              const startedAt = nowMs()
              yield* Lock.acquire(lock)
              const grantedAt = nowMs()
              // asked at once: WAIT returned only once the replicas had the grant
              const onReplicas = yield* Effect.forEach(replicas, (replica) => existsOn(replica, key))
              const restoredAt = yield* Fiber.join(restore)
              return { grantedAt, onReplicas, restoredAt, startedAt }
            })
          )
          const timeline = `acquisition started, links restored from ${Math.round(restoredAt - startedAt)} ms, granted at ${
            Math.round(grantedAt - startedAt)
          } ms; replicas with the grant: ${onReplicas}`
          console.log(`[replication] replicas ${required}: ${timeline}`)
          assert.isAbove(grantedAt, restoredAt, `the acquisition returned before the links were restored: ${timeline}`)
          assert.isAtLeast(onReplicas.filter(Boolean).length, required, timeline)
          // the server ran the WAITs (the acquisition, and the release of that grant needs none)
          assert.isAbove((yield* waitsOn(raw)) - waitsBefore, 0, "WAIT calls on the primary")
          // re-entrant grants and releases work as usual
          const count = yield* Effect.scoped(
            Effect.gen(function*() {
              yield* Lock.acquire(lock)
              yield* Lock.acquire(lock)
              return yield* Lock.holdCount(lock)
            })
          )
          assert.strictEqual(count, 2)
          assert.isFalse(yield* Lock.isLocked(lock))
        }
      }))

    it.scoped("both links cut: the grant fails with ReplicationNotAcknowledged and is not left held", () =>
      Effect.gen(function*() {
        const { primary } = yield* Topology
        const backend = yield* replicated({ replicas: 1, timeout: "150 millis" })
        yield* cut(0, 1)
        const key = "ack-both-cut"
        const { exit, ms } = yield* acquireOnce(backend, key)
        const { cause, error } = yield* expectNotAcknowledged(exit)
        assert.strictEqual(cause.operation, "grant")
        assert.strictEqual(cause.required, 1)
        assert.strictEqual(cause.acknowledged, 0)
        assert.strictEqual(Duration.toMillis(cause.timeout), 150)
        assert.strictEqual(error.operation, "acquire")
        assert.include(error.message, "0 of 1 replicas acknowledged the grant within 150ms")
        // the server waited the timeout; the call did not wait much more
        assert.isAtLeast(ms, 140)
        assert.isBelow(ms, 1_000)
        // the lock released the grant: nothing held on the primary, nothing in the state
        assert.isFalse(yield* existsOn(primary, key))
        const state = yield* backend.inspect(key)
        assert.deepStrictEqual(state.holders, [])
      }))

    it.scoped("one link cut: replicas 1 is granted, replicas 2 fails with 1 of 2", () =>
      Effect.gen(function*() {
        const { primary } = yield* Topology
        const one = yield* replicated({ replicas: 1, timeout: "150 millis" })
        const two = yield* replicated({ replicas: 2, timeout: "150 millis" })
        yield* cut(1)
        const granted = yield* acquireOnce(one, "ack-one-cut-1")
        assert.isTrue(Exit.isSuccess(granted.exit), String(granted.exit))
        const refused = yield* acquireOnce(two, "ack-one-cut-2")
        const { cause } = yield* expectNotAcknowledged(refused.exit)
        assert.strictEqual(cause.required, 2)
        assert.strictEqual(cause.acknowledged, 1)
        assert.isFalse(yield* existsOn(primary, "ack-one-cut-2"))
      }))

    it.scoped("renewals not acknowledged leave the deadline where it was: the lease is lost at it", () =>
      Effect.gen(function*() {
        const renewals: Array<{ readonly at: number; readonly result: RenewResult }> = []
        const backend = recordRenewals(yield* replicated({ replicas: 1, timeout: "100 millis" }), renewals)
        const lock = yield* Lock.make("ack-renew-lost", { watchdog: "900 millis" }).pipe(withBackend(backend))
        const lease = yield* Lock.acquire(lock)
        // a renewal or two confirmed first
        yield* eventually("a confirmed renewal", Effect.sync(() => renewals.some((r) => Either.isRight(r.result))), 3_000)
        yield* cut(0, 1)
        const cutAt = nowMs()
        const before = Duration.toMillis(yield* lease.expiresIn)
        const lost = yield* Effect.flip(lease.lost)
        const lostAt = nowMs()
        // when each renewal came back, relative to the end of the cut, for the messages below
        const timeline = `renewals back at ${
          renewals.map((r) => `${Math.round(r.at - cutAt)} ms (${Either.isRight(r.result) ? "confirmed" : "failed"})`).join(", ")
        }; ${before} ms were left at the cut, lost ${Math.round(lostAt - cutAt)} ms after it`
        assert.strictEqual(lost._tag, "LockLost")
        assert.strictEqual(lost.reason, "DeadlinePassed")
        // lost at the deadline it had at the cut (renewals since were not confirmed), not later
        assert.isBelow(lostAt - cutAt, before + 400, timeline)
        const after = renewals.filter((r) => r.at > cutAt + 150)
        assert.isAbove(after.length, 0, `no renewal came back after the cut: ${timeline}`)
        for (const { result } of after) {
          assert.isTrue(Either.isLeft(result), `a renewal after the cut counted as confirmed: ${timeline}`)
          if (Either.isLeft(result)) {
            const cause = notAcknowledged(result.left)
            assert.isTrue(Option.isSome(cause), String(result.left))
            if (Option.isSome(cause)) assert.strictEqual(cause.value.operation, "renewal")
          }
        }
      }))

    it.scoped("renewals recover when the link comes back before the deadline", () =>
      Effect.gen(function*() {
        const sentinel = yield* Topology
        const renewals: Array<{ readonly at: number; readonly result: RenewResult }> = []
        const backend = recordRenewals(yield* replicated({ replicas: 1, timeout: "100 millis" }), renewals)
        // renewals every 2 s; the lease survives a link down for less than that
        const lock = yield* Lock.make("ack-renew-recover", { watchdog: "6 seconds" }).pipe(withBackend(backend))
        const lease = yield* Lock.acquire(lock)
        const lost = yield* Effect.fork(lease.lost)
        yield* Effect.orDie(sentinel.cutReplication(0))
        yield* Effect.orDie(sentinel.cutReplication(1))
        const cutAt = nowMs()
        yield* eventually("a renewal not acknowledged", Effect.sync(() => renewals.some((r) => r.at > cutAt && Either.isLeft(r.result))), 4_000)
        const failedAt = nowMs()
        yield* Effect.orDie(sentinel.restoreReplication(0))
        yield* Effect.orDie(sentinel.restoreReplication(1))
        yield* eventually(
          "a confirmed renewal after the restore",
          Effect.sync(() => renewals.some((r) => r.at > failedAt && Either.isRight(r.result) && r.result.right)),
          4_000
        )
        // the confirmed renewal moved the deadline on: the lease outlives its old deadline
        yield* Effect.sleep("2 seconds")
        assert.isTrue(Option.isNone(yield* Fiber.poll(lost)), "the lease was lost")
        assert.isAbove(Duration.toMillis(yield* lease.expiresIn), 2_000)
        yield* Fiber.interrupt(lost)
      }))

    it.scoped("calls that need no acknowledgement are not held up by a WAIT", () =>
      Effect.gen(function*() {
        const backend = yield* replicated({ replicas: 1, timeout: "800 millis" })
        const other = yield* Lock.make("ack-not-blocked-other", { watchdog: "10 seconds" }).pipe(withBackend(backend))
        yield* cut(0, 1)
        const started = nowMs()
        const waiting = yield* Effect.fork(acquireOnce(backend, "ack-not-blocked"))
        yield* Effect.sleep("100 millis")
        // the acquisition waits in its WAIT; an inspection and a lock check answer at once
        const t0 = nowMs()
        yield* backend.inspect("ack-not-blocked")
        const locked = yield* Lock.isLocked(other)
        const inspectMs = nowMs() - t0
        assert.isFalse(locked)
        assert.isTrue(Option.isNone(yield* Fiber.poll(waiting)), "the acquisition had already ended")
        assert.isBelow(inspectMs, 300, `reads took ${Math.round(inspectMs)} ms behind a WAIT of 800 ms`)
        const { exit } = yield* Fiber.join(waiting)
        yield* expectNotAcknowledged(exit)
        assert.isAtLeast(nowMs() - started, 750)
      }))

    it.scoped("the acknowledged connection dropped during a WAIT: its calls fail at once, later ones work", () =>
      Effect.gen(function*() {
        const sentinel = yield* Topology
        const backend = yield* replicated({ replicas: 1, timeout: "800 millis" })
        const raw = yield* rawClient(sentinel.primary.url)
        yield* Effect.scoped(Effect.gen(function*() {
          yield* cut(0, 1)
          const waiting = yield* Effect.fork(acquireOnce(backend, "ack-dropped"))
          // the connection blocked in WAIT
          let id: string | undefined
          yield* eventually("a client blocked in WAIT", Effect.map(call(raw, "CLIENT", "LIST"), (list) => {
            id = /^id=(\d+) .*cmd=wait\b/m.exec(String(list))?.[1]
            return id !== undefined
          }), 2_000, 10)
          const killedAt = nowMs()
          yield* call(raw, "CLIENT", "KILL", "ID", id!)
          const { exit } = yield* Fiber.join(waiting)
          const failure = Option.getOrThrow(typedFailure(exit))
          assert.strictEqual(failure._tag, "BackendError")
          assert.isTrue(Option.isNone(notAcknowledged(failure)), String(failure))
          assert.isBelow(nowMs() - killedAt, 500, "the call waited for its WAIT's timeout after the connection closed")
          assert.isFalse(yield* existsOn(sentinel.primary, "ack-dropped"))
        }))
        // a new connection, with nothing left of the old one's WAIT
        const again = yield* acquireOnce(backend, "ack-dropped-again")
        assert.isTrue(Exit.isSuccess(again.exit), String(again.exit))
      }))

    it.scoped("20 concurrent acquisitions with the replicas missing each fail within about twice the timeout", () =>
      Effect.gen(function*() {
        const { primary } = yield* Topology
        const timeoutMs = 150
        const backend = yield* replicated({ replicas: 2, timeout: Duration.millis(timeoutMs) })
        // warm: the acknowledged connection is open and the scripts loaded
        yield* acquireOnce(backend, "ack-many-warm")
        yield* cut(0, 1)
        const keys = Array.from({ length: 20 }, (_, i) => `ack-many-${i}`)
        const results = yield* Effect.forEach(keys, (key) => acquireOnce(backend, key), { concurrency: "unbounded" })
        const times = results.map((r) => Math.round(r.ms))
        for (const { exit } of results) {
          const { cause } = yield* expectNotAcknowledged(exit)
          assert.strictEqual(cause.acknowledged, 0)
        }
        // one WAIT in flight, the others share the next: two timeouts, not 20. The server honours a
        // WAIT's timeout to its timer's resolution (1/hz: 100 ms at the default hz 10), plus round
        // trips on a loaded machine
        assert.isBelow(Math.max(...times), 2 * (timeoutMs + 100) + 300, `times: ${times.join(", ")}`)
        for (const key of keys) assert.isFalse(yield* existsOn(primary, key), `${key} left held`)
      }))

    it.scoped("latch changes and fence raises are acknowledged; a latch call can be retried", () =>
      Effect.gen(function*() {
        const sentinel = yield* Topology
        const backend = yield* replicated({ replicas: 2, timeout: "150 millis" })
        const latch = yield* CountDownLatch.make("ack-latch").pipe(withBackend(backend))
        assert.isTrue(yield* CountDownLatch.trySetCount(latch, 3))
        assert.strictEqual(yield* CountDownLatch.countDown(latch), 2)
        assert.isTrue(yield* existsOn(sentinel.replicas[0]!, "ack-latch"))
        yield* Effect.orDie(sentinel.cutReplication(1))
        const id = "ack-latch-call-1"
        const failed = yield* Effect.exit(backend.latchCountDown({ key: "ack-latch", id }))
        const { cause } = yield* expectNotAcknowledged(failed)
        assert.strictEqual(cause.operation, "latch change")
        assert.strictEqual(cause.acknowledged, 1)
        const fence = yield* Effect.exit(backend.raiseFence({ key: "ack-fence", fence: Date.now() * 1000, leaseMs: 10_000 }))
        assert.strictEqual((yield* expectNotAcknowledged(fence)).cause.operation, "fence raise")
        yield* Effect.orDie(sentinel.restoreReplication(1))
        // the same call again: applied once, and now acknowledged
        assert.strictEqual(yield* backend.latchCountDown({ key: "ack-latch", id }), 1)
        assert.strictEqual(yield* CountDownLatch.count(latch), 1)
      }))

    it.scoped("bad replication options fail the build with BackendError naming the field", () =>
      Effect.gen(function*() {
        const { primary } = yield* Topology
        const build = (tuning: RedisBackend.Tuning) =>
          Effect.flip(Effect.scoped(Layer.build(RedisBackend.layerFrom(primary.url, tuning))))
        const fieldOf = (error: BackendError) => {
          assert.strictEqual(error.operation, "connect")
          assert.instanceOf(error.cause, InvalidLockOptions)
          return (error.cause as InvalidLockOptions).field
        }
        assert.strictEqual(fieldOf(yield* build({ replication: { replicas: 0 } })), "replication.replicas")
        assert.strictEqual(fieldOf(yield* build({ replication: { replicas: 1.5 } })), "replication.replicas")
        assert.strictEqual(fieldOf(yield* build({ replication: { replicas: 1, timeout: 0 } })), "replication.timeout")
        const tooLong = yield* build({ commandTimeout: "1 second", replication: { replicas: 1, timeout: "500 millis" } })
        assert.strictEqual(fieldOf(tooLong), "replication.timeout")
        assert.include(tooLong.message, "less than half the command timeout")
        // WAITAOF: Redis 7.2 and later
        const raw = yield* rawClient(primary.url)
        const info = String(yield* call(raw, "INFO", "server"))
        const [major, minor] = (/redis_version:(\d+)\.(\d+)/.exec(info) ?? []).slice(1).map(Number)
        const hasWaitAof = major! > 7 || (major === 7 && minor! >= 2)
        const aof = yield* Effect.exit(Effect.scoped(Layer.build(RedisBackend.layerFrom(primary.url, { replication: { replicas: 1, aof: true } }))))
        if (hasWaitAof) {
          assert.isTrue(Exit.isSuccess(aof), String(aof))
        } else {
          const error = Option.getOrThrow(typedFailure(aof))
          assert.strictEqual(fieldOf(error), "replication.aof")
          assert.include(error.message, "WAITAOF")
        }
        // a borrowed client: `layer` fails the same way
        const borrowed = yield* Effect.flip(Effect.scoped(Layer.build(RedisBackend.layer({ client: raw, replication: { replicas: -1 } }))))
        assert.strictEqual(fieldOf(borrowed), "replication.replicas")
      }))
  })
})

describe.runIf(runnable)("replica acknowledgement on a Redis Cluster", () => {
  it.scopedLive("each script's WAIT runs on its key's node: granted where that node has a replica, refused elsewhere", () =>
    Effect.gen(function*() {
      const cluster = yield* RedisServer.makeCluster()
      // one replica, of the first master only
      const master = cluster.nodes[0]!
      const replica = yield* RedisServer.make({
        args: ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]
      })
      const toMaster = yield* rawClient(master.url)
      const toReplica = yield* rawClient(replica.url)
      const masterId = String(yield* call(toMaster, "CLUSTER", "MYID"))
      yield* call(toReplica, "CLUSTER", "MEET", master.host, master.port)
      yield* eventually(
        "the new node to know the master",
        Effect.map(call(toReplica, "CLUSTER", "NODES"), (nodes) => String(nodes).includes(masterId)),
        10_000
      )
      yield* call(toReplica, "CLUSTER", "REPLICATE", masterId)
      yield* eventually(
        "the replica to be online",
        Effect.map(call(toMaster, "INFO", "replication"), (info) => /slave0:.*state=online/.test(String(info))),
        15_000
      )
      // the slots of the first master
      const slots = (yield* call(toMaster, "CLUSTER", "SLOTS")) as Array<[number, number, [string, number, string]]>
      const own = slots.filter(([, , node]) => node[2] === masterId)
      const isOwn = (key: string) => {
        const slot = calculateSlot(key)
        return own.some(([from, to]) => slot >= from && slot <= to)
      }
      const keys = Array.from({ length: 12 }, (_, i) => `ack-cluster-${i}`)
      assert.isTrue(keys.some(isOwn) && !keys.every(isOwn))

      const context = yield* Layer.build(
        RedisBackend.layerFrom({ cluster: [...cluster.startupNodes] }, {
          replication: { replicas: 1, timeout: "100 millis" }
        })
      )
      const backend = Context.get(context, LockBackend)
      const results = yield* Effect.forEach(keys, (key) => acquireOnce(backend, key), { concurrency: "unbounded" })
      for (const [i, { exit }] of results.entries()) {
        if (isOwn(keys[i]!)) {
          assert.isTrue(Exit.isSuccess(exit), `${keys[i]}: ${String(exit)}`)
        } else {
          const { cause } = yield* expectNotAcknowledged(exit)
          assert.strictEqual(cause.acknowledged, 0)
          assert.strictEqual(cause.required, 1)
        }
      }
      // refused grants were released, granted ones released with their scope
      for (const key of keys) assert.deepStrictEqual((yield* backend.inspect(key)).holders, [])
    }), 120_000)
})

describe.runIf(runnable)("conformance with replica acknowledgement (a primary and one replica, replicas: 1)", () => {
  // one primary and replica for the file; every test uses fresh random keys
  const scope = Effect.runSync(Scope.make())
  const urls: Array<string> = []
  beforeAll(async () => {
    const sentinel = await Effect.runPromise(Scope.extend(RedisSentinel.make({ replicas: 1, sentinels: 1 }), scope))
    urls.push(sentinel.primary.url)
  }, 60_000)
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

  const backend = Layer.suspend(() => RedisBackend.layerFrom(urls[0]!, { replication: { replicas: 1 } })).pipe(Layer.orDie)
  // the data-loss tests empty the primary (and so its replica) with FLUSHALL
  const wipe = Effect.suspend(() => Effect.scoped(Effect.asVoid(Effect.flatMap(rawClient(urls[0]!), (raw) => call(raw, "FLUSHALL")))))
  const dataLoss = Layer.merge(backend, Layer.succeed(FaultyBackend.DataLoss, { wipe }))
  Conformance.suite({ name: "redis-replicated", layer: backend, clock: "live", dataLoss })
})
