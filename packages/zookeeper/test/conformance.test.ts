import { afterAll, describe } from "@effect/vitest"
import { Effect, Exit, Layer, Scope } from "effect"
import { ZooKeeperBackend } from "@lockstep/zookeeper"
import { ZooKeeperServer } from "@lockstep/testkit"
import * as Conformance from "@lockstep/testkit/Conformance"

const required = process.env["LOCKSTEP_REQUIRE_ZOOKEEPER"] === "1"
const available = await Effect.runPromise(ZooKeeperServer.available)
if (!available) console.warn("ZooKeeper conformance suite NOT RUN: no Java runtime or ZooKeeper jar (Debian's zookeeper package)")

// one server for the file (a JVM takes a while to start); every backend the suite builds works
// under a namespace of its own, so no test sees another's nodes
const scope = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))
const server = available || required ? await Effect.runPromise(Scope.extend(ZooKeeperServer.make(), scope)) : undefined

describe.runIf(server !== undefined)("ZooKeeper backend on a real ZooKeeper server", () => {
  const layer = Layer.suspend(() =>
    ZooKeeperBackend.layerFrom(server!.connectionString, { namespace: `/conformance-${crypto.randomUUID()}` })
  ).pipe(Layer.orDie)
  Conformance.suite({ name: "zookeeper", layer, clock: "live", fences: "gapped", order: "fifo" })
})
