/**
 * Scenario 8: what one uncontended lock+unlock cycle (scenario 1) costs Redis, per side.
 * - round trips per cycle and the commands sent: counted with MONITOR over a separate pass
 *   (MONITOR tells commands sent by clients from commands run inside Lua scripts);
 * - Redis commands executed per cycle, in-script calls included, script time per cycle and client
 *   CPU per cycle: `INFO commandstats` deltas (after CONFIG RESETSTAT) over a fixed number of
 *   cycles, without MONITOR;
 * - the server time of each script: every side's script commands (EVALSHA, EVAL, FCALL) from the
 *   same windows, and lockstep's scripts one by one (acquire, release, renew), each in a window of
 *   its own through the backend (EVALSHA / FCALL do not say which script they ran).
 */
import { Context, Effect, Layer } from "effect"
import type { Redis } from "ioredis"
import { LockBackend } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import type { CommandStat, Env, Locker } from "./shared.js"
import { commandStats, connect, cpuMsSince, fmt, interleave, median, printTable, resetStats, runLoop, sleep } from "./shared.js"
import { uncontendedSides } from "./sides.js"

// scenario 1's floors are not locks of their own: their commands are the baseline's and lockstep's
const measured = uncontendedSides.filter((side) => !side.id.startsWith("floor-"))

const scriptCommands = ["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"]

interface Monitored {
  readonly roundTripsPerCycle: number
  readonly luaCallsPerCycle: number
  /** Commands sent by clients, per cycle, by name. */
  readonly sent: Record<string, number>
  /** Commands run inside scripts, per cycle, by name. */
  readonly inScripts: Record<string, number>
}

/** Runs `cycles` cycles under MONITOR and counts what clients sent and what scripts ran. */
const monitored = (admin: Redis, locker: Locker, cycles: number): Effect.Effect<Monitored> =>
  Effect.gen(function*() {
    const monitor = yield* Effect.promise(() => admin.monitor())
    const sent: Record<string, number> = {}
    const inScripts: Record<string, number> = {}
    let lua = 0
    let top = 0
    monitor.on("monitor", (_time: string, args: ReadonlyArray<string>, source: string) => {
      const name = (args[0] ?? "?").toLowerCase()
      if (source === "lua") {
        lua++
        inScripts[name] = (inScripts[name] ?? 0) + 1
      } else {
        top++
        sent[name] = (sent[name] ?? 0) + 1
      }
    })
    yield* runLoop(locker, { holdMs: 0, cycles })
    // let the last lines arrive
    yield* Effect.promise(() => sleep(100))
    monitor.disconnect()
    const perCycle = (counts: Record<string, number>) =>
      Object.fromEntries(Object.entries(counts).map(([name, count]) => [name, count / cycles]))
    return {
      roundTripsPerCycle: top / cycles,
      luaCallsPerCycle: lua / cycles,
      sent: perCycle(sent),
      inScripts: perCycle(inScripts)
    }
  })

/** What one window's commandstats say, per unit (cycle or call). */
interface Window {
  readonly commandsPerUnit: number
  readonly scriptUsecPerUnit: number
  /** Script commands (EVALSHA, FCALL, ...) run per unit. */
  readonly scriptCallsPerUnit: number
  /** Commands run inside scripts per unit, by name (every command but the script commands). */
  readonly inScriptsPerUnit: Record<string, number>
  readonly clientCpuUsPerUnit: number
}

/** The commandstats of a window of `units` units, without the window's own CONFIG RESETSTAT. */
const windowOf = (stats: Map<string, CommandStat>, units: number, cpuMs: number): Window => {
  let commands = 0
  let scriptUsec = 0
  let scriptCalls = 0
  const inScripts: Record<string, number> = {}
  for (const [name, stat] of stats) {
    // the CONFIG RESETSTAT of this measurement is counted after the reset
    if (name === "config|resetstat") continue
    // sent by the client, not by a script (lockstep reads INFO for its eviction guard)
    if (name === "info") {
      commands += stat.calls
      continue
    }
    commands += stat.calls
    // a script's time includes that of the commands it calls
    if (scriptCommands.includes(name)) {
      scriptUsec += stat.usec
      scriptCalls += stat.calls
    } else {
      inScripts[name] = stat.calls / units
    }
  }
  return {
    commandsPerUnit: commands / units,
    scriptUsecPerUnit: scriptUsec / units,
    scriptCallsPerUnit: scriptCalls / units,
    inScriptsPerUnit: inScripts,
    clientCpuUsPerUnit: (cpuMs * 1000) / units
  }
}

