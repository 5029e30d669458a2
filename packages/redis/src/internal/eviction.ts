/**
 * The eviction guard: whether the servers a backend writes to may evict lock keys, read from
 * `INFO` (which managed services allow, where `CONFIG` often is not).
 *
 * A server with `maxmemory` and any policy but `noeviction` may evict a lock's key: every key a
 * lock writes has a TTL, so the `volatile-*` policies pick them as readily as the `allkeys-*` ones.
 * An evicted key is a lock granted to the next caller while its holder still holds it, and the
 * holder learns of it only at its next renewal. So the backend refuses such a server (building it
 * fails; a policy changed later refuses new grants) unless the user accepted the risk
 * (`acceptEviction`), in which case evictions seen on the server are logged and counted.
 *
 * The verdict is read when the backend is built, again after a reconnection (a failover may have
 * put another server behind the connection), with every batch of renewals, and at most once a
 * second as acquisitions come by: a policy changed at run time is noticed within one renewal
 * period. Every
 * master of a Redis Cluster is read. The acquire path pays nothing while the verdict is fresh.
 */
import type { Scope } from "effect"
import { Data, Effect, Fiber, Metric, Runtime } from "effect"
import type { Redis } from "ioredis"
import { BackendError } from "@lockstep/core/LockError"
import type { Client } from "../RedisBackend.js"
import { unlessConnectionFails } from "./clients.js"
import { nodeAddress, isCluster, isReplyError } from "./descriptions.js"
import type { ClientTracker } from "./tracker.js"

/**
 * The server may evict lock keys (`maxmemory` with a policy other than `noeviction`), and the
 * backend was not told to accept it (`acceptEviction`).
 */
export class EvictionRisk extends Data.TaggedError("EvictionRisk")<{
  /** The server, `host:port`. */
  readonly server: string
  /** Its `maxmemory-policy`. */
  readonly policy: string
  /** Its `maxmemory`, in bytes. */
  readonly maxmemory: number
}> {
  override get message(): string {
    return `Redis ${this.server} may evict lock keys (maxmemory ${this.maxmemory} bytes, maxmemory-policy ${this.policy}), ` +
      "and a lock whose key is evicted is granted to a second holder while the first still holds it: " +
      "set maxmemory-policy noeviction on that server, or give locks a Redis of their own " +
      "(or accept the risk with the backend's acceptEviction option)"
  }
}

/** What one server's `INFO` says of eviction. */
export interface Reading {
  readonly server: string
  readonly maxmemory: number
  readonly policy: string
  readonly evictedKeys: number
  /**
   * The replicas connected to it, by address (`slaveN:ip=…,port=…`; none on a replica). A client
   * that only takes a snapshot (`redis-cli --rdb`, listed with port 0) is not one: it never
   * acknowledges a write.
   */
  readonly replicas: ReadonlyArray<string>
  /**
   * Which server process answered (`run_id`, or its replication id where `run_id` is hidden):
   * another one after a restart or a failover.
   */
  readonly runId: string
}

/** A field of an `INFO` reply (`name:value` lines), or undefined. */
export const infoField = (info: string, name: string): string | undefined => {
  const at = info.indexOf(`\n${name}:`)
  const start = at < 0 ? (info.startsWith(`${name}:`) ? 0 : -1) : at + 1
  if (start < 0) return undefined
  const end = info.indexOf("\n", start)
  return info.slice(start + name.length + 1, end < 0 ? undefined : end).trim()
}

/** The eviction fields of `info`, as read from `server`. */
export const readingOf = (server: string, info: string): Reading => ({
  server,
  maxmemory: Number(infoField(info, "maxmemory") ?? "0") || 0,
  policy: infoField(info, "maxmemory_policy") ?? "noeviction",
  evictedKeys: Number(infoField(info, "evicted_keys") ?? "0") || 0,
  replicas: infoField(info, "role") === "master" ? replicasListed(info) : [],
  runId: infoField(info, "run_id") || infoField(info, "master_replid") || ""
})

