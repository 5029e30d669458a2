/**
 * Scenario 10: what the Redis backend's failover options cost an uncontended lock+unlock cycle:
 * `replication` (each grant waits for replica acknowledgement, `WAIT`), `quarantine` (each new
 * grant checks the server's epoch record), both, and the defaults (on this topology: every
 * replica acknowledges, and through the sentinels the quarantine too), against both turned off. On a
 * topology of its own: a primary with 2 replicas (replicating from it directly) and 3 sentinels,
 * reached directly and through the sentinels (`redis+sentinel://`). Each side runs in a worker
 * process of its own, as in scenario 1: cycles/s, cycle-time percentiles, client CPU per cycle,
 * the primary's script time and `WAIT`s per cycle (INFO commandstats), and the CPU the primary
 * and the replicas spend per cycle (INFO cpu).
 */
import type { ChildProcess } from "node:child_process"
import { Effect } from "effect"
import type { Redis } from "ioredis"
import * as RedisSentinel from "@lockstep/servers/RedisSentinel"
import type { Env, Failures, Latencies } from "./shared.js"
import {
  commandStats,
  connect,
  describeFailures,
  fmt,
  info,
  interleave,
  median,
  mergeFailures,
  now,
  printTable,
  ratio,
  resetStats,
  serverCpuSeconds,
  sleep
} from "./shared.js"
import type { Side } from "./sides.js"
import { failoverSides } from "./sides.js"
import { request, spawnWorker } from "./workers.js"

type Via = "direct" | "sentinels"

interface Measured {
  readonly side: Side
  readonly via: Via
  /**
   * The side's quarantine (its longestLease, ms), if it has one: it runs only once the primary
   * has been up that long.
   */
  readonly quarantine: (leaseMs: number) => number | undefined
}

const none = () => undefined
const ownLease = (leaseMs: number) => leaseMs
/** The default quarantine's longestLease. */
const defaultLongest = () => 30_000

/** The sides, in the table's order. */
const measured: ReadonlyArray<Measured> = [
  { side: failoverSides.off, via: "direct", quarantine: none },
  { side: failoverSides.defaults, via: "direct", quarantine: none },
  { side: failoverSides.replicas1, via: "direct", quarantine: none },
  { side: failoverSides.replicas2, via: "direct", quarantine: none },
  { side: failoverSides.quarantine, via: "direct", quarantine: ownLease },
  { side: failoverSides.both, via: "direct", quarantine: ownLease },
  { side: failoverSides.off, via: "sentinels", quarantine: none },
  { side: failoverSides.defaults, via: "sentinels", quarantine: defaultLongest },
  { side: failoverSides.both, via: "sentinels", quarantine: ownLease }
]

interface Sample {
  readonly opsPerSec: number
  readonly latencyMs: Latencies | undefined
  readonly cpuUsPerOp: number
  /** `evalsha` + `eval` + `fcall` time on the primary (the calls scripts make included). */
  readonly scriptUsPerOp: number
  readonly waitsPerOp: number
  readonly primaryCpuUsPerOp: number
  readonly replicasCpuUsPerOp: number
  readonly failures: Failures
}

const uptimeSeconds = (admin: Redis): Effect.Effect<number> =>
  Effect.map(info(admin, "server"), (m) => Number(m.get("uptime_in_seconds") ?? 0))

/**
 * Waits until the primary has been up for `leaseMs`: before that, the quarantine holds back every
 * new grant of a server that never was promoted (a lease granted before its start may still run).
 * `uptime_in_seconds` may overstate it by up to a second, which the quarantine allows for. Returns how long it waited.
 */
const awaitUptime = (admin: Redis, leaseMs: number): Effect.Effect<number> =>
  Effect.gen(function*() {
    const started = now()
    while (true) {
      const up = yield* uptimeSeconds(admin)
      // the quarantine takes the start a second later than uptime says (uptime may overstate it)
      if ((up - 1) * 1000 >= leaseMs) return now() - started
      yield* Effect.promise(() => sleep(leaseMs - (up - 1) * 1000 + 100))
    }
  })

