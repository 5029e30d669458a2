/**
 * A primary, replicas (each replicating through its own TCP proxy) and sentinels, all real
 * `redis-server` processes, for replication and failover tests. The work is split by concern:
 * starting the processes (redisSentinelLaunch), asking them (redisSentinelQueries), the
 * sentinels' view (redisSentinelMonitor), replication and its cuts (redisSentinelReplication),
 * failovers and priorities (redisSentinelFailover).
 *
 * @since 0.1.0
 * @internal
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import type { Address } from "../RedisServer.js"
import type { Options, RedisSentinel } from "../RedisSentinel.js"
import type { RedisServerError } from "./redisServer.js"
import { certificatesFor } from "./redisServer.js"
import { failover, preferReplica, setReplicaPriority } from "./redisSentinelFailover.js"
import { launchDataNodes, launchSentinels, settingsOf } from "./redisSentinelLaunch.js"
import type { Topology } from "./redisSentinelMonitor.js"
import { awaitMaster, awaitSentinels, master, sentinelsSettled } from "./redisSentinelMonitor.js"
import { callOver, logged, poll } from "./redisSentinelQueries.js"
import { awaitSync, cutReplication, linkAt, restoreReplication, syncTo } from "./redisSentinelReplication.js"
import { HOST } from "./serverProcess.js"

/** `RedisSentinel.make`. */
export const make = (options: Options = {}): Effect.Effect<RedisSentinel, RedisServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const settings = yield* settingsOf(options)
    const certificates = yield* certificatesFor(options.tls)
    const call = callOver(certificates)
    const data = yield* launchDataNodes(settings, call, certificates)
    // the data nodes are in sync before the sentinels look at them, so they see every replica at once
    yield* syncTo(data, data.primary, undefined, settings.readyTimeout)
    const sentinels = yield* launchSentinels(settings, call, data.primary.port, certificates)
    const topology: Topology = {
      ...data,
      name: settings.name,
      sentinels,
      sentinelLogs: logged(sentinels.map((server, index) => ({ name: `sentinel-${index}`, server })))
    }
    yield* poll(
      "sentinels did not settle after startup (agree on the master, know every node and each other)",
      settings.readyTimeout,
      sentinelsSettled(topology),
      topology.sentinelLogs
    )
    const sentinelAddresses: ReadonlyArray<Address> = sentinels.map((sentinel) => ({ host: HOST, port: sentinel.port }))
    const handle: RedisSentinel = {
      name: settings.name,
      ca: certificates?.ca,
      sentinels,
      sentinelAddresses,
      primary: data.primary,
      replicas: data.links.map((link) => link.node),
      nodes: data.nodes,
      master: master(topology),
      awaitMaster: (options) => awaitMaster(topology, options),
      failover: (timeout) => failover(topology, timeout),
      awaitSync: (timeout) => awaitSync(topology, timeout),
      awaitSentinels: (timeout) => awaitSentinels(topology, timeout),
      cutReplication: (index, timeout) => cutReplication(topology, index, timeout),
      restoreReplication: (index, timeout) => restoreReplication(topology, index, timeout),
      isCut: (index) => Effect.map(linkAt(topology, index), (link) => link.cell.cut),
      proxyOf: (index) => Effect.map(linkAt(topology, index), (link) => link.cell.proxy.proxy),
      setReplicaPriority: (index, priority, timeout) => setReplicaPriority(topology, index, priority, timeout),
      preferReplica: (index, timeout) => preferReplica(topology, index, timeout)
    }
    return handle
  })
