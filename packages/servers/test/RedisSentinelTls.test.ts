/**
 * `RedisSentinel.make({ tls })`: every process (data nodes and sentinels) speaks TLS only, with
 * one CA, and the topology works as without TLS: replication, the sentinels' view, a failover.
 * Probed with Node's own TLS client and plain sockets.
 */
import { assert, describe, it } from "@effect/vitest"
import * as net from "node:net"
import * as tls from "node:tls"
import { Effect } from "effect"
import * as RedisSentinel from "@lockstep/servers/RedisSentinel"
import * as RedisServer from "@lockstep/servers/RedisServer"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
const runnable = available || required
if (!runnable) {
  console.warn(
    "RedisSentinel TLS suite NOT RUN: redis-server not found (set REDIS_SERVER_BIN, or LOCKSTEP_REQUIRE_REDIS=1 to fail instead)"
  )
}

/** One inline command on a fresh connection (TLS trusting `ca`, or plain text without); its reply as text. */
const ask = (port: number, command: string, ca?: string): Effect.Effect<string> =>
  Effect.async<string>((resume) => {
    const socket = ca === undefined
      ? net.createConnection({ host: "127.0.0.1", port })
      : tls.connect({ host: "127.0.0.1", port, ca })
    let settled = false
    let received = ""
    const settle = (outcome: string) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed(outcome))
    }
    const timer = setTimeout(() => settle("timeout"), 1_000)
    /** A line reply, or a bulk string once all of it is in (arrays are read as far as they came). */
    const settleIfComplete = () => {
      const end = received.indexOf("\r\n")
      if (end < 0) return
      const length = received.startsWith("$") ? Number(received.slice(1, end)) : -1
      if (length < 0 || Buffer.byteLength(received) >= end + 2 + length + 2) settle(received)
    }
    socket.on(ca === undefined ? "connect" : "secureConnect", () => socket.write(`${command}\r\n`))
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString()
      settleIfComplete()
    })
    socket.on("error", (error) => settle(`error: ${error.message}`))
    socket.on("close", () => settle(`closed after ${JSON.stringify(received)}`))
    return Effect.sync(() => {
      settled = true
      clearTimeout(timer)
      socket.destroy()
    })
  })

describe.runIf(runnable)("RedisSentinel with TLS", () => {
  it.scopedLive("every process speaks TLS only, with one CA; sentinels follow a failover over TLS", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make({ tls: true, replicas: 1, sentinels: 2, quorum: 1 })
      const ca = topology.ca ?? ""
      assert.include(ca, "-----BEGIN CERTIFICATE-----")
      for (const server of [...topology.nodes, ...topology.sentinels]) {
        assert.strictEqual(server.ca, ca, "one CA for every process")
        assert.match(server.url, /^rediss:\/\//)
        assert.match(yield* ask(server.port, "PING", ca), /^\+PONG/)
        assert.notMatch(yield* ask(server.port, "PING"), /^\+PONG/, "no plaintext on the port")
      }
      const sentinel = topology.sentinels[0]!
      const named = yield* ask(sentinel.port, `SENTINEL GET-MASTER-ADDR-BY-NAME ${topology.name}`, ca)
      assert.include(named, String(topology.primary.port), "the sentinels name the primary by its TLS port")
      // the replica replicates over TLS
      assert.include(yield* ask(topology.replicas[0]!.port, "INFO replication", ca), "master_link_status:up")
      const promoted = yield* topology.failover()
      assert.strictEqual(promoted, topology.replicas[0])
      assert.strictEqual(yield* promoted.role, "master")
      yield* topology.awaitSync()
    }), 30_000)
})
