/**
 * `--prefix` / `LOCKSTEP_PREFIX` on Redis: the namespace of every key and channel, so that lockstep
 * runs as the README's least-privilege ACL user (one key pattern, one channel pattern), on a
 * redis-server started with that user; without the prefix the user may touch none of the keys,
 * and lockstep says so in one line.
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"
import { buildBin, lockstep, redisRuns, redisServer, start, tempDir, waitForFile } from "./fixtures/lockstep.js"

/** The documented rule (docs/security.md, "Redis: least-privilege ACL"), as `redis-server --user` takes it. */
const readmeRule = (): ReadonlyArray<string> => {
  const guide = readFileSync(fileURLToPath(new URL("../../../docs/security.md", import.meta.url)), "utf8")
  const line = /^ACL SETUSER (lockstep .*)$/m.exec(guide)?.[1]
  if (line === undefined) throw new Error("docs/security.md has no `ACL SETUSER lockstep ...` line")
  return line.trim().split(/\s+/)
}

describe.runIf(await redisRuns("lockstep --prefix on Redis"))("lockstep --prefix on Redis", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const rule = readmeRule()
  const password = rule.find((part) => part.startsWith(">"))!.slice(1)
  const namespace = rule.find((part) => part.startsWith("~"))!.slice(1).replace(/\*$/, "")
  const redis = redisServer({ args: ["--user", ...rule] })
  const url = () => `redis://lockstep:${password}@127.0.0.1:${redis.get().port}`

  it("the README's ACL user with its namespace as --prefix: run, status, latch all work", async () => {
    expect(rule).toContain(`~${namespace}*`)
    const log = join(dir, "prefixed.log")
    const result = await lockstep(bin, ["run", "-b", url(), "--prefix", namespace, "job", "--", "sh", "-c", `echo $LOCKSTEP_FENCE > ${log}`])
    expect(result).toMatchObject({ code: 0, stderr: "" })
    expect(readFileSync(log, "utf8")).toMatch(/^\d+\n$/)
    const holding = start(bin, ["run", "-b", url(), "--prefix", namespace, "held", "--", "sh", "-c", `echo up > ${log}.held; sleep 30`])
    await waitForFile(`${log}.held`)
    const status = await lockstep(bin, ["status", "-b", url(), "--prefix", namespace, "--json", "held"])
    expect(JSON.parse(status.stdout)).toMatchObject({ key: "held", holders: [{ exclusive: 1 }] })
    // a waiter subscribes to the namespace's channel, and is woken by the release
    const waiting = start(bin, ["run", "-b", url(), "--prefix", namespace, "--wait", "20s", "held", "--", "true"])
    holding.process.kill("SIGTERM")
    expect((await holding.result).code).toBe(143)
    expect(await waiting.result).toMatchObject({ code: 0, stderr: "" })
    expect((await lockstep(bin, ["latch", "set", "-b", url(), "--prefix", namespace, "batch", "1"])).code).toBe(0)
  })

  it("LOCKSTEP_PREFIX when --prefix is not given", async () => {
    const result = await start(bin, ["run", "-b", url(), "env", "--", "true"], { env: { LOCKSTEP_PREFIX: namespace } }).result
    expect(result).toMatchObject({ code: 0, stderr: "" })
  })

  it("without the prefix: one line saying the user may not touch the keys, and the unavailable code", async () => {
    const marker = join(dir, "unprefixed.ran")
    const result = await lockstep(bin, ["run", "-b", url(), "job", "--", "touch", marker])
    expect(result.code).toBe(69)
    expect(result.stderr.trim().split("\n")).toHaveLength(1)
    expect(result.stderr).toMatch(/^lockstep: .*NOPERM .*keys.*--prefix/)
  })
})

describe.runIf(await redisRuns("lockstep --accept-eviction on Redis"))("lockstep --accept-eviction on Redis", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const redis = redisServer({ args: ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"] })

  it("a server that may evict lock keys is refused in one line; --accept-eviction runs on it", async () => {
    const refused = await lockstep(bin, ["run", "-b", redis.get().url, "evicting", "--", "true"])
    expect(refused.code).toBe(69)
    expect(refused.stderr).toMatch(/^lockstep: .*allkeys-lru/)
    expect(refused.stderr.trim().split("\n")).toHaveLength(1)
    const accepted = await lockstep(bin, ["run", "-b", redis.get().url, "--accept-eviction", "evicting", "--", "true"])
    expect(accepted.code).toBe(0)
  })
})
