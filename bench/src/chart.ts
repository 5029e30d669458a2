/**
 * The bench's results as a chart: cycles (or critical sections) per second and client CPU per
 * cycle, per library and scenario, with the machine and the run named. `main` writes it after a
 * run, beside the summary: `bench/results/bench.json` (the figures plotted) and
 * `bench/results/bench.svg`. `--chart-from=FILE` renders it again from a saved file without a run:
 * FILE is such a `bench.json`, or a run's full summary (`latest.json`).
 */
import { readFileSync, writeFileSync } from "node:fs"
import { fmt } from "./shared.js"
import type { BarChart } from "./svg.js"
import { renderBarChart } from "./svg.js"

export type Library =
  | "lockstep"
  | "redlock"
  | "redis-semaphore"
  | "effect-distributed-lock"
  | "Effect semaphore (in-process)"
  | "baseline (not a lock)"

const colors: Record<Library, string> = {
  lockstep: "#3b5bdb",
  redlock: "#e8590c",
  "redis-semaphore": "#2b8a3e",
  "effect-distributed-lock": "#9c36b5",
  "Effect semaphore (in-process)": "#0c8599",
  "baseline (not a lock)": "#adb5bd"
}

export interface ChartRow {
  readonly name: string
  readonly library: Library
  /** Lock cycles (or critical sections) per second; null when the scenario did not measure it. */
  readonly perSec: number | null
  /** Client CPU per cycle, µs; null when the scenario did not measure it. */
  readonly cpuUsPerCycle: number | null
}

export interface ChartPanel {
  readonly scenario: string
  readonly title: string
  readonly note: string
  readonly rows: ReadonlyArray<ChartRow>
}

/** What `bench.json` holds: the figures the chart shows, the machine and the run. */
export interface ChartData {
  readonly machine: {
    readonly cpuModel: string
    readonly cores: number
    readonly memoryGiB?: number | undefined
    readonly os?: string | undefined
    readonly node: string
    readonly redis: string
  }
  readonly run: { readonly mode: string; readonly rounds: number; readonly startedAt: string }
  readonly panels: ReadonlyArray<ChartPanel>
}

/** The part of `main`'s summary the chart reads. */
export interface Summary {
  readonly mode: string
  readonly startedAt: string
  readonly rounds: number
  readonly machine: {
    readonly node: string
    readonly cpus: number
    readonly cpuModel?: string | undefined
    readonly memoryGiB?: number | undefined
    readonly os?: string | undefined
    readonly redis: string
  }
  readonly results: Record<string, unknown>
}

type Json = Record<string, unknown>

const isRecord = (u: unknown): u is Json => typeof u === "object" && u !== null && !Array.isArray(u)

/** A scenario's `rows`, or none when it did not run (left out by `--only`, or not run: no server). */
const rowsOf = (results: Json, scenario: string): ReadonlyArray<Json> => {
  const result = results[`scenario${scenario}`]
  return isRecord(result) && Array.isArray(result["rows"]) ? result["rows"].filter(isRecord) : []
}

const numberOr = (u: unknown): number | null => (typeof u === "number" && Number.isFinite(u) ? u : null)

const libraryOf = (side: string): Library =>
  side.startsWith("baseline")
    ? "baseline (not a lock)"
    : side === "redlock"
    ? "redlock"
    : side === "redis-semaphore"
    ? "redis-semaphore"
    : side.startsWith("effect-distributed-lock")
    ? "effect-distributed-lock"
    : "lockstep"

/** Rows of the scenarios that compare sides by cycles: every side but the floors (they are layers of lockstep's cycle). */
const sideRows = (rows: ReadonlyArray<Json>, perSec: string, cpu: string | undefined): Array<ChartRow> =>
  rows
    .filter((row) => !String(row["side"]).startsWith("floor"))
    .map((row) => ({
      name: String(row["name"]),
      library: libraryOf(String(row["side"])),
      perSec: numberOr(row[perSec]),
      cpuUsPerCycle: cpu === undefined ? null : numberOr(row[cpu])
    }))

/** Scenario 7: lockstep's memory backend against Effect's semaphore, two rows per case. */
const memoryRows = (rows: ReadonlyArray<Json>): Array<ChartRow> =>
  rows.flatMap((row) => [
    { name: `lockstep, memory backend: ${String(row["case"])}`, library: "lockstep" as const, perSec: numberOr(row["lockstepOpsPerSec"]), cpuUsPerCycle: null },
    {
      name: `Effect.makeSemaphore(1): ${String(row["case"])}`,
      library: "Effect semaphore (in-process)" as const,
      perSec: numberOr(row["effectSemaphoreOpsPerSec"]),
      cpuUsPerCycle: null
    }
  ])

