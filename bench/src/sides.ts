/**
 * The implementations under test ("sides"), each opened as one worker's `Locker` on one key
 * through its own ioredis connection (and its own backend / lock instance). Peers run with their
 * default retry settings, except that they wait as long as it takes (no acquire timeout).
 */
import type { Scope } from "effect"
import { Context, Duration, Effect, Layer } from "effect"
import { DistributedSemaphore, RedisBacking } from "effect-distributed-lock"
import { Mutex } from "redis-semaphore"
import Redlock from "redlock"
import { FairLock, Lock, LockBackend } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import { endedKeyOf, keysOf } from "../../packages/redis/src/internal/scripts/lock.js"
import * as library from "../../packages/redis/src/internal/scripts/library.js"
import * as scripts from "../../packages/redis/src/internal/scripts/lock.js"
import type { Locker } from "./shared.js"
import { connect, exclusiveAcquire, promiseLocker } from "./shared.js"

export type SideId =
  | "baseline-evalsha"
  | "floor-effect-evalsha"
  | "floor-lockstep-scripts"
  | "floor-lockstep-scripts-effect"
  | "floor-lockstep-backend"
  | "lockstep-lock"
  | "lockstep-fairlock"
  | "redlock"
  | "redis-semaphore"
  | "effect-distributed-lock"
  | "effect-distributed-lock-poll"
  | "failover-off"
  | "failover-defaults"
  | "failover-replicas-1"
  | "failover-replicas-2"
  | "failover-quarantine"
  | "failover-both"

/** What a scenario may set when it opens a side; sides it does not apply to ignore it. */
export interface OpenOptions {
  /** The lock's watchdog (the lease it keeps renewing), ms. */
  readonly watchdogMs?: number | undefined
}

export interface Side {
  readonly id: SideId
  readonly name: string
  readonly open: (url: string, key: string, options?: OpenOptions) => Effect.Effect<Locker, never, Scope.Scope>
}

/** A connection of its own with `return 1` loaded: one EVALSHA round trip per call. */
const returnOne = (url: string) =>
  Effect.gen(function*() {
    const client = yield* connect(url)
    const sha = String(yield* Effect.promise(() => client.script("LOAD", "return 1")))
    return () => client.evalsha(sha, 0)
  })

/** Not a lock: two EVALSHA round trips of `return 1` per cycle, the floor for a script-based lock. */
const baselineEvalsha: Side = {
  id: "baseline-evalsha",
  name: "baseline: 2 x EVALSHA 'return 1'",
  open: (url) =>
    Effect.map(returnOne(url), (call) =>
      promiseLocker(async () => {
        await call()
        return async () => {
          await call()
        }
      }))
}

/**
 * Not a lock: the baseline's two EVALSHA, each as an `Effect.promise` in an Effect loop. What
 * Effect's runtime itself adds to two round trips: the floor for any Effect-based lock.
 */
const floorEffectEvalsha: Side = {
  id: "floor-effect-evalsha",
  name: "floor: the baseline through Effect.promise",
  open: (url) =>
    Effect.map(returnOne(url), (call) => {
      const evalsha = Effect.promise(call)
      return { withLock: <A, E>(body: Effect.Effect<A, E>) => Effect.zipRight(evalsha, Effect.zipLeft(body, evalsha)) }
    })
}

/**
 * lockstep's acquire and release scripts on a connection of their own, called as the backend calls
 * them: FCALL of its function library (loaded here if the server does not have it yet).
 */
const lockstepScripts = (url: string, key: string) =>
  Effect.gen(function*() {
    const client = yield* connect(url)
    yield* Effect.promise(() =>
      client.call("FUNCTION", "LOAD", library.source).catch((error: unknown) =>
        error instanceof Error && error.message.includes("already exists") ? undefined : Promise.reject(error)
      )
    )
    const acquire = library.functionOf(scripts.acquire)
    const release = library.functionOf(scripts.release)
    let next = 0
    return {
      /** A new holder, as `withLock` makes one per cycle. */
      holder: () => `bench-scripts:${++next}`,
      acquire: (holder: string) => {
        const keys = keysOf(key, endedKeyOf(key, holder))
        // holder, mode, permits, limit, leaseMs, fair, waiterTtlMs, count, wake code, register
        return client.fcall(acquire, keys.length, ...keys, holder, "x", 1, 1, 30_000, "0", 5_000, 1, "0", "0")
      },
      release: (holder: string) => {
        const keys = keysOf(key, endedKeyOf(key, holder))
        // holder, mode, count, leaseMs
        return client.fcall(release, keys.length, ...keys, holder, "x", 1, 30_000)
      }
    }
  })

