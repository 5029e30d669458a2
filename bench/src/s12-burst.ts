/**
 * Scenario 12: a burst. One process asks for N locks on distinct keys at once (no key is
 * contended), holds them all, then releases them all. What it measures is the client's cost per
 * call under load: every call waits behind the processing of every reply before it, so a client
 * that spends too long per call runs into its own command timeout (a grant that is not answered
 * in time is given up) where another takes them all.
 */
import { Context, Effect, Either, ExecutionStrategy, Exit, Layer, Scope } from "effect"
import { Mutex } from "redis-semaphore"
import Redlock from "redlock"
import { Lock, LockBackend } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import type { Env, Failures } from "./shared.js"
import {
  addFailure,
  connect,
  cpuMsSince,
  describeFailures,
  exclusiveAcquire,
  fmt,
  interleave,
  median,
  mergeFailures,
  now,
  peerError,
  printTable,
  ratio
} from "./shared.js"

/** One round of a side: every acquisition started at once, then every release. */
interface Round {
  /** Wall time from the first acquisition started to the last one settled, ms. */
  readonly acquireMs: number
  /** Wall time of releasing what was granted, ms. */
  readonly releaseMs: number
  /** The process's CPU for both, ms. */
  readonly cpuMs: number
  readonly granted: number
  readonly failures: Failures
}

interface BurstSide {
  readonly name: string
  readonly round: (url: string, keys: ReadonlyArray<string>) => Effect.Effect<Round, never, Scope.Scope>
}

/** A promise-based peer: `acquire(key)` resolves with its release. */
const promiseSide = (
  name: string,
  open: (url: string) => Effect.Effect<(key: string) => Promise<() => Promise<unknown>>, never, Scope.Scope>
): BurstSide => ({
  name,
  round: (url, keys) =>
    Effect.gen(function*() {
      const acquire = yield* open(url)
      const failures: Failures = {}
      const cpu = process.cpuUsage()
      const started = now()
      const settled = yield* Effect.promise(() => Promise.allSettled(keys.map(acquire)))
      const acquireMs = now() - started
      const releases: Array<() => Promise<unknown>> = []
      for (const s of settled) {
        if (s.status === "fulfilled") releases.push(s.value)
        else addFailure(failures, peerError(s.reason))
      }
      const releaseStarted = now()
      const released = yield* Effect.promise(() => Promise.allSettled(releases.map((release) => release())))
      for (const r of released) if (r.status === "rejected") addFailure(failures, peerError(r.reason))
      return {
        acquireMs,
        releaseMs: now() - releaseStarted,
        cpuMs: cpuMsSince(cpu),
        granted: releases.length,
        failures
      }
    })
})

/**
 * An Effect-based floor: `acquire` and `release` (each an effect) run in a fiber per key, all at
 * once, as `Effect.forEach` with unbounded concurrency runs them.
 */
const effectSide = (
  name: string,
  open: (url: string) => Effect.Effect<
    { readonly acquire: (key: string) => Effect.Effect<unknown, unknown>; readonly release: (key: string) => Effect.Effect<unknown, unknown> },
    never,
    Scope.Scope
  >
): BurstSide => ({
  name,
  round: (url, keys) =>
    Effect.gen(function*() {
      const { acquire, release } = yield* open(url)
      const failures: Failures = {}
      const cpu = process.cpuUsage()
      const started = now()
      const acquired = yield* Effect.forEach(keys, (key) => Effect.either(acquire(key)), { concurrency: "unbounded" })
      const acquireMs = now() - started
      const granted = keys.filter((_, i) => Either.isRight(acquired[i]!))
      for (const r of acquired) if (Either.isLeft(r)) addFailure(failures, r.left)
      const releaseStarted = now()
      const released = yield* Effect.forEach(granted, (key) => Effect.either(release(key)), { concurrency: "unbounded" })
      for (const r of released) if (Either.isLeft(r)) addFailure(failures, r.left)
      return { acquireMs, releaseMs: now() - releaseStarted, cpuMs: cpuMsSince(cpu), granted: granted.length, failures }
    })
})

/** Not a lock: one EVALSHA of `return 1` to acquire and one to release, each an `Effect.promise`. */
const floorEffect = effectSide("floor: EVALSHA 'return 1' x 2 in a fiber per key", (url) =>
  Effect.gen(function*() {
    const client = yield* connect(url)
    const sha = String(yield* Effect.promise(() => client.script("LOAD", "return 1")))
    const call = Effect.promise(() => client.evalsha(sha, 0))
    return { acquire: () => call, release: () => call }
  }))

