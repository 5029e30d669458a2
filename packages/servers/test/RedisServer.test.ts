import { assert, describe, it } from "@effect/vitest"
import { execFile } from "node:child_process"
import { existsSync } from "node:fs"
import * as net from "node:net"
import { Effect, Either, Option } from "effect"
import * as RedisServer from "@lockstep/servers/RedisServer"
import { childProcesses, pidOf, portFree, processExists } from "./fixtures/processes.js"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
const runnable = available || required
const title = available
  ? "RedisServer"
  : required
  ? "RedisServer (redis-server not found, but LOCKSTEP_REQUIRE_REDIS=1)"
  : "RedisServer (redis-server not found: not run)"
if (!runnable) {
  console.warn(
    "RedisServer suite NOT RUN: redis-server not found " +
      "(set REDIS_SERVER_BIN, or LOCKSTEP_REQUIRE_REDIS=1 to fail instead)"
  )
}

// ---------------------------------------------------------------------------------------------
// independent probes (raw sockets, redis-cli, /proc), not the launcher's own helpers
// ---------------------------------------------------------------------------------------------

type Probe = "pong" | "refused" | "timeout" | `other: ${string}`

/** A raw inline PING on a fresh connection, with a client-side timeout. */
const probe = (port: number, timeoutMs = 1_000): Effect.Effect<Probe> =>
  Effect.async<Probe>((resume) => {
    const socket = net.createConnection({ host: "127.0.0.1", port })
    let settled = false
    let received = ""
    const settle = (result: Probe) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed(result))
    }
    const timer = setTimeout(() => settle("timeout"), timeoutMs)
    socket.on("connect", () => socket.write("PING\r\n"))
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString()
      if (received.includes("\r\n")) settle(received.startsWith("+PONG") ? "pong" : `other: ${received.trim()}`)
    })
    socket.on("error", (error: NodeJS.ErrnoException) =>
      settle(error.code === "ECONNREFUSED" ? "refused" : `other: ${error.message}`))
    socket.on("close", () => settle(`other: closed after ${JSON.stringify(received)}`))
    return Effect.sync(() => {
      settled = true
      clearTimeout(timer)
      socket.destroy()
    })
  })

const cliBin = process.env["REDIS_CLI_BIN"] ?? "redis-cli"

/** `redis-cli -p <port> ...args`, trimmed stdout. */
const cli = (port: number, ...args: ReadonlyArray<string>): Effect.Effect<string> =>
  Effect.async<string>((resume) => {
    const argv = ["-h", "127.0.0.1", "-p", String(port), ...args]
    const child = execFile(cliBin, argv, { timeout: 5_000 }, (error, stdout, stderr) =>
      resume(
        error === null
          ? Effect.succeed(stdout.trim())
          : Effect.die(new Error(`redis-cli ${argv.join(" ")}: ${error.message} ${stderr}`))
      ))
    return Effect.sync(() => {
      child.kill("SIGKILL")
    })
  })



const childRedisServers = () => childProcesses((name) => name.startsWith("redis-server"))