/**
 * Not a lock API: lockstep's own acquire and release scripts, one FCALL each per cycle (a new
 * holder each time, with the arguments the backend sends, as it sends them), from a plain ioredis loop without
 * Effect. What the scripts cost on the server and on the wire: the ceiling of any client code
 * around them.
 */
const floorLockstepScripts: Side = {
  id: "floor-lockstep-scripts",
  name: "floor: lockstep's scripts, plain ioredis",
  open: (url, key) =>
    Effect.map(lockstepScripts(url, key), (calls) =>
      promiseLocker(async () => {
        const holder = calls.holder()
        await calls.acquire(holder)
        return async () => {
          await calls.release(holder)
        }
      }))
}

/**
 * Not a lock API: the same two scripts, each call an `Effect.promise` in an Effect loop. What
 * Effect's runtime adds to lockstep's scripts: the floor for lockstep's backend, whose own code
 * (the Redis call layer) is what lies between this side and the next one.
 */
const floorLockstepScriptsEffect: Side = {
  id: "floor-lockstep-scripts-effect",
  name: "floor: lockstep's scripts through Effect.promise",
  open: (url, key) =>
    Effect.map(lockstepScripts(url, key), (calls) => ({
      withLock: <A, E>(body: Effect.Effect<A, E>) =>
        Effect.suspend(() => {
          const holder = calls.holder()
          return Effect.zipRight(
            Effect.promise(() => calls.acquire(holder)),
            Effect.zipLeft(body, Effect.promise(() => calls.release(holder)))
          )
        })
    }))
}

/**
 * Not a lock API: lockstep's Redis backend called directly, one acquire and one release per cycle
 * (a new holder each time, as `withLock` makes), with no lease, watchdog or body fiber around it.
 * The cost of the two scripts and the backend's own Effect code: the floor for lockstep's `Lock`.
 */
const floorLockstepBackend: Side = {
  id: "floor-lockstep-backend",
  name: "floor: lockstep's backend calls alone",
  open: (url, key) =>
    Effect.gen(function*() {
      const client = yield* connect(url)
      const context = yield* Effect.orDie(Layer.build(RedisBackend.layer({ client })))
      const backend = Context.get(context, LockBackend.LockBackend)
      let next = 0
      return {
        withLock: <A, E>(body: Effect.Effect<A, E>) =>
          Effect.suspend(() => {
            const holder = `${backend.clientId}:${++next}`
            const acquire = backend.acquire(exclusiveAcquire(key, holder))
            const release = backend.release({ key, mode: "exclusive", leaseMs: 30_000, holder, count: 1 })
            return Effect.zipRight(acquire, Effect.zipLeft(body, release))
          })
      }
    })
}

/** lockstep on the Redis backend (`RedisBackend.layer` on the worker's own client), default options. */
const lockstep = (id: SideId, name: string, make: typeof Lock.make): Side => ({
  id,
  name,
  open: (url, key) =>
    Effect.gen(function*() {
      const client = yield* connect(url)
      const context = yield* Effect.orDie(Layer.build(RedisBackend.layer({ client })))
      const lock = yield* Effect.orDie(Effect.provide(make(key), context))
      return { withLock: <A, E>(body: Effect.Effect<A, E>) => Lock.withLock(body, lock) }
    })
})

const lockstepLock = lockstep("lockstep-lock", "lockstep Lock", Lock.make)
const lockstepFairLock = lockstep("lockstep-fairlock", "lockstep FairLock", FairLock.make)

/** redlock 4 on one server, retrying forever at its default 200 ms ± 100 ms. */
const redlock: Side = {
  id: "redlock",
  name: "redlock 4.2.0 (retry 200±100 ms)",
  open: (url, key) =>
    Effect.map(connect(url), (client) => {
      const redlock = new Redlock([client], { retryCount: -1 })
      return promiseLocker(async () => {
        const lock = await redlock.lock(key, 10_000)
        return () => lock.unlock()
      })
    })
}

