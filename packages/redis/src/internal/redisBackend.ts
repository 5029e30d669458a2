/**
 * The Redis backend, assembled from its parts: the script calls (runner.ts), the wake-up hub on
 * its subscriber connection (subscriber.ts, wakeups.ts) and the operations (operations.ts), all
 * following the tracker's lifecycle (tracker.ts).
 */
import type { Scope } from "effect"
import { Duration, Effect, Option } from "effect"
import calculateSlot from "cluster-key-slot"
import type * as LockBackend from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import type { Client, Tuning } from "../RedisBackend.js"
import { operationsOf } from "./operations.js"
import { openRunner, targetOf } from "./runner.js"
import { openWakeups } from "./subscriber.js"
import type { ClientTracker } from "./tracker.js"

// (tests reach these here)
export { maxClaimMs } from "./operations.js"
export { permissionError } from "./runner.js"

/**
 * The quarantine's longest lease in ms (`undefined`: no quarantine), or why it cannot be had: a
 * cluster has no key every node's scripts can share, and a lease must be positive and finite.
 * Unless the tuning says otherwise, it is on through sentinels and off elsewhere.
 */
const quarantineOf = (tuning: Tuning | undefined, isCluster: boolean, sentinels: boolean): number | string | undefined => {
  const quarantine = tuning?.quarantine
  if (quarantine === false || (quarantine === undefined && (isCluster || !sentinels))) return undefined
  if (isCluster) return "the failover quarantine keeps one record per server, which a Redis Cluster cannot share between slots"
  // on by default for a master the sentinels manage, which they may replace by a replica any time
  const longest = quarantine?.longestLease === undefined
    ? Option.some(Duration.seconds(30))
    : Duration.decodeUnknown(tuning.quarantine.longestLease)
  if (Option.isNone(longest)) return "longestLease is not a duration"
  const ms = Duration.toMillis(longest.value)
  if (!Number.isFinite(ms) || ms <= 0) return `longestLease must be a positive, finite duration, got ${Duration.format(longest.value)}`
  return Math.ceil(ms)
}

/**
 * Builds the backend on `client` (borrowed: never closed here), which `tracker` follows. A
 * duplicate connection carries the subscriptions of all waiters; with `replication`, another one
 * carries the scripts whose writes the replicas acknowledge (replication.ts). Both are closed with
 * the scope. Fails (BackendError "connect") only on a `replication` it cannot honour.
 */
export const make = (
  client: Client,
  tuning: Tuning | undefined,
  tracker: ClientTracker,
  reachable: boolean
): Effect.Effect<LockBackend.Service, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const runtime = yield* Effect.runtime<never>()
    const target = targetOf(client, calculateSlot)
    const quarantine = quarantineOf(tuning, target.isCluster, target.sentinels)
    const runner = yield* openRunner(target, tuning, tracker, reachable)
    const wakeups = yield* openWakeups(client, tracker, target.namespace)
    // the first finalizer of the backend to run: calls made from now on (through handles that
    // outlive the layer, by waiters woken here) fail as closed, whether or not the client is still
    // open; the waiters blocked at that moment wake, and their next call fails so
    yield* tracker.lifecycle.closeWithScope
    return operationsOf({
      target,
      runner,
      wakeups,
      tracker,
      quarantine,
      renewBatchSize: tuning?.renewBatchSize ?? 1000,
      runtime
    })
  })
