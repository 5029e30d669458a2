/**
 * `lockstep run` on a ZooKeeper server of this file's own: mutual exclusion between processes
 * with increasing fences, the conflict exit code, `status`, a latch.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { ZooKeeperServer } from "@lockstep/testkit"
import { buildBin, lockstep, sections, stampScript, start, tempDir, waitForFile } from "./lockstep.js"

const required = process.env["LOCKSTEP_REQUIRE_ZOOKEEPER"] === "1"
const available = await Effect.runPromise(ZooKeeperServer.available)
if (!available) console.warn("lockstep run on ZooKeeper NOT RUN: no Java runtime or ZooKeeper jar")
const scope = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))
const server = available || required ? await Effect.runPromise(Scope.extend(ZooKeeperServer.make(), scope)) : undefined

describe.runIf(server !== undefined)("lockstep run on ZooKeeper", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const url = `zk://${server!.connectionString}/cli-${process.pid}`

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
    holding.process.kill("SIGTERM")
    expect((await holding.result).code).toBe(143)
  })

  it("latch set, count-down and await", async () => {
    expect((await lockstep(bin, ["latch", "set", "--backend", url, "batch", "2"])).stdout).toBe("2\n")
    const waiting = start(bin, ["latch", "await", "--backend", url, "batch"])
    expect((await lockstep(bin, ["latch", "count-down", "--backend", url, "batch"])).stdout).toBe("1\n")
    expect((await lockstep(bin, ["latch", "count-down", "--backend", url, "batch"])).stdout).toBe("0\n")
    expect((await waiting.result).code).toBe(0)
  })
})