/** lockstep's Redis backend called directly (no lease, keeper or scope), a fiber per key. */
const floorBackend = effectSide("floor: lockstep's backend calls alone", (url) =>
  Effect.gen(function*() {
    const client = yield* connect(url)
    const context = yield* Effect.orDie(Layer.build(RedisBackend.layer({ client })))
    const backend = Context.get(context, LockBackend.LockBackend)
    const holder = `${backend.clientId}:burst`
    return {
      acquire: (key: string) => backend.acquire(exclusiveAcquire(key, holder)),
      release: (key: string) => backend.release({ key, mode: "exclusive", leaseMs: 30_000, holder, count: 1 })
    }
  }))

/** lockstep: `Lock.acquire` of every key into one scope (watchdog 30 s), then the scope closed. */
const lockstep: BurstSide = {
  name: "lockstep Lock.acquire",
  round: (url, keys) =>
    Effect.gen(function*() {
      const client = yield* connect(url)
      const context = yield* Effect.orDie(Layer.build(RedisBackend.layer({ client })))
      const locks = yield* Effect.orDie(Effect.provide(Effect.forEach(keys, (key) => Lock.make(key)), context))
      const failures: Failures = {}
      // released as the peers release theirs: all at once
      const scope = yield* Scope.make(ExecutionStrategy.parallel)
      const cpu = process.cpuUsage()
      const started = now()
      const results = yield* Effect.forEach(
        locks,
        (lock) => Effect.either(Scope.extend(Lock.acquire(lock), scope)),
        { concurrency: "unbounded" }
      )
      const acquireMs = now() - started
      let granted = 0
      for (const r of results) {
        if (Either.isRight(r)) granted++
        else addFailure(failures, r.left)
      }
      const releaseStarted = now()
      yield* Scope.close(scope, Exit.void)
      return { acquireMs, releaseMs: now() - releaseStarted, cpuMs: cpuMsSince(cpu), granted, failures }
    })
}

const redisSemaphore = promiseSide("redis-semaphore Mutex", (url) =>
  Effect.map(connect(url), (client) => async (key: string) => {
    const mutex = new Mutex(client, key, { acquireTimeout: 3_600_000 })
    await mutex.acquire()
    return () => mutex.release()
  }))

const redlock = promiseSide("redlock 4.2.0", (url) =>
  Effect.map(connect(url), (client) => {
    const redlock = new Redlock([client], { retryCount: -1 })
    return async (key: string) => {
      const held = await redlock.lock(key, 30_000)
      return () => held.unlock()
    }
  }))

export const run = (env: Env) =>
  Effect.gen(function*() {
    const n = env.smoke ? 1_000 : 10_000
    const sides = [floorEffect, floorBackend, lockstep, redisSemaphore, redlock]
    let round = 0
    // warm up: a tenth of the burst for each side
    for (const side of sides) {
      yield* Effect.scoped(side.round(env.url, Array.from({ length: n / 10 }, (_, i) => `s12:warm:${i}`)))
    }
    const samples = yield* interleave(env.rounds, sides, (side) =>
      Effect.scoped(side.round(env.url, Array.from({ length: n }, (_, i) => `s12:${++round}:${i}`))))
    const rows = sides.map((side, i) => {
      const rounds = samples[i]!
      return {
        side: side.name,
        acquireMs: median(rounds.map((r) => r.acquireMs)),
        releaseMs: median(rounds.map((r) => r.releaseMs)),
        cpuUsPerLock: median(rounds.map((r) => (r.cpuMs * 1000) / n)),
        grantedMin: Math.min(...rounds.map((r) => r.granted)),
        failures: mergeFailures(rounds.map((r) => r.failures))
      }
    })
    const best = Math.min(...rows.slice(3).map((r) => r.acquireMs))
    yield* printTable(
      `12. Burst: ${fmt(n)} acquisitions of distinct keys at once, one process (${env.rounds} round(s), median)`,
      ["side", "acquire all ms", "vs best peer", "release all ms", "client CPU us/lock", "granted (min)", "failures"],
      rows.map((r) => [
        r.side,
        fmt(r.acquireMs),
        ratio(best, r.acquireMs),
        fmt(r.releaseMs),
        fmt(r.cpuUsPerLock, 1),
        `${fmt(r.grantedMin)} / ${fmt(n)}`,
        describeFailures(r.failures)
      ]),
      [
        "every acquisition is started at once on one connection; vs best peer = the fastest peer's time / this side's",
        "lockstep: Lock.acquire into one scope (watchdog 30 s), released by closing the scope (finalizers in parallel); failures summed over rounds"
      ]
    )
    return { n, rows }
  })
