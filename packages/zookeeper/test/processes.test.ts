/**
 * Two OS processes contend on one lock through the ZooKeeper backend on a real ZooKeeper server
 * (`contention.ts`): the merged history must show mutual exclusion and increasing fences, and
 * both processes must hold the lock.
 */
import { describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { ZooKeeperServer } from "@lockstep/servers"
import { contendAcrossProcesses } from "../../testkit/test/fixtures/contention.js"

const required = process.env["LOCKSTEP_REQUIRE_ZOOKEEPER"] === "1"
const available = await Effect.runPromise(ZooKeeperServer.available)
if (!available) console.warn("ZooKeeper multi-process suite NOT RUN: no Java runtime or ZooKeeper jar (Debian's zookeeper package)")

describe.runIf(available || required)("two processes contend on one lock on a real ZooKeeper server", () => {
  it.scopedLive("mutual exclusion and increasing fences across processes; both processes hold the lock", () =>
    Effect.gen(function*() {
      const server = yield* ZooKeeperServer.make()
      yield* contendAcrossProcesses("zookeeper processes", `zk://${server.connectionString}`, "processes-zookeeper", 40)
    }), 60_000)
})
