/**
 * `lockstep run` on a real redis-server: mutual exclusion between processes, the conflict exit
 * code, the child's exit code and streams, lost leases, forwarded signals, a killed lockstep.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { alive, buildBin, lockstep, redisRuns, redisServer, sections, stampScript, start, tempDir, waitForFile } from "./fixtures/lockstep.js"

describe.runIf(await redisRuns("lockstep run on Redis"))("lockstep run on Redis", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const redis = redisServer()
  const backend = () => ["--backend", redis.get().url]

  it("two runs on one key never overlap, and their fences increase", async () => {
    const log = join(dir, "exclusive.log")
    const runs = [0, 1, 2].map(() => lockstep(bin, ["run", ...backend(), "exclusive", "--", ...stampScript(log, 0.3)]))
    const results = await Promise.all(runs)
    for (const result of results) expect(result).toMatchObject({ code: 0, stderr: "" })
    expect(sections(readFileSync(log, "utf8"))).toHaveLength(3)
  })

  it("passes the child's exit code, stdout, stderr and stdin through, and its environment", async () => {
    const result = await lockstep(bin, [
      "run",
      ...backend(),
      "streams",
      "--",
      "sh",
      "-c",
      "cat; echo \"key=$LOCKSTEP_KEY fence=$LOCKSTEP_FENCE holder=$LOCKSTEP_HOLDER\"; echo oops >&2; exit 42"
    ], { input: "from stdin\n" })
    expect(result.code).toBe(42)
    expect(result.stderr).toBe("oops\n")
    const [first, second] = result.stdout.split("\n")
    expect(first).toBe("from stdin")
    expect(second).toMatch(/^key=streams fence=\d+ holder=[0-9a-f-]+:\d+$/)
  })

  it("--no-wait on a held key exits with the conflict code and one line naming the holder, without running the command", async () => {
    const holderFile = join(dir, "conflict.holder")
    const holding = start(bin, ["run", ...backend(), "conflict", "--", "sh", "-c", `echo $LOCKSTEP_HOLDER > ${holderFile}; sleep 30`])
    const holder = (await waitForFile(holderFile)).trim()
    const marker = join(dir, "conflict.ran")
    const refused = await lockstep(bin, ["run", ...backend(), "--no-wait", "conflict", "--", "touch", marker])
    expect(refused.code).toBe(75)
    expect(refused.stderr).toMatch(new RegExp(`^lockstep: "conflict" is held by ${holder} \\(exclusive, fence \\d+, [\\d.]+s left\\)\\n$`))
    const custom = await lockstep(bin, ["run", ...backend(), "-n", "-E", "9", "conflict", "--", "touch", marker])
    expect(custom.code).toBe(9)
    const waited = await lockstep(bin, ["run", ...backend(), "--wait", "300ms", "conflict", "--", "touch", marker])
    expect(waited.code).toBe(75)
    expect(existsSync(marker)).toBe(false)
    holding.process.kill("SIGTERM")
    expect((await holding.result).code).toBe(143)
  })

  it("SIGINT reaches the child, and the lock is released only after the child has exited", async () => {
    const ready = join(dir, "sigint.ready")
    const trapped = join(dir, "sigint.trapped")
    const running = start(bin, [
      "run",
      ...backend(),
      "sigint",
      "--",
      "sh",
      "-c",
      `trap 'echo INT > ${trapped}; sleep 3; exit 7' INT; echo up > ${ready}; while :; do sleep 0.05; done`
    ])
    await waitForFile(ready)
    running.process.kill("SIGINT")
    await waitForFile(trapped)
    // the child is in its trap, still running for 3 s (a status process starts in well under a
    // second, and a loaded machine may take longer): the lock is still held
    const during = await lockstep(bin, ["status", ...backend(), "--json", "sigint"])
    expect(JSON.parse(during.stdout).holders).toHaveLength(1)
    const result = await running.result
    expect(result.code).toBe(7)
    const after = await lockstep(bin, ["status", ...backend(), "--json", "sigint"])
    expect(JSON.parse(after.stdout).holders).toHaveLength(0)
  })

  it("SIGINT while waiting for the lock: exits 130 without running the command, leaving nothing behind", async () => {
    const holderFile = join(dir, "waiting.holder")
    const holding = start(bin, ["run", ...backend(), "--kind", "fair", "waiting", "--", "sh", "-c", `echo held > ${holderFile}; sleep 30`])
    await waitForFile(holderFile)
    const marker = join(dir, "waiting.ran")
    const waiting = start(bin, ["run", ...backend(), "--kind", "fair", "waiting", "--", "touch", marker])
    // the waiter is queued behind the holder
    for (let i = 0; ; i++) {
      const status = await lockstep(bin, ["status", ...backend(), "--json", "waiting"])
      if (JSON.parse(status.stdout).queue.length === 1) break
      if (i > 50) throw new Error(`the waiter did not queue: ${status.stdout}`)
    }
    waiting.process.kill("SIGINT")
    expect((await waiting.result).code).toBe(130)
    expect(existsSync(marker)).toBe(false)
    const status = JSON.parse((await lockstep(bin, ["status", ...backend(), "--json", "waiting"])).stdout)
    expect(status.holders).toHaveLength(1)
    expect(status.queue).toHaveLength(0)
    holding.process.kill("SIGTERM")
    expect((await holding.result).code).toBe(143)
  })

  it("a lost lease (the key dropped): SIGTERM to the child, SIGKILL after --kill-after, the lost-lease exit code", async () => {
    const pidFile = join(dir, "lost.pid")
    const terms = join(dir, "lost.terms")
    const running = start(bin, [
      "run",
      ...backend(),
      "--watchdog",
      "900ms",
      "--kill-after",
      "700ms",
      "lost",
      "--",
      "sh",
      "-c",
      // ignores SIGTERM (records it) and goes on
      `trap 'echo TERM >> ${terms}' TERM; echo $$ > ${pidFile}; while :; do sleep 0.05; done`
    ])
    const pid = Number(await waitForFile(pidFile))
    const released = await lockstep(bin, ["release", ...backend(), "--force", "lost"])
    expect(released.code).toBe(0)
    expect(released.stdout).toMatch(/^"lost": removed 1 holder\n {2}[0-9a-f-]+:\d+ \(exclusive, fence \d+, [\d.]+s left\)\n$/)
    const result = await running.result
    expect(result.code).toBe(76)
    // then what the child's shell says of its `sleep`, ended by the SIGTERM
    expect(result.stderr).toMatch(/^lockstep: lease on "lost" held by \S+ was lost: the backend reports it is no longer held: stopping the command \(SIGTERM, SIGKILL after 700ms\)\n/)
    expect(readFileSync(terms, "utf8")).toMatch(/^TERM\n/)
    expect(alive(pid)).toBe(false)
  })

  it("a lost lease (the server paused past the lease): the child is stopped, the lost-lease exit code", async () => {
    const ready = join(dir, "paused.ready")
    const running = start(bin, ["run", ...backend(), "--watchdog", "900ms", "paused", "--", "sh", "-c", `echo up > ${ready}; sleep 30`])
    await waitForFile(ready)
    const server = redis.get()
    await Effect.runPromise(server.pause)
    try {
      const result = await running.result
      expect(result.code).toBe(76)
      expect(result.stderr).toMatch(/lease on "paused" .* was lost: its deadline passed without a confirmed renewal: stopping the command/)
    } finally {
      await Effect.runPromise(server.resume)
    }
  })

  it("a lockstep killed with SIGKILL: its lock is free again within the lease", async () => {
    const pidFile = join(dir, "killed.pid")
    const got = join(dir, "killed.next")
    const running = start(bin, ["run", ...backend(), "--watchdog", "1500ms", "killed", "--", "sh", "-c", `echo $$ > ${pidFile}; sleep 30`])
    const child = Number(await waitForFile(pidFile))
    // a second run waits for the key meanwhile, and stamps the moment it got it
    const next = start(bin, ["run", ...backend(), "--wait", "10s", "killed", "--", "sh", "-c", `date +%s%N > ${got}`])
    await new Promise((resolve) => setTimeout(resolve, 1_000))
    running.process.kill("SIGKILL")
    const killedAt = BigInt(Date.now()) * 1_000_000n
    await running.exited
    try {
      expect((await next.result).code).toBe(0)
      const waited = Number(BigInt(readFileSync(got, "utf8").trim()) - killedAt) / 1e6
      // the lease was 1.5 s (renewed every 0.5 s until the kill); a loaded machine can stall the
      // waiter and the stamp for hundreds of ms, and 2.5 s still tells the lease from the 30 s default
      expect(waited).toBeLessThan(2_500)
    } finally {
      // the orphaned command, in a process group of its own
      if (alive(child)) process.kill(-child, "SIGKILL")
    }
  })

  it("bad input: one line and the usage code, nothing acquired and nothing run", async () => {
    const marker = join(dir, "bad.ran")
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, RegExp]> = [
      [["run", "--backend", "foo://x", "bad", "--", "touch", marker], /^lockstep: unknown backend scheme "foo:": use one of redis:\/\//],
      [["run", "--backend", "memory", "bad", "--", "touch", marker], /^lockstep: the memory backend cannot coordinate processes/],
      [["run", ...backend(), "--wait", "soon", "bad", "--", "touch", marker], /^lockstep: --wait: "soon" is not a duration/],
      [["run", ...backend(), "bad", "touch", marker], /^lockstep: run: missing `--` before the command/],
      [["run", ...backend(), "--bogus", "bad", "--", "touch", marker], /^lockstep: run: unknown option --bogus/],
      [["run", "--backend", "redis://127.0.0.1:1", "bad", "--", "touch", marker], null as unknown as RegExp]
    ]
    for (const [args, message] of cases) {
      const result = await lockstep(bin, args)
      if (message === null) {
        expect(result.code).toBe(69)
        expect(result.stderr).toBe("lockstep: lock backend failed during connect on Redis 127.0.0.1:1: connect ECONNREFUSED 127.0.0.1:1\n")
      } else {
        expect(result.code, args.join(" ")).toBe(64)
        expect(result.stderr).toMatch(message)
        expect(result.stderr.trim().split("\n")).toHaveLength(1)
      }
    }
    expect(existsSync(marker)).toBe(false)
    const status = await lockstep(bin, ["status", ...backend(), "--json", "bad"])
    expect(JSON.parse(status.stdout)).toMatchObject({ holders: [], fence: 0 })
  })
})