/** Runs `cycles` cycles between CONFIG RESETSTAT and INFO commandstats. */
const counted = (admin: Redis, locker: Locker, cycles: number) =>
  Effect.gen(function*() {
    yield* resetStats(admin)
    const cpu = process.cpuUsage()
    yield* runLoop(locker, { holdMs: 0, cycles })
    const cpuMs = cpuMsSince(cpu)
    return windowOf(yield* commandStats(admin), cycles, cpuMs)
  })

/** lockstep's scripts, each measured on its own. */
const lockstepScripts = ["acquire", "release", "renew"] as const
type LockstepScript = (typeof lockstepScripts)[number]

/**
 * One window per lockstep script, through `RedisBackend.layer` on a connection of its own: `calls`
 * acquisitions of free keys (the fast path: a new holder, no waiter), then their releases (no
 * waiter), then `calls` renewals of one held lease (a batch of one, as a lone lease's watchdog
 * sends it). Each call waits for the previous one, as a lock's do.
 */
const perScript = (url: string, calls: number) =>
  Effect.gen(function*() {
    const client = yield* connect(url)
    const context = yield* Effect.orDie(Layer.build(RedisBackend.layer({ client })))
    const backend = Context.get(context, LockBackend.LockBackend)
    let next = 0
    return (admin: Redis): Effect.Effect<Record<LockstepScript, Window>> =>
      Effect.gen(function*() {
        const round = ++next
        const holder = (i: number) => `${backend.clientId}:${round}:${i}`
        const key = (i: number) => `s8:script:${round}:${i}`
        const measured = (run: (i: number) => Effect.Effect<unknown, unknown>) =>
          Effect.gen(function*() {
            // unmeasured: a few calls first, on keys of their own
            for (let i = calls; i < calls + 20; i++) yield* Effect.orDie(run(i))
            yield* resetStats(admin)
            const cpu = process.cpuUsage()
            for (let i = 0; i < calls; i++) yield* Effect.orDie(run(i))
            return windowOf(yield* commandStats(admin), calls, cpuMsSince(cpu))
          })
        const acquire = yield* measured((i) =>
          backend.acquire({
            key: key(i),
            mode: "exclusive",
            leaseMs: 30_000,
            holder: holder(i),
            permits: 1,
            limit: 1,
            fair: false,
            waiterTtlMs: 5_000,
            count: 1
          })
        )
        const release = yield* measured((i) =>
          backend.release({ key: key(i), mode: "exclusive", leaseMs: 30_000, holder: holder(i), count: 1 })
        )
        yield* Effect.orDie(backend.acquire({
          key: key(-1),
          mode: "exclusive",
          leaseMs: 30_000,
          holder: holder(-1),
          permits: 1,
          limit: 1,
          fair: false,
          waiterTtlMs: 5_000,
          count: 1
        }))
        const renewal = [{ key: key(-1), holder: holder(-1), leaseMs: 30_000 }]
        const renew = yield* measured(() => backend.renew(renewal))
        yield* Effect.orDie(backend.release({ key: key(-1), mode: "exclusive", leaseMs: 30_000, holder: holder(-1), count: 1 }))
        return { acquire, release, renew }
      })
  })

/** `counts` as `name n, ...`, the largest first. */
const listed = (counts: Record<string, number>) =>
  Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ")