/** The figures to plot, from a run's summary. */
export const chartData = (summary: Summary): ChartData => {
  const { results } = summary
  const panels: Array<ChartPanel> = [
    {
      scenario: "1",
      title: "1. Uncontended lock + unlock, 1 worker, 1 key (Redis)",
      note: "cycles/s, and the CPU of the side's own process per cycle; the baseline is two bare EVALSHA round trips",
      rows: sideRows(rowsOf(results, "1"), "opsPerSec", "cpuUsPerOp")
    },
    {
      scenario: "2",
      title: "2. Contended: 8 workers in one process, 1 key, 1 ms hold (Redis)",
      note: "critical sections/s; the baseline is an in-process FIFO mutex (Effect.makeSemaphore(1)) with the same hold",
      rows: sideRows(rowsOf(results, "2"), "perSec", undefined)
    },
    {
      scenario: "3",
      title: "3. Contended: 8 OS processes, 1 key, 1 ms hold (Redis)",
      note: "critical sections/s, all processes together; the baseline is the in-process FIFO mutex",
      rows: sideRows(rowsOf(results, "3"), "perSec", undefined)
    },
    {
      scenario: "7",
      title: "7. Memory backend next to Effect's own semaphore (in-process)",
      note: "cycles/s of Lock.withLock on MemoryBackend.layer and of Effect.makeSemaphore(1).withPermits(1)",
      rows: memoryRows(rowsOf(results, "7"))
    },
    {
      scenario: "9",
      title: "9. lockstep Lock on SQL databases next to Redis: uncontended, 1 worker",
      note: "cycles/s and client CPU per cycle (the database servers' CPU not counted)",
      rows: sideRows(rowsOf(results, "9"), "opsPerSec", "cpuUsPerOp")
    },
    {
      scenario: "10",
      title: "10. Redis failover options: uncontended lockstep Lock, primary + 2 replicas + 3 sentinels",
      note: "cycles/s and client CPU per cycle, reached directly (primary) or through the sentinels",
      rows: sideRows(rowsOf(results, "10"), "opsPerSec", "cpuUsPerOp")
    },
    {
      scenario: "11",
      title: "11. lockstep Lock on ZooKeeper next to Redis: uncontended, 1 worker",
      note: "cycles/s and client CPU per cycle (the servers' CPU not counted)",
      rows: sideRows(rowsOf(results, "11"), "opsPerSec", "cpuUsPerOp")
    }
  ]
  const { machine } = summary
  return {
    machine: {
      cpuModel: machine.cpuModel ?? "unknown CPU",
      cores: machine.cpus,
      memoryGiB: machine.memoryGiB,
      os: machine.os,
      node: machine.node,
      redis: machine.redis
    },
    run: { mode: summary.mode, rounds: summary.rounds, startedAt: summary.startedAt },
    panels: panels.filter((panel) => panel.rows.length > 0)
  }
}

const perSecText = (value: number): string => fmt(value, value > 0 && value < 10 ? 1 : 0)

const microsText = (value: number): string => `${fmt(value, value < 100 ? 1 : 0)} µs`

/** The chart of `data` as an SVG document. */
export const renderChart = (data: ChartData): string => {
  const { machine, run } = data
  const hardware = [
    machine.cpuModel.trim(),
    `${machine.cores} cores`,
    ...(machine.memoryGiB === undefined ? [] : [`${machine.memoryGiB} GiB`]),
    ...(machine.os === undefined ? [] : [machine.os])
  ].join(", ")
  const when = `${run.startedAt.slice(0, 10)} ${run.startedAt.slice(11, 16)} UTC`
  const how = run.mode === "smoke"
    ? "smoke run (one short round per measurement: rough numbers, not for comparison)"
    : `full run, median of ${run.rounds} rounds per measurement`
  const libraries = [...new Set(data.panels.flatMap((panel) => panel.rows.map((row) => row.library)))]
  const chart: BarChart = {
    title: "lockstep benchmarks: throughput and client CPU per lock cycle",
    subtitle: [`${hardware}; Node ${machine.node}; redis-server ${machine.redis}`, `${how}; ${when}`],
    columns: [
      { label: "cycles/s (higher is better)", format: perSecText },
      { label: "client CPU per cycle (lower is better)", format: microsText }
    ],
    footer: "What each scenario measures: bench/README.md. Written by pnpm bench; every figure is also in bench.json beside this chart.",
    legend: libraries.map((name) => ({ name, color: colors[name] })),
    groups: data.panels.map((panel) => ({
      title: panel.title,
      note: panel.note,
      bars: panel.rows.map((row) => ({ label: row.name, color: colors[row.library], values: [row.perSec, row.cpuUsPerCycle] }))
    }))
  }
  return renderBarChart(chart)
}

/** Writes `bench.json` and `bench.svg` into `dir` (a URL ending in `/`); the paths written. */
export const writeChart = (summary: Summary, dir: URL): ReadonlyArray<string> => {
  const data = chartData(summary)
  const json = new URL("bench.json", dir)
  const svg = new URL("bench.svg", dir)
  writeFileSync(json, JSON.stringify(data, null, 2) + "\n")
  writeFileSync(svg, renderChart(data))
  return [json.pathname, svg.pathname]
}

/**
 * `--chart-from=FILE [--chart-out=FILE.svg]`: the chart of a saved `bench.json` or summary,
 * written to `--chart-out` or beside FILE with the extension `.svg`; the path written.
 */
export const renderFromFile = (from: string, out: string | undefined): string => {
  const saved: unknown = JSON.parse(readFileSync(from, "utf8"))
  if (!isRecord(saved)) throw new Error(`${from}: not a bench result`)
  const data = Array.isArray(saved["panels"])
    ? (saved as unknown as ChartData)
    : isRecord(saved["results"])
    ? chartData(saved as unknown as Summary)
    : undefined
  if (data === undefined) throw new Error(`${from}: neither a bench.json (panels) nor a run's summary (results)`)
  const target = out ?? from.replace(/(\.json)?$/, ".svg")
  writeFileSync(target, renderChart(data))
  return target
}
