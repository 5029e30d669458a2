/**
 * The `lockstep` bin as a user runs it: built once per test file (bundled, as it runs from its
 * package) and spawned with plain node; and the servers it locks on: a `redis-server` of the
 * file's own (the testkit's) and a PostgreSQL database of the file's own, dropped afterwards.
 */
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import { dirname, join, sep } from "node:path"
import { fileURLToPath } from "node:url"
import { SqlClient } from "@effect/sql/SqlClient"
import { PgClient } from "@effect/sql-pg"
import { afterAll, beforeAll, expect, it } from "vitest"
import { Duration, Effect, Exit, Redacted, Scope } from "effect"
import * as esbuild from "esbuild"
import { History } from "@lockstep/testkit"
import { RedisServer } from "@lockstep/servers"

const entry = fileURLToPath(new URL("../src/internal/bin.ts", import.meta.url))

/** A temporary directory for the file, removed afterwards. */
export const tempDir = (): string => {
  const dir = mkdtempSync(join(tmpdir(), "lockstep-cli-"))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

/**
 * The path of the bin, bundled into `dir` before the file's tests. With `duplicateEffect`,
 * `@lockstep/core` is bundled with a second copy of effect (the runtime and everything else keep
 * the first): the install that gives every package its own copy, as `npm install -g` of the
 * packages one by one did.
 */
export const buildBin = (dir: string, options?: { readonly duplicateEffect?: boolean }): string => {
  const bin = join(dir, options?.duplicateEffect === true ? "lockstep-duplicated.mjs" : "lockstep.mjs")
  beforeAll(async () => {
    const plugins: Array<esbuild.Plugin> = []
    if (options?.duplicateEffect === true) {
      const core = fileURLToPath(new URL("../../core/", import.meta.url))
      const effect = dirname(createRequire(join(core, "package.json")).resolve("effect/package.json"))
      const copy = join(dir, "second-effect")
      cpSync(effect, join(copy, "node_modules", "effect"), { recursive: true, dereference: true })
      // effect's own dependencies, where the store keeps them beside it
      for (const name of readdirSync(dirname(effect))) {
        if (name !== "effect") symlinkSync(join(dirname(effect), name), join(copy, "node_modules", name))
      }
      plugins.push({
        name: "second-effect",
        setup: (build) => {
          build.onResolve({ filter: /^effect(\/|$)/ }, (args) =>
            args.importer.startsWith(core) && !args.importer.includes(`${sep}node_modules${sep}`)
              ? build.resolve(args.path, { kind: args.kind, resolveDir: copy })
              : undefined)
        }
      })
    }
    await esbuild.build({
      entryPoints: [entry],
      bundle: true,
      platform: "node",
      format: "esm",
      target: "node20",
      outfile: bin,
      // optional drivers the bundle loads only if present
      external: ["pg-native", "@effect/sql-sqlite-node", "better-sqlite3"],
      banner: { js: "import { createRequire as __createRequire } from \"node:module\"; const require = __createRequire(import.meta.url);" },
      plugins,
      logLevel: "error"
    })
  })
  return bin
}

export interface Result {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly stdout: string
  readonly stderr: string
  /** Milliseconds from the spawn to the exit. */
  readonly elapsed: number
}

export interface Running {
  readonly process: ChildProcess
  readonly result: Promise<Result>
  /** The exit of lockstep itself (its streams may stay open in a command it left behind). */
  readonly exited: Promise<void>
}

/** The lockstep processes a file started, killed after its tests if one is left (a test that failed). */
const spawned = new Set<ChildProcess>()
afterAll(() => {
  for (const child of spawned) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
})

/** Spawns `lockstep args`, with `input` on its stdin (closed after it). */
export const start = (
  bin: string,
  args: ReadonlyArray<string>,
  options?: { readonly input?: string; readonly env?: Record<string, string> }
): Running => {
  const began = Date.now()
  const child = spawn(process.execPath, [bin, ...args], {
    stdio: ["pipe", "pipe", "pipe"],
    env: { ...process.env, LOCKSTEP_BACKEND: "", ...options?.env }
  })
  spawned.add(child)
  let stdout = ""
  let stderr = ""
  child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
  child.stdin.end(options?.input ?? "")
  const result = new Promise<Result>((resolve) => {
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr, elapsed: Date.now() - began }))
  })
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  return { process: child, result, exited }
}