export const run = (env: Env) =>
  Effect.gen(function*() {
    const cycles = env.smoke ? 200 : 1000
    const lockers = yield* Effect.forEach(measured, (side) => side.open(env.url, `s8:${side.id}`))
    for (const locker of lockers) yield* runLoop(locker, { holdMs: 0, cycles: 20 })
    const monitoredResults: Array<Monitored> = []
    for (const locker of lockers) monitoredResults.push(yield* monitored(env.admin, locker, cycles))
    const samples = yield* interleave(env.rounds, lockers, (locker) => counted(env.admin, locker, cycles))
    const scripts = yield* perScript(env.url, cycles)
    const scriptSamples = (yield* interleave(env.rounds, [scripts], (measure) => measure(env.admin)))[0]!
    const rows = measured.map((side, i) => ({
      side: side.id,
      name: side.name,
      roundTripsPerCycle: monitoredResults[i]!.roundTripsPerCycle,
      sentPerCycle: monitoredResults[i]!.sent,
      luaCallsPerCycle: monitoredResults[i]!.luaCallsPerCycle,
      inScriptsPerCycle: monitoredResults[i]!.inScripts,
      commandsPerCycle: median(samples[i]!.map((s) => s.commandsPerUnit)),
      scriptUsecPerCycle: median(samples[i]!.map((s) => s.scriptUsecPerUnit)),
      scriptCallsPerCycle: median(samples[i]!.map((s) => s.scriptCallsPerUnit)),
      clientCpuUsPerCycle: median(samples[i]!.map((s) => s.clientCpuUsPerUnit))
    }))
    /** Per script: lockstep's one by one, and each other side's scripts of a cycle together. */
    const scriptRows = [
      ...lockstepScripts.map((script) => {
        const windows = scriptSamples.map((sample) => sample[script])
        const calls = median(windows.map((w) => w.scriptCallsPerUnit))
        const inScripts = Object.fromEntries(
          [...new Set(windows.flatMap((w) => Object.keys(w.inScriptsPerUnit)))].map((name) => [
            name,
            median(windows.map((w) => w.inScriptsPerUnit[name] ?? 0))
          ])
        )
        return {
          side: "lockstep-backend",
          script,
          callsPerUnit: calls,
          usecPerCall: median(windows.map((w) => w.scriptUsecPerUnit / Math.max(1, w.scriptCallsPerUnit))),
          inScriptsPerCall: inScripts,
          inScriptCallsPerCall: Object.values(inScripts).reduce((a, b) => a + b, 0),
          clientCpuUsPerCall: median(windows.map((w) => w.clientCpuUsPerUnit))
        }
      }),
      ...rows.filter((r) => r.scriptCallsPerCycle > 0).map((r) => ({
        side: r.side,
        script: `${r.name} (each script of a cycle)`,
        callsPerUnit: r.scriptCallsPerCycle,
        usecPerCall: r.scriptUsecPerCycle / r.scriptCallsPerCycle,
        inScriptsPerCall: Object.fromEntries(
          Object.entries(r.inScriptsPerCycle).map(([name, n]) => [name, n / r.scriptCallsPerCycle])
        ),
        inScriptCallsPerCall: r.luaCallsPerCycle / r.scriptCallsPerCycle,
        clientCpuUsPerCall: r.clientCpuUsPerCycle / Math.max(1, r.roundTripsPerCycle)
      }))
    ]
    yield* printTable(
      `8. Redis cost of one uncontended lock+unlock cycle (${fmt(cycles)} cycles; commandstats: ${env.rounds} round(s), median)`,
      ["side", "round trips", "sent per cycle", "in-script calls", "commands executed", "script us/cycle", "client CPU us/cycle"],
      rows.map((r) => [
        r.name,
        fmt(r.roundTripsPerCycle, 2),
        Object.entries(r.sentPerCycle).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", "),
        fmt(r.luaCallsPerCycle, 2),
        fmt(r.commandsPerCycle, 2),
        fmt(r.scriptUsecPerCycle, 1),
        fmt(r.clientCpuUsPerCycle, 1)
      ]),
      [
        "round trips / sent / in-script calls: from MONITOR; commands executed (scripts and the calls inside them) and",
        "script time (cmdstat eval+evalsha+fcall usec, nested calls included) per cycle: from INFO commandstats;",
        "client CPU: this process's user+system time over the commandstats window (every side runs in this process)",
        ...rows.filter((r) => r.side === "lockstep-lock").map((r) =>
          `lockstep's in-script calls per cycle: ${
            Object.entries(r.inScriptsPerCycle).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ")
          }`
        )
      ]
    )
    yield* printTable(
      `8. Server time per script (commandstats usec_per_call, nested calls included; ${fmt(cycles)} calls per window, median)`,
      ["script", "calls per window unit", "us/call", "in-script calls/call", "in-script commands per call", "client CPU us/call"],
      scriptRows.map((r) => [
        r.side === "lockstep-backend" ? `lockstep ${r.script}` : r.script,
        fmt(r.callsPerUnit, 2),
        fmt(r.usecPerCall, 1),
        fmt(r.inScriptCallsPerCall, 2),
        listed(r.inScriptsPerCall) || "-",
        fmt(r.clientCpuUsPerCall, 1)
      ]),
      [
        "lockstep acquire / release / renew: each script in a window of its own, through RedisBackend.layer: acquisitions",
        "of free keys (fast path), their releases (no waiter), renewals of one lease; calls per window unit: per call",
        "other rows: the side's script commands of scenario 8's cycles (per cycle), their time divided by their count, and",
        "their in-script calls (MONITOR) per script; client CPU per call: per cycle / round trips;",
        "INFO sent beside the scripts is left out of the in-script calls (lockstep's renewals each read it: the eviction",
        "guard's verdict, kept fresh by every renewal, whose period is seconds; its client CPU is in renew's)"
      ]
    )
    return { cycles, rounds: env.rounds, rows, scripts: scriptRows }
  }).pipe(Effect.scoped)