/** The addresses of the replicas an `INFO replication` lists, but those with no listening port. */
export const replicasListed = (info: string): ReadonlyArray<string> => {
  const out: Array<string> = []
  for (const line of info.matchAll(/^slave\d+:(.*)$/gm)) {
    const fields = new Map(line[1]!.trim().split(",").map((field) => field.split("=", 2) as [string, string]))
    const port = Number(fields.get("port"))
    if (port > 0) out.push(`${fields.get("ip") ?? ""}:${port}`)
  }
  return out
}

/** Whether a server that reads so may evict a lock's key. */
export const mayEvict = (reading: Reading): boolean => reading.maxmemory > 0 && reading.policy !== "noeviction"

/**
 * Keys evicted on servers a backend runs on while it accepted the risk (`acceptEviction`), by
 * server: each is a key any lock of any process may have lost.
 */
export const evictedKeys = Metric.counter("lockstep_redis_evicted_keys_total", {
  description: "Keys the Redis servers evicted while this process used them for locks (acceptEviction), by server",
  incremental: true
})

/** The guard of one backend. */
export interface EvictionGuard {
  /**
   * Before a new grant is asked for: `undefined` when it may go ahead (the verdict is known and
   * safe, or accepted; a stale one is refreshed in the background), otherwise the effect to run
   * first: a refused server's error, or the reading a grant must wait for.
   */
  readonly beforeAcquire: () => Effect.Effect<void, BackendError> | undefined
  /**
   * How many replicas (by address) the master, on a single server or through sentinels, has had
   * connected since this backend first read it, or since another server process took its place
   * (a restart or a failover). Read at build, after a reconnection and with the renewals and
   * acquisitions that read it again. A replica that drops off stays counted: a grant it did not
   * acknowledge could be lost if it were promoted.
   */
  readonly replicas: () => number
  /**
   * A renewal went out: the servers are read again (unless a reading is in flight), so that a
   * changed policy is noticed within a renewal period and an eviction is logged beside the loss
   * it causes.
   */
  readonly touch: () => void
}

/** How long a verdict holds before an acquisition or a renewal refreshes it. */
const FRESH_MS = 1000

type Verdict =
  | { readonly _tag: "Unknown" }
  | { readonly _tag: "Known"; readonly at: number; readonly refused: BackendError | undefined }

/**
 * Reads the servers behind `client` once (failing the build on a refused one unless `accept`),
 * then keeps the verdict as described above until the scope closes. A server that cannot be
 * reached at build fails the build only when `reachable` says it must be (the layers that open
 * their own connection); a borrowed client's server is read when it answers, and grants wait
 * for that reading.
 */
