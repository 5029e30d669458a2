/**
 * The failover quarantine on real servers: a server whose data may be a stale or lost copy (a
 * restart without persistence, a replica promoted) makes no new grant until every lease its
 * earlier incarnation may have granted has run out. With it off (`quarantine: false`), the same
 * scenarios grant twice: the tests assert that too, so they document what the option is for.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Duration } from "effect"
import { Effect, Option } from "effect"
import { Lock } from "@lockstep/core"
import { RedisServer } from "@lockstep/servers"
import { backendOn, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis failover quarantine")

const longestLease = "2 seconds"
const longestMs = 2_000
// replica acknowledgement (on by default on a master that has replicas) stays off: the promotion
// test builds its holder on a primary whose replica has only just left it
const quarantined = { commandTimeout: "1 second", quarantine: { longestLease }, replication: false } as const
const plain = { commandTimeout: "1 second", quarantine: false, replication: false } as const

/** Takes `key` through `backend`, waiting at most `wait`; when it was granted (ms since `from`) and its fence. */
const takeAt = (backend: Parameters<typeof withBackend>[0], key: string, from: number, wait: Duration.DurationInput = "10 seconds") =>
  Effect.gen(function*() {
    const lock = yield* Lock.make(key, { lease: longestLease }).pipe(withBackend(backend))
    const lease = yield* Lock.acquire(lock, { timeout: wait })
    return { at: performance.now() - from, fence: lease.fence, lease }
  })

/** Waits until the server has been up for longer than the longest lease, so its start quarantines nothing. */
const settled = (url: string) =>
  Effect.gen(function*() {
    const client = yield* rawClient(url)
    while (true) {
      const info = yield* Effect.promise(() => client.info("server"))
      const up = Number(/uptime_in_seconds:(\d+)/.exec(info)?.[1] ?? 0)
      if (up * 1000 > longestMs + 1_000) return
      yield* Effect.sleep("250 millis")
    }
  })

describe.skipIf(!runnable)("Redis failover quarantine", () => {
  it.live("a server up for longer than the longest lease grants at once", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      yield* settled(server.url)
      const backend = yield* backendOn(server.url, quarantined)
      const startedAt = performance.now()
      const first = yield* Effect.scoped(takeAt(backend, "q:settled", startedAt))
      assert.isBelow(first.at, 500, `granted after ${first.at.toFixed(0)} ms`)
    }).pipe(Effect.scoped), 30_000)

  it.live("a restart that lost the data: no new grant before the longest lease has passed since the restart", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      yield* settled(server.url)
      const a = yield* backendOn(server.url, quarantined)
      const b = yield* backendOn(server.url, quarantined)
      const c = yield* backendOn(server.url, plain)
      const before = yield* Effect.scoped(takeAt(a, "q:restart", performance.now()))
      // timed from before the restart: the old incarnation may have granted until it was killed
      const restartAt = performance.now()
      const restartWallMs = Date.now()
      yield* server.restart
      const restartedAt = performance.now()
      // without the quarantine, another client is granted at once: the double grant of a lost hold
      const unguarded = yield* Effect.scoped(takeAt(c, "q:restart-plain", restartedAt))
      assert.isBelow(unguarded.at, 1_000, `the plain backend granted after ${unguarded.at.toFixed(0)} ms`)
      const guarded = yield* Effect.scoped(takeAt(b, "q:restart", restartAt))
      const grantedWallMs = Date.now()
      const took = `granted ${guarded.at.toFixed(0)} ms after the restart began (which took ${(restartedAt - restartAt).toFixed(0)} ms)`
      assert.isAtLeast(guarded.at, longestMs, took)
      // uptime is whole seconds: the server's start is never taken as earlier than it was, and at
      // most about a second later
      assert.isBelow(guarded.at - (restartedAt - restartAt), longestMs + 1_500, took)
      // the quarantine as the server dated it (`<replid>|<since ms>`, on the server's clock, this
      // machine's): from no earlier than the restart, and the grant the full longest lease after that
      const client = yield* rawClient(server.url)
      const record = yield* Effect.promise(() => client.get("lockstep_epoch"))
      const since = Number(/\|(\d+)$/.exec(record ?? "")?.[1] ?? Number.NaN)
      assert.isAtLeast(since, restartWallMs, `the epoch record ${record} dates the quarantine before the restart`)
      assert.isAtLeast(grantedWallMs - since, longestMs, `granted ${grantedWallMs - since} ms after the epoch ${record} began`)
      assert.isAbove(guarded.fence, before.fence, "fences keep increasing across the lost data")
      console.log(
        `restart: plain grant after ${unguarded.at.toFixed(0)} ms; quarantined: ${took}, ${grantedWallMs - since} ms after the epoch began`
      )
    }).pipe(Effect.scoped), 30_000)

  it.live("a replica promoted without the grant: no new grant there before the longest lease has passed", () =>
    Effect.gen(function*() {
      const primary = yield* RedisServer.make()
      const replica = yield* RedisServer.make()
      yield* settled(replica.url)
      const onReplica = yield* rawClient(replica.url)
      yield* Effect.promise(() => onReplica.call("REPLICAOF", "127.0.0.1", String(primary.port)))
      const onPrimary = yield* rawClient(primary.url)
      // in sync, then cut off: the grant below never reaches the replica
      yield* Effect.promise(() => onPrimary.set("q:warm", "1"))
      yield* Effect.promise(() => onPrimary.call("WAIT", "1", "2000"))
      yield* Effect.promise(() => onReplica.call("REPLICAOF", "NO", "ONE"))
      const promotedAt = performance.now()
      const holderBackend = yield* backendOn(primary.url, quarantined)
      const holder = yield* Effect.scoped(takeAt(holderBackend, "q:promoted", promotedAt))
      // clients now reach the promoted replica, which never saw that grant
      const plainAfter = yield* backendOn(replica.url, plain)
      const unguarded = yield* Effect.scoped(takeAt(plainAfter, "q:promoted", promotedAt))
      assert.isBelow(unguarded.at, 1_000, "without the quarantine the promoted replica grants at once: a double grant")
      const guardedAfter = yield* backendOn(replica.url, quarantined)
      const guarded = yield* Effect.scoped(takeAt(guardedAfter, "q:promoted-2", promotedAt))
      assert.isAtLeast(guarded.at, longestMs, `granted ${guarded.at.toFixed(0)} ms after the promotion`)
      assert.isAbove(guarded.fence, holder.fence, "the new grant's fence is above the old master's")
      const record = yield* Effect.promise(() => onReplica.get("lockstep_epoch"))
      assert.isTrue(Option.isSome(Option.fromNullable(record)), "the epoch record is written")
      console.log(`promotion: plain grant after ${unguarded.at.toFixed(0)} ms, quarantined grant after ${guarded.at.toFixed(0)} ms`)
    }).pipe(Effect.scoped), 30_000)

  it.live("a lease longer than longestLease is refused before any call", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const backend = yield* backendOn(server.url, quarantined)
      const lock = yield* Lock.make("q:long", { lease: "5 seconds" }).pipe(withBackend(backend))
      const error = yield* Effect.flip(Effect.scoped(Lock.acquire(lock)))
      assert.strictEqual(error._tag, "InvalidLockOptions")
      assert.include(error.message, "quarantine.longestLease")
    }).pipe(Effect.scoped), 30_000)
})
