/**
 * `lockstep run` exits as soon as its command has exited and the lock is released: nothing left
 * behind (a timer, a connection) holds the process until the lease's next renewal or its end,
 * also where the packages run on copies of effect of their own.
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { buildBin, redisRuns, redisServer, start, tempDir } from "./fixtures/lockstep.js"

describe.runIf(await redisRuns("lockstep run's exit on Redis"))("lockstep run's exit on Redis", () => {
  const dir = tempDir()
  const bins = { "one copy of effect": buildBin(dir), "core on a copy of effect of its own": buildBin(dir, { duplicateEffect: true }) }
  const redis = redisServer()

  /** Milliseconds from the command's end (its last act stamps the clock) to lockstep's exit. */
  const lag = async (bin: string, name: string, flags: ReadonlyArray<string>) => {
    const stamp = join(dir, `${name}.end`)
    const running = start(bin, ["run", "--backend", redis.get().url, ...flags, name, "--", "sh", "-c", `date +%s%N > ${stamp}`])
    await running.exited
    const exitedAt = Date.now()
    const result = await running.result
    expect(result).toMatchObject({ code: 0, stderr: "" })
    return exitedAt - Number(BigInt(readFileSync(stamp, "utf8").trim()) / 1_000_000n)
  }

  for (const [build, bin] of Object.entries(bins)) {
    for (const flags of [[], ["--watchdog", "9s"], ["--lease", "6s"]]) {
      it(`${build}, ${flags.join(" ") || "the default watchdog"}: exits within a second of its command`, async () => {
        expect(await lag(bin, `exit-${flags.join("") || "default"}`, flags)).toBeLessThan(1_000)
      })
    }
  }
})