describe.skipIf(!runnable)(title, () => {
  it("redis-server can be executed", () => {
    assert.isTrue(
      available,
      "redis-server could not be executed (REDIS_SERVER_BIN or PATH) and LOCKSTEP_REQUIRE_REDIS=1 requires it"
    )
  })

  it.scopedLive("starts a server without persistence on a free loopback port", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      assert.strictEqual(server.host, "127.0.0.1")
      assert.notStrictEqual(server.port, 6379)
      assert.strictEqual(server.url, `redis://127.0.0.1:${server.port}`)
      assert.isTrue(existsSync(server.dir))
      assert.isTrue(yield* server.isRunning)
      assert.isTrue(processExists(yield* pidOf(server)))
      assert.strictEqual(yield* probe(server.port), "pong")
      assert.strictEqual(yield* cli(server.port, "PING"), "PONG")
      assert.strictEqual(yield* cli(server.port, "CONFIG", "GET", "save"), "save")
      assert.strictEqual(yield* cli(server.port, "CONFIG", "GET", "appendonly"), "appendonly\nno")
      assert.strictEqual(yield* cli(server.port, "CONFIG", "GET", "dir"), `dir\n${server.dir}`)
    }))

  it.scopedLive("passes extra args", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--maxmemory", "12mb"] })
      assert.strictEqual(yield* cli(server.port, "CONFIG", "GET", "maxmemory"), `maxmemory\n${12 * 1024 * 1024}`)
    }))

  it.scopedLive("kill: connection refused; restart: answers again on the same port", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const first = yield* pidOf(server)
      assert.strictEqual(yield* cli(server.port, "SET", "k", "v"), "OK")

      yield* server.kill
      assert.isFalse(processExists(first))
      assert.isFalse(yield* server.isRunning)
      assert.isTrue(Option.isNone(yield* server.pid))
      assert.strictEqual(yield* probe(server.port), "refused")
      yield* server.kill // idempotent

      yield* server.restart
      const second = yield* pidOf(server)
      assert.notStrictEqual(second, first)
      assert.strictEqual(yield* probe(server.port), "pong")
      assert.strictEqual(yield* cli(server.port, "EXISTS", "k"), "0") // nothing persisted

      // restart while running: the old process ends, a new one answers on the same port
      yield* server.restart
      const third = yield* pidOf(server)
      assert.notStrictEqual(third, second)
      assert.isFalse(processExists(second))
      assert.strictEqual(yield* probe(server.port), "pong")
    }))

  it.scopedLive("pause: PING gets no answer; resume: it answers", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      yield* server.pause
      assert.isTrue(yield* server.isRunning)
      assert.strictEqual(yield* probe(server.port, 300), "timeout")
      yield* server.resume
      assert.strictEqual(yield* probe(server.port), "pong")

      // restart and kill also work on a paused server
      yield* server.pause
      yield* server.restart
      assert.strictEqual(yield* probe(server.port), "pong")
      yield* server.pause
      yield* server.kill
      assert.strictEqual(yield* probe(server.port), "refused")
    }))

  it.live("closing the scope ends the process (even paused), frees the port and removes the dir", () =>
    Effect.gen(function*() {
      const { dir, pid, port } = yield* Effect.scoped(
        Effect.gen(function*() {
          const server = yield* RedisServer.make()
          const pid = yield* pidOf(server)
          yield* server.pause
          return { dir: server.dir, pid, port: server.port }
        })
      )
      assert.isFalse(processExists(pid), `redis-server ${pid} still exists`)
      assert.isTrue(yield* portFree(port), `port ${port} still bound`)
      assert.isFalse(existsSync(dir), `${dir} still exists`)
      assert.strictEqual(yield* probe(port), "refused")
    }))

  it.scopedLive("failures are typed RedisServerErrors", () =>
    Effect.gen(function*() {
      const missing = yield* Effect.either(RedisServer.make({ bin: "/nonexistent/redis-server" }))
      assert.isTrue(Either.isLeft(missing))
      if (Either.isLeft(missing)) {
        assert.strictEqual(missing.left._tag, "RedisServerError")
        assert.match(missing.left.message, /ENOENT/)
      }

      const bad = yield* Effect.either(RedisServer.make({ args: ["--no-such-directive", "1"] }))
      assert.isTrue(Either.isLeft(bad))
      if (Either.isLeft(bad)) {
        assert.instanceOf(bad.left, RedisServer.RedisServerError)
        assert.match(bad.left.message, /exited \(exit code 1\) before answering PING/)
        assert.match(bad.left.message, /no-such-directive/) // the log tail names the problem
      }

      const server = yield* RedisServer.make()
      yield* server.kill
      const pause = yield* Effect.either(server.pause)
      assert.isTrue(Either.isLeft(pause) && /not running/.test(pause.left.message))
      const resume = yield* Effect.either(server.resume)
      assert.isTrue(Either.isLeft(resume) && /not running/.test(resume.left.message))
    }))

  it.live("cluster: 3 masters reach cluster_state:ok, keys route with -c, scope close stops them all", () =>
    Effect.gen(function*() {
      const { pids, ports } = yield* Effect.scoped(
        Effect.gen(function*() {
          const cluster = yield* RedisServer.makeCluster()
          assert.strictEqual(cluster.nodes.length, 3)
          assert.deepStrictEqual(
            cluster.startupNodes,
            cluster.nodes.map((node) => ({ host: "127.0.0.1", port: node.port }))
          )
          const ports = cluster.nodes.map((node) => node.port)
          assert.strictEqual(new Set(ports).size, 3)
          assert.isFalse(ports.includes(6379))
          for (const port of ports) {
            const info = yield* cli(port, "CLUSTER", "INFO")
            assert.include(info, "cluster_state:ok")
            assert.include(info, "cluster_known_nodes:3")
            assert.include(info, "cluster_slots_assigned:16384")
          }
          const [a, b, c] = ports as [number, number, number]
          // keys spread over all slots: write through one node, read through another
          for (const key of ["alpha", "beta", "gamma", "delta", "epsilon"]) {
            assert.strictEqual(yield* cli(a, "-c", "SET", key, `v-${key}`), "OK")
            assert.strictEqual(yield* cli(b, "-c", "GET", key), `v-${key}`)
          }
          assert.strictEqual(yield* cli(c, "-c", "GET", "alpha"), "v-alpha")
          const pids = yield* Effect.forEach(cluster.nodes, pidOf)
          assert.isTrue(pids.every(processExists))
          return { pids, ports }
        })
      )
      for (const pid of pids) assert.isFalse(processExists(pid), `redis-server ${pid} still exists`)
      for (const port of ports) assert.isTrue(yield* portFree(port), `port ${port} still bound`)
    }))

  it.live("cluster: a killed node restarts on its port, rejoins, and the cluster heals", () =>
    Effect.scoped(
      Effect.gen(function*() {
        const cluster = yield* RedisServer.makeCluster()
        const [a, b] = cluster.nodes as readonly [RedisServer.RedisServer, RedisServer.RedisServer]
        yield* a.kill
        assert.strictEqual(yield* probe(a.port), "refused")
        yield* b.restart
        yield* a.restart
        yield* cluster.awaitHealthy("10 seconds")
        const info = yield* cli(a.port, "CLUSTER", "INFO")
        assert.include(info, "cluster_state:ok")
        assert.strictEqual(yield* cli(a.port, "-c", "SET", "after", "restart"), "OK")
        assert.strictEqual(yield* cli(b.port, "-c", "GET", "after"), "restart")
      })
    ))

  it("leaves no redis-server child processes behind", () => {
    assert.deepStrictEqual(childRedisServers(), [])
  })
})
