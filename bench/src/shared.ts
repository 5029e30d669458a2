/**
 * Helpers shared by the scenarios: settings, statistics, tables, Redis connections and INFO
 * parsing, CPU clocks, and the lock/unlock loop every throughput measurement runs.
 */
import type { Scope } from "effect"
import { Console, Data, Duration, Effect, Logger } from "effect"
import { Redis } from "ioredis"

/** What every scenario gets from `main`. */
export interface Env {
  /** Short run (CI): smaller sizes, shorter windows, one round. */
  readonly smoke: boolean
  /** Rounds per measurement; the reported figure is the median over rounds. */
  readonly rounds: number
  /** The bench's own redis-server. */
  readonly url: string
  /** A connection for INFO / CONFIG RESETSTAT / FLUSHALL; never used by a lock. */
  readonly admin: Redis
}

// ---------------------------------------------------------------------------------------------
// statistics and formatting

export const now = (): number => performance.now()

/** The median of the defined values (NaN ones are left out: a round that could not measure it). */
export const median = (values: ReadonlyArray<number>): number => {
  const sorted = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b)
  if (sorted.length === 0) return NaN
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Nearest-rank percentile (p in 0..100). */
export const percentile = (values: ReadonlyArray<number>, p: number): number => {
  if (values.length === 0) return NaN
  const sorted = [...values].sort((a, b) => a - b)
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length))
  return sorted[Math.min(sorted.length, rank) - 1]!
}

/** A number for a table: thousands separators, `digits` decimals, "-" for NaN. */
export const fmt = (value: number, digits = 0): string =>
  Number.isFinite(value)
    ? value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits })
    : "-"

export const ratio = (value: number, base: number): string => (base > 0 ? `${fmt(value / base, 2)}x` : "-")

/** Prints a titled table with right-aligned columns (the first one left-aligned). */
export const printTable = (
  title: string,
  header: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string>>,
  notes: ReadonlyArray<string> = []
): Effect.Effect<void> =>
  Effect.suspend(() => {
    const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)))
    const line = (cells: ReadonlyArray<string>) =>
      cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join("  ")
    const out = [
      "",
      title,
      line(header),
      widths.map((w) => "-".repeat(w)).join("  "),
      ...rows.map(line),
      ...notes.map((n) => `  ${n}`)
    ]
    return Console.log(out.join("\n"))
  })

// ---------------------------------------------------------------------------------------------
// log lines of the libraries under test

/** Log lines seen in the current scenario: the first few are printed, the rest only counted. */
export const logLines = { shown: 0, suppressed: 0, byLevel: {} as Record<string, number> }

const maxShownLogLines = 5

/**
 * Replaces Effect's default logger: a library logging once per lease (thousands of lines) would
 * drown the tables. `main` reports how many lines each scenario logged.
 */
export const quietLogger = Logger.replace(
  Logger.defaultLogger,
  Logger.make(({ logLevel, message }) => {
    logLines.byLevel[logLevel.label] = (logLines.byLevel[logLevel.label] ?? 0) + 1
    if (logLines.shown >= maxShownLogLines) {
      logLines.suppressed++
      return
    }
    logLines.shown++
    const text = Array.isArray(message) ? message.map(String).join(" ") : String(message)
    console.log(`  [log ${logLevel.label}] ${text}`)
  })
)

export const resetLogLines = (): void => {
  logLines.shown = 0
  logLines.suppressed = 0
  logLines.byLevel = {}
}

// ---------------------------------------------------------------------------------------------
// failures

/** A rejected promise of a promise-based peer. */
export class PeerError extends Data.TaggedError("PeerError")<{ readonly name: string; readonly message: string }> {}

export const peerError = (cause: unknown): PeerError =>
  cause instanceof Error
    ? new PeerError({ name: cause.name, message: cause.message })
    : new PeerError({ name: "Error", message: String(cause) })

/** What a failed lock operation is counted as: its tag, or a peer's error name. */
export const failureName = (error: unknown): string => {
  if (error instanceof PeerError) return error.name
  if (typeof error === "object" && error !== null && "_tag" in error) {
    // a lost lease says why: "NotHeld" or "DeadlinePassed"
    return "reason" in error ? `${String(error._tag)}(${String(error.reason)})` : String(error._tag)
  }
  if (error instanceof Error) return error.name
  return String(error)
}

export type Failures = Record<string, number>

export const addFailure = (failures: Failures, error: unknown): void => {
  const name = failureName(error)
  failures[name] = (failures[name] ?? 0) + 1
}

export const mergeFailures = (all: ReadonlyArray<Failures>): Failures => {
  const out: Failures = {}
  for (const f of all) for (const [k, v] of Object.entries(f)) out[k] = (out[k] ?? 0) + v
  return out
}

