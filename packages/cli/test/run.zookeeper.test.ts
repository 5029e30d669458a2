/**
 * `lockstep run` on a ZooKeeper server of this file's own: mutual exclusion between processes
 * with increasing fences, the conflict exit code, `status`, latches.
 */
import { describe } from "vitest"
import { buildBin, runScenarios, tempDir } from "./fixtures/lockstep.js"
import { serverForFile } from "../../zookeeper/test/fixtures/server.js"

const server = await serverForFile("lockstep run on ZooKeeper")

describe.runIf(server !== undefined)("lockstep run on ZooKeeper", () => {
  const dir = tempDir()
  const bin = buildBin(dir)
  const url = `zk://${server!.connectionString}/cli-${process.pid}`

  runScenarios(bin, dir, url)
})
