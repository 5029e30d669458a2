/**
 * `lockstep run` on PostgreSQL (a database of this file's own): mutual exclusion between
 * processes with increasing fences, the conflict exit code, `status`.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { buildBin, lockstep, postgresDatabase, postgresRuns, sections, stampScript, start, tempDir, waitForFile } from "./lockstep.js"

describe.runIf(await postgresRuns("lockstep run on PostgreSQL"))("lockstep run on PostgreSQL", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const url = postgresDatabase()

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
})