/** How many of `failures` have a name starting with `prefix` (e.g. all "LockLost(...)"). */
export const countFailures = (failures: Failures, prefix: string): number =>
  Object.entries(failures).reduce((sum, [name, n]) => (name.startsWith(prefix) ? sum + n : sum), 0)

export const diffFailures = (after: Failures, before: Failures): Failures => {
  const out: Failures = {}
  for (const [k, v] of Object.entries(after)) if (v - (before[k] ?? 0) > 0) out[k] = v - (before[k] ?? 0)
  return out
}

export const describeFailures = (failures: Failures): string => {
  const entries = Object.entries(failures)
  return entries.length === 0 ? "0" : entries.map(([k, v]) => `${k}=${v}`).join(" ")
}

// ---------------------------------------------------------------------------------------------
// clocks

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Milliseconds of CPU (user + system) this process used since `start`. */
export const cpuMsSince = (start: NodeJS.CpuUsage): number => {
  const d = process.cpuUsage(start)
  return (d.user + d.system) / 1000
}

/** A full GC if node runs with --expose-gc (the bench script does); otherwise nothing. */
export const collectGarbage = (): void => {
  if (typeof globalThis.gc === "function") {
    globalThis.gc()
    globalThis.gc()
  }
}

export const gcAvailable = (): boolean => typeof globalThis.gc === "function"

// ---------------------------------------------------------------------------------------------
// Redis

/** A fresh ioredis connection, connected before it is returned and closed with the scope. */
export const connect = (url: string): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const client = new Redis(url, { lazyConnect: true })
      await client.connect()
      return client
    }),
    (client) =>
      Effect.promise(() =>
        Promise.race([client.quit(), sleep(1000)]).then(
          () => client.disconnect(),
          () => client.disconnect()
        )
      )
  )

/** `INFO <section>` as a map of field -> value. */
export const info = (admin: Redis, section: string): Effect.Effect<Map<string, string>> =>
  Effect.map(Effect.promise(() => admin.info(section)), (text) => {
    const out = new Map<string, string>()
    for (const line of text.split("\r\n")) {
      const at = line.indexOf(":")
      if (at > 0 && !line.startsWith("#")) out.set(line.slice(0, at), line.slice(at + 1))
    }
    return out
  })

/** Seconds of CPU the redis-server process has used (user + system). */
export const serverCpuSeconds = (admin: Redis): Effect.Effect<number> =>
  Effect.map(info(admin, "cpu"), (m) => Number(m.get("used_cpu_user") ?? 0) + Number(m.get("used_cpu_sys") ?? 0))

export interface CommandStat {
  readonly calls: number
  readonly usec: number
}

/** `INFO commandstats`, by command name (`evalsha`, `config|resetstat`, ...). */
export const commandStats = (admin: Redis): Effect.Effect<Map<string, CommandStat>> =>
  Effect.map(info(admin, "commandstats"), (m) => {
    const out = new Map<string, CommandStat>()
    for (const [field, value] of m) {
      if (!field.startsWith("cmdstat_")) continue
      const calls = Number(/calls=(\d+)/.exec(value)?.[1] ?? 0)
      const usec = Number(/usec=(\d+)/.exec(value)?.[1] ?? 0)
      out.set(field.slice("cmdstat_".length), { calls, usec })
    }
    return out
  })

export const resetStats = (admin: Redis): Effect.Effect<void> => Effect.asVoid(Effect.promise(() => admin.config("RESETSTAT")))

export const flushAll = (admin: Redis): Effect.Effect<void> => Effect.asVoid(Effect.promise(() => admin.flushall()))

// ---------------------------------------------------------------------------------------------
// lock handles and the measuring loop

/** Gives a promise-based lock back. */
export type Release = () => Promise<void>

/**
 * One worker's lock on one key, through its own connection: `withLock` for every side, and for
 * promise-based peers (and the baseline) also their raw `lock`, so that throughput loops measure
 * them without Effect in between.
 */
export interface Locker {
  readonly withLock: <A, E>(body: Effect.Effect<A, E>) => Effect.Effect<A, unknown>
  readonly lock?: (() => Promise<Release>) | undefined
}

/** `withLock` for a promise-based lock: acquire, run the body, release (a failed release is ignored). */
export const promiseLocker = (lock: () => Promise<Release>): Locker => ({
  lock,
  withLock: <A, E>(body: Effect.Effect<A, E>) =>
    Effect.acquireUseRelease(
      Effect.tryPromise({ try: lock, catch: peerError }),
      () => body,
      (release) => Effect.ignore(Effect.tryPromise({ try: release, catch: peerError }))
    )
})