export const run = (env: Env) =>
  Effect.gen(function*() {
    const windowMs = env.smoke ? 400 : 2000
    // as in scenario 1: V8 takes seconds of a loop to optimize it, each window follows an unmeasured one
    const warmupMs = env.smoke ? 200 : 1500
    // every side's watchdog, and the quarantine's longestLease; the primary must be up that long
    const leaseMs = env.smoke ? 2000 : 30_000

    const setupStarted = now()
    const topology = yield* RedisSentinel.make({ replicas: 2, sentinels: 3 })
    const primary = topology.primary
    // the servers package's replicas replicate through TCP proxies in this process (so that tests can cut
    // them): here they replicate from the primary directly, as they would in production (and as
    // the sentinels would re-point them anyway once their failover-timeout passed, mid-run)
    const primaryAdmin = yield* connect(primary.url)
    const replicaAdmins = yield* Effect.forEach(topology.replicas, (replica) => connect(replica.url))
    yield* Effect.forEach(replicaAdmins, (admin) => Effect.promise(() => admin.replicaof(primary.host, primary.port)))
    yield* topology.awaitSync()
    yield* topology.awaitSentinels()
    const setupMs = now() - setupStarted

    const sentinelUrl = `redis+sentinel://${topology.sentinelAddresses.map((a) => `${a.host}:${a.port}`).join(",")}/${topology.name}`
    const urlOf = (via: Via) => (via === "direct" ? primary.url : sentinelUrl)
    const workers: ReadonlyArray<ChildProcess> = yield* Effect.forEach(measured, (m) =>
      Effect.gen(function*() {
        const child = yield* spawnWorker
        yield* request(child, {
          type: "open",
          side: m.side.id,
          url: urlOf(m.via),
          key: `s10:${m.via}:${m.side.id}`,
          options: { watchdogMs: leaseMs }
        })
        return child
      }), { concurrency: "unbounded" })

    const cpuNow = Effect.all([serverCpuSeconds(primaryAdmin), Effect.forEach(replicaAdmins, serverCpuSeconds)], {
      concurrency: "unbounded"
    })
    const loop = (i: number, ms: number, trackLatencies: boolean) =>
      Effect.flatMap(
        request(workers[i]!, { type: "run", startAtEpochMs: Date.now(), windowMs: ms, holdMs: 0, trackWaits: false, trackLatencies }),
        (reply) => reply.type === "done" ? Effect.succeed(reply) : Effect.dieMessage(`unexpected reply ${reply.type}`)
      )
    // in each round the sides without the quarantine run first, then by their longestLease, while
    // the primary's uptime grows
    const longestOf = (i: number) => measured[i]!.quarantine(leaseMs) ?? 0
    const runOrder = [...measured.keys()].sort((a, b) => longestOf(a) - longestOf(b))
    let quarantineWaitMs = 0

    const ordered = yield* interleave(env.rounds, runOrder, (i) =>
      Effect.gen(function*() {
        if (longestOf(i) > 0) quarantineWaitMs += yield* awaitUptime(primaryAdmin, longestOf(i))
        yield* loop(i, warmupMs, false)
        yield* resetStats(primaryAdmin)
        const [primaryBefore, replicasBefore] = yield* cpuNow
        const { cpuMs, result } = yield* loop(i, windowMs, true)
        const [primaryAfter, replicasAfter] = yield* cpuNow
        const stats = yield* commandStats(primaryAdmin)
        const count = Math.max(1, result.count)
        const replicasSeconds = replicasAfter.reduce((sum, after, r) => sum + after - replicasBefore[r]!, 0)
        // lockstep runs its scripts as Redis Functions (FCALL) where the server allows it
        const scriptUsec = (stats.get("evalsha")?.usec ?? 0) + (stats.get("eval")?.usec ?? 0) + (stats.get("fcall")?.usec ?? 0)
        return {
          opsPerSec: (result.count / windowMs) * 1000,
          latencyMs: result.latencyMs,
          cpuUsPerOp: (cpuMs * 1000) / count,
          scriptUsPerOp: scriptUsec / count,
          waitsPerOp: (stats.get("wait")?.calls ?? 0) / count,
          primaryCpuUsPerOp: ((primaryAfter - primaryBefore) * 1e6) / count,
          replicasCpuUsPerOp: (replicasSeconds * 1e6) / count,
          failures: result.failures
        } satisfies Sample
      }))
    const samples = measured.map((_, i) => ordered[runOrder.indexOf(i)]!)

    const longest = `${fmt(leaseMs / 1000)} s`
    const nameOf = (m: Measured) => m.side.id === "failover-defaults"
      ? (m.via === "direct" ? "default options (every replica acknowledges)" : "default options (every replica acknowledges + quarantine 30 s)")
      : m.side.id === "failover-quarantine"
      ? `quarantine: { longestLease: "${longest}" }`
      : m.side.id === "failover-both"
      ? `replicas: 2 + quarantine (${longest})`
      : m.side.name
    const rows = measured.map((m, i) => {
      const s: ReadonlyArray<Sample> = samples[i]!
      return {
        side: m.side.id,
        via: m.via,
        name: `${m.via === "direct" ? "primary" : "sentinels"}: ${nameOf(m)}`,
        opsPerSec: median(s.map((x) => x.opsPerSec)),
        p50Ms: median(s.map((x) => x.latencyMs?.p50 ?? NaN)),
        p99Ms: median(s.map((x) => x.latencyMs?.p99 ?? NaN)),
        maxMs: median(s.map((x) => x.latencyMs?.max ?? NaN)),
        cpuUsPerOp: median(s.map((x) => x.cpuUsPerOp)),
        scriptUsPerOp: median(s.map((x) => x.scriptUsPerOp)),
        waitsPerOp: median(s.map((x) => x.waitsPerOp)),
        primaryCpuUsPerOp: median(s.map((x) => x.primaryCpuUsPerOp)),
        replicasCpuUsPerOp: median(s.map((x) => x.replicasCpuUsPerOp)),
        failures: mergeFailures(s.map((x) => x.failures)),
        perRound: s
      }
    })
    const base = rows[0]!
    const us = (ms: number) => fmt(ms * 1000)
    yield* printTable(
      `10. Failover options of the Redis backend: uncontended lockstep Lock cycles, 1 worker, primary + 2 replicas + 3 sentinels ` +
        `(${env.rounds} x ${windowMs} ms, median)`,
      [
        "connection: options",
        "cycles/s",
        "vs off",
        "p50 us",
        "vs off",
        "p99 us",
        "client CPU us/cycle",
        "vs off",
        "script us/cycle",
        "WAIT/cycle",
        "primary CPU us/cycle",
        "replicas CPU us/cycle",
        "failures"
      ],
      rows.map((r) => [
        r.name,
        fmt(r.opsPerSec),
        ratio(r.opsPerSec, base.opsPerSec),
        us(r.p50Ms),
        ratio(r.p50Ms, base.p50Ms),
        us(r.p99Ms),
        fmt(r.cpuUsPerOp, 1),
        ratio(r.cpuUsPerOp, base.cpuUsPerOp),
        fmt(r.scriptUsPerOp, 1),
        fmt(r.waitsPerOp, 2),
        fmt(r.primaryCpuUsPerOp, 1),
        fmt(r.replicasCpuUsPerOp, 1),
        describeFailures(r.failures)
      ]),
      [
        `every ratio against the first row (the primary reached directly, both options off); every side's watchdog is ${longest}`,
        "p50 / p99: time of one lock+unlock cycle (Lock.withLock of an empty body); each side in a worker process of its own,",
        "client CPU is that process's user+system time; script us (evalsha + eval + fcall, the calls inside included) and WAITs on the",
        "primary from INFO commandstats; server CPU from INFO cpu (replicas: both, added up)",
        `replication's WAIT timeout is its default (250 ms); the quarantine sides ran only once the primary had been up for their ` +
          `longestLease (${longest}, the defaults' 30 s: the stall of a new master; waited ${fmt(quarantineWaitMs / 1000, 1)} s ` +
          `for it; setup ${fmt(setupMs / 1000, 1)} s)`
      ]
    )
    return {
      windowMs,
      warmupMs,
      leaseMs,
      rounds: env.rounds,
      setupMs: Math.round(setupMs),
      quarantineWaitMs: Math.round(quarantineWaitMs),
      rows: rows.map((r) => ({
        ...r,
        vsOff: r.opsPerSec / base.opsPerSec,
        p50VsOff: r.p50Ms / base.p50Ms,
        cpuVsOff: r.cpuUsPerOp / base.cpuUsPerOp
      }))
    }
  }).pipe(Effect.scoped)
