import { describe } from "@effect/vitest"
import { Layer } from "effect"
import { ZooKeeperBackend } from "@lockstep/zookeeper"
import * as Conformance from "@lockstep/testkit/Conformance"
import { serverForFile } from "./fixtures/server.js"


// under a namespace of its own, so no test sees another's nodes
const server = await serverForFile("ZooKeeper conformance suite")

describe.runIf(server !== undefined)("ZooKeeper backend on a real ZooKeeper server", () => {
  const layer = Layer.suspend(() =>
    ZooKeeperBackend.layerFrom(server!.connectionString, { namespace: `/conformance-${crypto.randomUUID()}` })
  ).pipe(Layer.orDie)
  Conformance.suite({ name: "zookeeper", layer, clock: "live", fences: "gapped", order: "fifo" })
})
