/**
 * Scenario 8: what one uncontended lock+unlock cycle (scenario 1) costs Redis, per side.
 * - round trips per cycle and the commands sent: counted with MONITOR over a separate pass
 *   (MONITOR tells commands sent by clients from commands run inside Lua scripts);
 * - Redis commands executed per cycle, in-script calls included, and script time per cycle:
 *   `INFO commandstats` deltas (after CONFIG RESETSTAT) over a fixed number of cycles, without
 *   MONITOR.
 */
import { Effect } from "effect"
import type { Redis } from "ioredis"
import type { Env, Locker } from "./shared.js"
import { commandStats, fmt, interleave, median, printTable, resetStats, runLoop, sleep } from "./shared.js"
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

/** Runs `cycles` cycles between CONFIG RESETSTAT and INFO commandstats. */
const counted = (admin: Redis, locker: Locker, cycles: number) =>
  Effect.gen(function*() {
    yield* resetStats(admin)
    yield* runLoop(locker, { holdMs: 0, cycles })
    const stats = yield* commandStats(admin)
    let commands = 0
    let scriptUsec = 0
    for (const [name, stat] of stats) {
      // the CONFIG RESETSTAT of this measurement is counted after the reset
      const calls = name === "config|resetstat" ? stat.calls - 1 : stat.calls
      const usec = name === "config|resetstat" ? 0 : stat.usec
      commands += calls
      // a script's time includes that of the commands it calls
      if (scriptCommands.includes(name)) scriptUsec += usec
    }
    return { commandsPerCycle: commands / cycles, scriptUsecPerCycle: scriptUsec / cycles }
  })

export const run = (env: Env) =>
  Effect.gen(function*() {
    const cycles = env.smoke ? 200 : 1000
    const lockers = yield* Effect.forEach(measured, (side) => side.open(env.url, `s8:${side.id}`))
    for (const locker of lockers) yield* runLoop(locker, { holdMs: 0, cycles: 20 })
    const monitoredResults: Array<Monitored> = []
    for (const locker of lockers) monitoredResults.push(yield* monitored(env.admin, locker, cycles))
    const samples = yield* interleave(env.rounds, lockers, (locker) => counted(env.admin, locker, cycles))
    const rows = measured.map((side, i) => ({
      side: side.id,
      name: side.name,
      roundTripsPerCycle: monitoredResults[i]!.roundTripsPerCycle,
      sentPerCycle: monitoredResults[i]!.sent,
      luaCallsPerCycle: monitoredResults[i]!.luaCallsPerCycle,
      inScriptsPerCycle: monitoredResults[i]!.inScripts,
      commandsPerCycle: median(samples[i]!.map((s) => s.commandsPerCycle)),
      scriptUsecPerCycle: median(samples[i]!.map((s) => s.scriptUsecPerCycle))
    }))
    yield* printTable(
      `8. Redis cost of one uncontended lock+unlock cycle (${fmt(cycles)} cycles; commandstats: ${env.rounds} round(s), median)`,
      ["side", "round trips", "sent per cycle", "in-script calls", "commands executed", "script us/cycle"],
      rows.map((r) => [
        r.name,
        fmt(r.roundTripsPerCycle, 2),
        Object.entries(r.sentPerCycle).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", "),
        fmt(r.luaCallsPerCycle, 2),
        fmt(r.commandsPerCycle, 2),
        fmt(r.scriptUsecPerCycle, 1)
      ]),
      [
        "round trips / sent / in-script calls: from MONITOR; commands executed (scripts and the calls inside them) and",
        "script time (cmdstat eval+evalsha usec, nested calls included) per cycle: from INFO commandstats",
        ...rows.filter((r) => r.side === "lockstep-lock").map((r) =>
          `lockstep's in-script calls per cycle: ${
            Object.entries(r.inScriptsPerCycle).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ")
          }`
        )
      ]
    )
    return { cycles, rounds: env.rounds, rows }
  }).pipe(Effect.scoped)