/** Runs `lockstep args` to its exit. */
export const lockstep = (bin: string, args: ReadonlyArray<string>, options?: { readonly input?: string }): Promise<Result> =>
  start(bin, args, options).result

/** Waits until `path` exists (and is not empty), for at most `timeoutMs`. */
export const waitForFile = async (path: string, timeoutMs = 15_000): Promise<string> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (existsSync(path)) {
      const text = readFileSync(path, "utf8")
      if (text.trim() !== "") return text
    }
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  throw new Error(`${path} did not appear within ${timeoutMs} ms`)
}

/** Whether a process `pid` is alive. */
export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** `LOCKSTEP_REQUIRE_REDIS=1` (CI): a missing redis-server fails the run instead of skipping. */
export const redisRequired = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"

/** Whether the Redis suites run: redis-server is there, or required (and then fails if missing). */
export const redisRuns = async (suite: string): Promise<boolean> => {
  const available = await Effect.runPromise(RedisServer.available)
  if (!available) console.warn(`${suite} NOT RUN: redis-server not found (set REDIS_SERVER_BIN)`)
  return available || redisRequired
}

/** A `redis-server` of the file's own, stopped afterwards. */
export const redisServer = (options?: RedisServer.Options): { readonly get: () => RedisServer.RedisServer } => {
  const scope = Effect.runSync(Scope.make())
  let server: RedisServer.RedisServer | undefined
  beforeAll(async () => {
    server = await Effect.runPromise(Scope.extend(RedisServer.make(options), scope))
  })
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  return {
    get: () => {
      if (server === undefined) throw new Error("redis-server not started")
      return server
    }
  }
}

const pgServer = process.env["LOCKSTEP_PG_URL"] ?? "postgres://postgres@127.0.0.1:5432"

const pgAdmin = (statement: string) =>
  Effect.runPromise(
    Effect.flatMap(SqlClient, (sql) => sql.unsafe(statement)).pipe(
      Effect.provide(PgClient.layer({ url: Redacted.make(`${pgServer}/postgres`), connectTimeout: Duration.seconds(5) })),
      Effect.timeout("10 seconds"),
      Effect.asVoid
    )
  )

/** `LOCKSTEP_REQUIRE_SQL=1` (CI): a PostgreSQL that cannot be reached fails the run instead of skipping. */
export const postgresRequired = process.env["LOCKSTEP_REQUIRE_SQL"] === "1"

/** Whether the PostgreSQL suites run: the server answers, or it is required (and then fails if not). */
export const postgresRuns = async (suite: string): Promise<boolean> => {
  const reachable = await pgAdmin("SELECT 1").then(() => true, () => false)
  if (!reachable) console.warn(`${suite} NOT RUN: cannot reach PostgreSQL at ${pgServer}`)
  return reachable || postgresRequired
}

