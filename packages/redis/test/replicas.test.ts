/**
 * Which replicas the default acknowledgement waits for, as read from a master's `INFO`: the
 * replicas it lists by address, not a client that only takes a snapshot (`redis-cli --rdb`, listed
 * with port 0, which never acknowledges a write), and which server process listed them.
 */
import { assert, describe, it } from "@effect/vitest"
import { readingOf } from "../src/internal/eviction.js"

// INFO of a Redis 7.0 master with two replicas and a `redis-cli --rdb` taking a snapshot
const master = [
  "# Server",
  "redis_version:7.0.15",
  "run_id:4f0e8a3c1b7d2e6f9a0b1c2d3e4f5a6b7c8d9e0f",
  "# Memory",
  "maxmemory:0",
  "maxmemory_policy:noeviction",
  "# Stats",
  "evicted_keys:0",
  "# Replication",
  "role:master",
  "connected_slaves:3",
  "slave0:ip=127.0.0.1,port=0,state=wait_bgsave,offset=0,lag=0",
  "slave1:ip=10.0.0.6,port=6379,state=online,offset=1234,lag=0",
  "slave2:ip=10.0.0.7,port=6380,state=send_bulk,offset=0,lag=1",
  "master_failover_state:no-failover",
  "master_replid:eab1ebe8a677aed497c47366844edd483deae1c4",
  ""
].join("\r\n")

describe("the replicas a master lists", () => {
  it("are its replicas by address, without a snapshot client", () => {
    const reading = readingOf("10.0.0.5:6379", master)
    assert.deepStrictEqual(reading.replicas, ["10.0.0.6:6379", "10.0.0.7:6380"])
    assert.strictEqual(reading.runId, "4f0e8a3c1b7d2e6f9a0b1c2d3e4f5a6b7c8d9e0f")
  })

  it("are none on a replica", () => {
    const replica = master.replace("role:master", "role:slave")
    assert.deepStrictEqual(readingOf("10.0.0.6:6379", replica).replicas, [])
  })

  it("are read from the replication id where run_id is hidden", () => {
    const hidden = master.replace(/run_id:.*\r\n/, "")
    assert.strictEqual(readingOf("10.0.0.5:6379", hidden).runId, "eab1ebe8a677aed497c47366844edd483deae1c4")
  })
})