/** redis-semaphore's Mutex (SET NX PX, polling every 10 ms by default), no acquire timeout. */
const redisSemaphore: Side = {
  id: "redis-semaphore",
  name: "redis-semaphore Mutex (retry 10 ms)",
  open: (url, key) =>
    Effect.map(connect(url), (client) => {
      const mutex = new Mutex(client, key, {
        acquireTimeout: 3_600_000,
        onLockLost: (error) => console.error(`redis-semaphore: ${error.message}`)
      })
      return promiseLocker(async () => {
        await mutex.acquire()
        return () => mutex.release()
      })
    })
}

/** effect-distributed-lock: a semaphore with limit 1, `withPermits(1)`. */
const effectDistributedLock = (id: SideId, name: string, pushBasedAcquireEnabled: boolean): Side => ({
  id,
  name,
  open: (url, key) =>
    Effect.gen(function*() {
      const client = yield* connect(url)
      const context = yield* Layer.build(RedisBacking.layer(client, { pushBasedAcquireEnabled }))
      const semaphore = yield* Effect.provide(DistributedSemaphore.make(key, { limit: 1 }), context)
      return { withLock: <A, E>(body: Effect.Effect<A, E>) => semaphore.withPermits(1)(body) }
    })
})

const edl = effectDistributedLock(
  "effect-distributed-lock",
  "effect-distributed-lock (poll 100 ms + pub/sub)",
  true
)
const edlPoll = effectDistributedLock(
  "effect-distributed-lock-poll",
  "effect-distributed-lock, pub/sub off",
  false
)

/**
 * lockstep's Lock on `RedisBackend.layerFrom(url, tuning)`: the backend opens its own connections,
 * so `url` may be a plain `redis://` URL or a `redis+sentinel://` one. The failover options are
 * given the lock's watchdog where they need a lease bound (`quarantine.longestLease`).
 */
const lockstepTuned = (id: SideId, name: string, tuning: (watchdogMs: number) => RedisBackend.Tuning): Side => ({
  id,
  name,
  open: (url, key, options) =>
    Effect.gen(function*() {
      const watchdogMs = options?.watchdogMs ?? 30_000
      const context = yield* Effect.orDie(Layer.build(RedisBackend.layerFrom(url, tuning(watchdogMs))))
      const lock = yield* Effect.orDie(Effect.provide(Lock.make(key, { watchdog: Duration.millis(watchdogMs) }), context))
      return { withLock: <A, E>(body: Effect.Effect<A, E>) => Lock.withLock(body, lock) }
    })
})

const quarantineOf = (watchdogMs: number) => ({ longestLease: Duration.millis(watchdogMs) })

/**
 * The Redis backend's failover options (scenario 10): both off, the defaults (which depend on the
 * connection: through sentinels the quarantine, on a master with replicas the acknowledgement by
 * every replica), each option alone and both together.
 */
export const failoverSides = {
  off: lockstepTuned("failover-off", "replication: false, quarantine: false", () => ({ replication: false, quarantine: false })),
  defaults: lockstepTuned("failover-defaults", "default options", () => ({})),
  replicas1: lockstepTuned("failover-replicas-1", "replication: { replicas: 1 }", () => ({ replication: { replicas: 1 }, quarantine: false })),
  replicas2: lockstepTuned("failover-replicas-2", "replication: { replicas: 2 }", () => ({ replication: { replicas: 2 }, quarantine: false })),
  quarantine: lockstepTuned("failover-quarantine", "quarantine", (watchdogMs) => ({ quarantine: quarantineOf(watchdogMs), replication: false })),
  both: lockstepTuned("failover-both", "replicas: 2 + quarantine", (watchdogMs) => ({
    replication: { replicas: 2 },
    quarantine: quarantineOf(watchdogMs)
  }))
} as const

export const sides = {
  baselineEvalsha,
  floorEffectEvalsha,
  floorLockstepScripts,
  floorLockstepScriptsEffect,
  floorLockstepBackend,
  lockstepLock,
  lockstepFairLock,
  redlock,
  redisSemaphore,
  edl,
  edlPoll
} as const

/** The sides of an uncontended cycle: the baseline, lockstep's Lock and every peer on its settings. */
export const uncontendedSides = [
  sides.baselineEvalsha,
  sides.floorEffectEvalsha,
  sides.floorLockstepScripts,
  sides.floorLockstepScriptsEffect,
  sides.floorLockstepBackend,
  sides.lockstepLock,
  sides.redlock,
  sides.redisSemaphore,
  sides.edl,
  sides.edlPoll
]

export const sideById = (id: string): Side | undefined =>
  [...Object.values(sides), ...Object.values(failoverSides)].find((side) => side.id === id)