/** The URL of a PostgreSQL database of the file's own, created before its tests and dropped after them. */
export const postgresDatabase = (): string => {
  const name = `lockstep_cli_${process.pid}_${Math.random().toString(36).slice(2, 10)}`
  beforeAll(() => pgAdmin(`CREATE DATABASE ${name}`))
  afterAll(() => pgAdmin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
  return `${pgServer}/${name}`
}

/**
 * The critical sections a run of `stampScript` wrote to `log`, checked strictly: every section
 * ends before the next one starts (by the stamps' order in the file, appended under the lock, and
 * by their clock readings), and the fences increase from one section to the next. The same
 * sections, as grants and releases of their holders in the file's order, are then judged by the
 * testkit's history checker.
 */
export const sections = (log: string): ReadonlyArray<{ readonly fence: number; readonly start: bigint; readonly end: bigint }> => {
  const lines = log.trim().split("\n").map((line) => line.split(" "))
  const out: Array<{ fence: number; start: bigint; end: bigint }> = []
  const events: Array<History.Event> = []
  for (let i = 0; i < lines.length; i += 2) {
    const [startTag, startFence, startAt, startHolder] = lines[i]!
    const [endTag, endFence, endAt, endHolder] = lines[i + 1] ?? []
    if (startTag !== "start" || endTag !== "end" || startFence !== endFence || startHolder !== endHolder) {
      throw new Error(`overlapping or broken sections at line ${i + 1}:\n${log}`)
    }
    const section = { fence: Number(startFence), start: BigInt(startAt!), end: BigInt(endAt!) }
    const previous = out[out.length - 1]
    if (previous !== undefined && (section.start < previous.end || section.fence <= previous.fence)) {
      throw new Error(`section ${out.length} overlaps the one before it or has no greater fence:\n${log}`)
    }
    out.push(section)
    const holder = startHolder ?? ""
    events.push(
      History.Event.Grant({ at: i, key: "stamped", holder, mode: "exclusive", permits: 1, limit: 1, fence: section.fence }),
      History.Event.Release({ at: i + 1, key: "stamped", holder, mode: "exclusive" })
    )
  }
  const violations = History.check(events)
  if (violations.length > 0) throw new Error(`the history checker found ${violations.map(History.formatViolation).join("; ")}:\n${log}`)
  return out
}

/**
 * A command that appends `start <fence> <ns> <holder>` to `log`, sleeps `sleep` seconds, and
 * appends `end <fence> <ns> <holder>`: its critical section.
 */
export const stampScript = (log: string, sleep: number): ReadonlyArray<string> => [
  "sh",
  "-c",
  `echo "start $LOCKSTEP_FENCE $(date +%s%N) $LOCKSTEP_HOLDER" >> ${log}; sleep ${sleep}; ` +
  `echo "end $LOCKSTEP_FENCE $(date +%s%N) $LOCKSTEP_HOLDER" >> ${log}`
]

/**
 * The scenarios every backend's `lockstep` runs: runs on one key never overlap and their fences
 * increase; `--no-wait` on a held key exits with the conflict code, and `status` shows the
 * holder; a latch in a pipeline, and an `await` that times out.
 */
export const runScenarios = (bin: string, dir: string, url: string): void => {
  it("two runs on one key never overlap, and their fences increase", async () => {
    const log = join(dir, "exclusive.log")
    const runs = [0, 1, 2].map(() => lockstep(bin, ["run", "--backend", url, "exclusive", "--", ...stampScript(log, 0.3)]))
    const results = await Promise.all(runs)
    for (const result of results) expect(result).toMatchObject({ code: 0, stderr: "" })
    expect(sections(readFileSync(log, "utf8"))).toHaveLength(3)
  })

  it("--no-wait on a held key exits with the conflict code without running the command; status shows the holder", async () => {
    const holderFile = join(dir, "held.holder")
    const holding = start(bin, ["run", "--backend", url, "held", "--", "sh", "-c", `echo $LOCKSTEP_HOLDER $LOCKSTEP_FENCE > ${holderFile}; sleep 30`])
    const [holder, fence] = (await waitForFile(holderFile)).trim().split(" ")
    const marker = join(dir, "held.ran")
    const refused = await lockstep(bin, ["run", "--backend", url, "--no-wait", "held", "--", "touch", marker])
    expect(refused.code).toBe(75)
    expect(refused.stderr).toMatch(new RegExp(`^lockstep: "held" is held by ${holder} \\(exclusive, fence ${fence}, [\\d.]+s left\\)\\n$`))
    expect(existsSync(marker)).toBe(false)
    const status = await lockstep(bin, ["status", "--backend", url, "--json", "held"])
    expect(JSON.parse(status.stdout)).toMatchObject({ key: "held", holders: [{ holder, fence: Number(fence), exclusive: 1 }] })
    const table = await lockstep(bin, ["status", "--backend", url, "held"])
    expect(table.stdout).toContain(holder)
    expect(table.stdout).toMatch(/HOLDER\s+MODE\s+COUNT\s+PERMITS\s+FENCE\s+TIME LEFT/)
    holding.process.kill("SIGTERM")
    expect((await holding.result).code).toBe(143)
  })

  it("latch set, count-down and await in a pipeline", async () => {
    expect((await lockstep(bin, ["latch", "set", "--backend", url, "batch", "2"])).stdout).toBe("2\n")
    const waiting = start(bin, ["latch", "await", "--backend", url, "batch"])
    expect((await lockstep(bin, ["latch", "count-down", "--backend", url, "batch"])).stdout).toBe("1\n")
    expect((await lockstep(bin, ["latch", "count-down", "--backend", url, "batch"])).stdout).toBe("0\n")
    expect((await waiting.result).code).toBe(0)
    expect((await lockstep(bin, ["latch", "set", "--backend", url, "stuck", "1"])).code).toBe(0)
    const timedOut = await lockstep(bin, ["latch", "await", "--backend", url, "--timeout", "200ms", "stuck"])
    expect(timedOut).toMatchObject({ code: 75, stderr: "lockstep: latch \"stuck\" did not reach 0 within 200ms\n" })
  })
}