export interface LoopOptions {
  /** Time inside the critical section (a timer of this many ms; 0: none). */
  readonly holdMs: number
  /** Stop starting cycles at this `now()`; only cycles finished by then count. */
  readonly endAt?: number | undefined
  /** Or: run exactly this many cycles. */
  readonly cycles?: number | undefined
  /** Record the wait of every acquisition (from the call to the grant). */
  readonly trackWaits?: boolean | undefined
  /** With `trackWaits`: also keep every wait (for percentiles over several workers). */
  readonly keepWaits?: boolean | undefined
  /** Record the time of every successful cycle (from the lock call to the unlock's return). */
  readonly trackLatencies?: boolean | undefined
}

/** Percentiles of the cycle times of one loop, ms. */
export interface Latencies {
  readonly p50: number
  readonly p99: number
  readonly max: number
}

const latenciesOf = (samples: ReadonlyArray<number>): Latencies => {
  const sorted = [...samples].sort((a, b) => a - b)
  return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), max: sorted[sorted.length - 1] ?? NaN }
}

export interface LoopResult {
  /** Completed lock+unlock cycles. */
  readonly count: number
  /** Longest acquisition wait, ms (NaN when not tracked). */
  readonly maxWaitMs: number
  /** Every acquisition's wait, ms (only with `keepWaits`). */
  readonly waitsMs?: ReadonlyArray<number> | undefined
  /** Cycle times of the cycles counted (only when tracked). */
  readonly latencyMs?: Latencies | undefined
  readonly failures: Failures
}

/**
 * One worker: lock, hold, unlock, again, until `endAt` or `cycles`. A failed cycle is counted
 * by its error and the loop goes on.
 */
export const runLoop = (locker: Locker, options: LoopOptions): Effect.Effect<LoopResult> => {
  const endAt = options.endAt ?? Infinity
  const cycles = options.cycles ?? Infinity
  const track = options.trackWaits === true
  const waits: Array<number> | undefined = track && options.keepWaits === true ? [] : undefined
  const cycleTimes: Array<number> | undefined = options.trackLatencies === true ? [] : undefined
  const latencyMs = () => (cycleTimes === undefined ? undefined : latenciesOf(cycleTimes))
  const lock = locker.lock
  if (lock !== undefined) {
    return Effect.promise(async () => {
      let count = 0
      let attempts = 0
      let maxWaitMs = track ? 0 : NaN
      const failures: Failures = {}
      while (attempts < cycles && now() < endAt) {
        attempts++
        const started = now()
        try {
          const release = await lock()
          if (track) {
            const waited = now() - started
            maxWaitMs = Math.max(maxWaitMs, waited)
            waits?.push(waited)
          }
          if (options.holdMs > 0) await sleep(options.holdMs)
          await release()
          const ended = now()
          if (ended <= endAt) {
            count++
            cycleTimes?.push(ended - started)
          }
        } catch (error) {
          addFailure(failures, error)
        }
      }
      return { count, maxWaitMs, waitsMs: waits, latencyMs: latencyMs(), failures }
    })
  }
  return Effect.gen(function*() {
    let count = 0
    let attempts = 0
    let maxWaitMs = track ? 0 : NaN
    const failures: Failures = {}
    let started = 0
    const hold = options.holdMs > 0 ? Effect.sleep(Duration.millis(options.holdMs)) : Effect.void
    const body = track
      ? Effect.zipRight(Effect.sync(() => {
        const waited = now() - started
        maxWaitMs = Math.max(maxWaitMs, waited)
        waits?.push(waited)
      }), hold)
      : hold
    const cycle = locker.withLock(body)
    while (attempts < cycles && now() < endAt) {
      attempts++
      started = now()
      const result = yield* Effect.either(cycle)
      if (result._tag === "Left") {
        addFailure(failures, result.left)
        continue
      }
      const ended = now()
      if (ended <= endAt) {
        count++
        cycleTimes?.push(ended - started)
      }
    }
    return { count, maxWaitMs, waitsMs: waits, latencyMs: latencyMs(), failures }
  })
}

/** Rounds of several sides, interleaved (round 1 of every side, then round 2, ...). */
export const interleave = <S, A, E, R>(
  rounds: number,
  sides: ReadonlyArray<S>,
  measure: (side: S, round: number) => Effect.Effect<A, E, R>
): Effect.Effect<Array<Array<A>>, E, R> =>
  Effect.gen(function*() {
    const out: Array<Array<A>> = sides.map(() => [])
    for (let round = 0; round < rounds; round++) {
      for (let i = 0; i < sides.length; i++) out[i]!.push(yield* measure(sides[i]!, round))
    }
    return out
  })

/**
 * The acquisition `withLock` sends for an exclusive lock with the default watchdog (30 s), for
 * the sides that call lockstep's backend directly: a literal made per call (a spread of a shared
 * object costs such a loop ~9 us per cycle, which is not the backend's).
 */
export const exclusiveAcquire = (key: string, holder: string) => ({
  key,
  mode: "exclusive" as const,
  leaseMs: 30_000,
  holder,
  permits: 1,
  limit: 1,
  fair: false,
  waiterTtlMs: 5_000,
  count: 1
})
