/**
 * `lockstep run` on a Redis Cluster (`redis+cluster://` with the startup nodes): mutual exclusion
 * between processes, with increasing fences.
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { RedisServer } from "@lockstep/servers"
import { buildBin, lockstep, redisRuns, sections, stampScript, tempDir } from "./fixtures/lockstep.js"

describe.runIf(await redisRuns("lockstep run on a Redis Cluster"))("lockstep run on a Redis Cluster", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const scope = Effect.runSync(Scope.make())
  let url = ""
  beforeAll(async () => {
    const cluster = await Effect.runPromise(Scope.extend(RedisServer.makeCluster(), scope))
    url = `redis+cluster://${cluster.startupNodes.map((node) => `${node.host}:${node.port}`).join(",")}`
  })
  afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))

  it("two runs on one key never overlap, and their fences increase", async () => {
    const log = join(dir, "cluster.log")
    const results = await Promise.all([0, 1].map(() => lockstep(bin, ["run", "--backend", url, "cluster", "--", ...stampScript(log, 0.3)])))
    for (const result of results) expect(result).toMatchObject({ code: 0, stderr: "" })
    expect(sections(readFileSync(log, "utf8"))).toHaveLength(2)
  })
})