export const make = (
  client: Client,
  tracker: ClientTracker,
  options: { readonly accept: boolean; readonly reachable: boolean }
): Effect.Effect<EvictionGuard, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const runtime = yield* Effect.runtime<never>()
    let verdict: Verdict = { _tag: "Unknown" }
    /** The evicted_keys each server last showed (for the opt-in's log and metric). */
    const evicted = new Map<string, number>()
    /** The servers whose risk was last logged, so that a risk is logged once, not per reading. */
    let logged = ""
    let built = false
    /** The replicas the master has had (addresses), and the server process they were read from. */
    let replicas = new Set<string>()
    let master: string | undefined

    const nodesOf = (): ReadonlyArray<Redis> => isCluster(client) ? client.nodes("master") : [client]

    const readNode = (node: Redis) => {
      const server = nodeAddress(node.options)
      return Effect.map(
        tracker.call("info", () => node.info()),
        (info) => readingOf(server, info)
      )
    }

    /** The readings of every server, and what they mean; fails when a server cannot be read. */
    const read = Effect.gen(function*() {
      const nodes = nodesOf()
      // a cluster that has not connected yet knows no master: nothing to judge by
      if (nodes.length === 0) return yield* Effect.fail(tracker.fail("info", new Error("no cluster node is known yet")))
      const readings = yield* Effect.forEach(nodes, readNode, { concurrency: "unbounded" })
      const first = readings[0]!
      if (first.runId !== master) replicas = new Set()
      master = first.runId
      for (const replica of first.replicas) replicas.add(replica)
      const risky = readings.filter(mayEvict)
      for (const reading of readings) {
        const before = evicted.get(reading.server)
        evicted.set(reading.server, reading.evictedKeys)
        if (options.accept && before !== undefined && reading.evictedKeys > before) {
          const count = reading.evictedKeys - before
          yield* Metric.incrementBy(Metric.tagged(evictedKeys, "server", reading.server), count)
          yield* Effect.logWarning(
            `lockstep: Redis ${reading.server} evicted ${count} key${count === 1 ? "" : "s"} (maxmemory-policy ${reading.policy}); ` +
              "a lock whose key was evicted may be granted to another holder before its holder learns of the loss at its next renewal"
          ).pipe(Effect.annotateLogs("endpoint", tracker.endpoint))
        }
      }
      const names = risky.map((r) => `${r.server} ${r.policy}`).join(", ")
      if (names !== logged) {
        logged = names
        // a refusal at build is the build's error, not a log line
        if (risky.length > 0 && (built || options.accept)) {
          yield* (options.accept
            ? Effect.logWarning(
              `lockstep: running on Redis that may evict lock keys (${names}), as acceptEviction allows`
            )
            : Effect.logError(`lockstep: ${new EvictionRisk(risky[0]!).message}; new grants fail until it is changed`))
            .pipe(Effect.annotateLogs("endpoint", tracker.endpoint))
        }
      }
      const refused = options.accept || risky.length === 0
        ? undefined
        : tracker.fail("acquire", new EvictionRisk(risky[0]!))
      verdict = { _tag: "Known", at: performance.now(), refused }
      return refused
    })

    // one reading at a time: callers meanwhile wait for the one in flight
    let inFlight: Fiber.RuntimeFiber<BackendError | undefined, BackendError> | undefined
    const start = () => {
      if (inFlight !== undefined) return inFlight
      const fiber = Runtime.runFork(runtime)(read)
      inFlight = fiber
      fiber.addObserver(() => {
        if (inFlight === fiber) inFlight = undefined
      })
      return fiber
    }
    const refresh = Effect.suspend(() => Fiber.join(start()))
    const isStale = (at: number) => performance.now() - at > FRESH_MS

    // the build's reading: a refused server fails the build (operation "connect"). A borrowed
    // client's server that is not there does not fail it: the build goes on at the connection's
    // first error, and grants wait for the reading (the one in flight, or the next)
    const atBuild = options.reachable
      ? yield* Effect.either(refresh)
      : yield* unlessConnectionFails(client, Effect.either(refresh))
    if (atBuild === undefined) {
      // nothing to judge by yet
    } else if (atBuild._tag === "Right") {
      if (atBuild.right !== undefined) return yield* Effect.fail(tracker.fail("connect", atBuild.right.cause))
    } else {
      // a server that answers with an error refuses INFO itself (renamed, or not in the ACL): the
      // error names it (descriptions.ts)
      if (options.reachable || isReplyError(atBuild.left.cause)) {
        return yield* Effect.fail(tracker.fail("connect", atBuild.left.cause))
      }
    }

    built = true
    // a reconnection may be to another server (a failover) or to a reconfigured one: grants wait
    // for a new reading
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        const onReady = () => {
          verdict = { _tag: "Unknown" }
          void start()
        }
        client.on("ready", onReady)
        return onReady
      }),
      (onReady) => Effect.sync(() => client.off("ready", onReady))
    )

    // an acquisition waiting for the reading fails as an acquisition when it cannot be had
    const waitForReading = Effect.flatMap(
      Effect.mapError(refresh, (error) => new BackendError({ operation: "acquire", cause: error.cause, endpoint: error.endpoint, detail: error.detail })),
      (refused) => refused === undefined ? Effect.void : Effect.fail(refused)
    )
    return {
      beforeAcquire: () => {
        const now = verdict
        if (now._tag === "Unknown") return waitForReading
        if (isStale(now.at)) void start()
        return now.refused === undefined ? undefined : Effect.fail(now.refused)
      },
      replicas: () => replicas.size,
      // a renewal period is seconds long: every renewal reads (or joins a reading in flight)
      touch: () => void start()
    }
  })
