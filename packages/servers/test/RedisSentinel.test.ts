import { assert, describe, it } from "@effect/vitest"
import { execFile } from "node:child_process"
import { existsSync } from "node:fs"
import { Effect, Either, Schedule } from "effect"
import { Redis } from "ioredis"
import { RedisSentinel, RedisServer } from "@lockstep/servers"
import { childProcesses, pidOf, portFree, processExists } from "./fixtures/processes.js"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
const runnable = available || required
const title = available
  ? "RedisSentinel"
  : required
  ? "RedisSentinel (redis-server not found, but LOCKSTEP_REQUIRE_REDIS=1)"
  : "RedisSentinel (redis-server not found: not run)"
if (!runnable) {
  console.warn(
    "RedisSentinel suite NOT RUN: redis-server not found " +
      "(set REDIS_SERVER_BIN, or LOCKSTEP_REQUIRE_REDIS=1 to fail instead)"
  )
}

// ---------------------------------------------------------------------------------------------
// independent probes (redis-cli, raw sockets, /proc), not the launcher's own helpers
// ---------------------------------------------------------------------------------------------

const cliBin = process.env["REDIS_CLI_BIN"] ?? "redis-cli"

/** `redis-cli -p <port> ...args`, trimmed stdout (redis-cli prints error replies there too). */
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

const infoField = (infoText: string, field: string): string | undefined =>
  infoText.split(/\r?\n/).find((line) => line.startsWith(`${field}:`))?.slice(field.length + 1).trim()

const replication = (port: number) => cli(port, "INFO", "replication")

/** Pairs of lines of a flat field/value reply, as redis-cli prints them. */
const fields = (reply: string): Map<string, string> => {
  const lines = reply.split("\n")
  const map = new Map<string, string>()
  for (let i = 0; i + 1 < lines.length; i += 2) map.set(lines[i]!, lines[i + 1]!)
  return map
}



const childRedisServers = () => childProcesses((name) => name.startsWith("redis-server"))


/** An ioredis client through the sentinels, closed with the scope. */
const sentinelClient = (topology: RedisSentinel.RedisSentinel) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const client = new Redis({
        sentinels: topology.sentinelAddresses.map(({ host, port }) => ({ host, port })),
        name: topology.name,
        maxRetriesPerRequest: 20
      })
      // reconnects during a failover are expected; commands still fail loudly
      client.on("error", () => undefined)
      return client
    }),
    (client) => Effect.sync(() => client.disconnect())
  )

const millisSince = (start: number): number => Math.round(performance.now() - start)

/**
 * The sentinels that ever called `node` a master gone (`+sdown master`). A promoted replica must
 * never be: a sentinel that does so soon after the switch, while the old votes still count, fails
 * over a second time onto whatever replica is left.
 */
const calledDown = (topology: RedisSentinel.RedisSentinel, node: RedisSentinel.Node) =>
  Effect.filter(
    topology.sentinels,
    (sentinel) => Effect.map(sentinel.logs, (logs) => new RegExp(`\\+sdown master lockstep 127\\.0\\.0\\.1 ${node.port}$`, "m").test(logs))
  ).pipe(Effect.map((sentinels) => sentinels.map((sentinel) => sentinel.port)))

describe.skipIf(!runnable)(title, () => {
  it("redis-server can be executed", () => {
    assert.isTrue(
      available,
      "redis-server could not be executed (REDIS_SERVER_BIN or PATH) and LOCKSTEP_REQUIRE_REDIS=1 requires it"
    )
  })

  it.live("starts the topology, sentinels report the primary, writes replicate; scope close stops everything", () =>
    Effect.gen(function*() {
      const started = performance.now()
      const { dirs, pids, ports } = yield* Effect.scoped(
        Effect.gen(function*() {
          const topology = yield* RedisSentinel.make()
          console.log(`topology (1 primary, 2 replicas, 3 sentinels) ready in ${millisSince(started)} ms`)
          const { primary, replicas, sentinels } = topology
          assert.strictEqual(topology.name, "lockstep")
          assert.strictEqual(replicas.length, 2)
          assert.strictEqual(sentinels.length, 3)
          assert.deepStrictEqual(topology.nodes, [primary, ...replicas])
          const ports = [...topology.nodes, ...sentinels].map((server) => server.port)
          assert.strictEqual(new Set(ports).size, 6)
          assert.isFalse(ports.includes(6379))
          for (const server of [...topology.nodes, ...sentinels]) assert.strictEqual(server.host, "127.0.0.1")
          assert.deepStrictEqual(
            topology.sentinelAddresses,
            sentinels.map((sentinel) => ({ host: "127.0.0.1", port: sentinel.port }))
          )

          // no persistence
          assert.strictEqual(yield* cli(primary.port, "CONFIG", "GET", "save"), "save")
          assert.strictEqual(yield* cli(primary.port, "CONFIG", "GET", "appendonly"), "appendonly\nno")

          // every sentinel reports the primary, knows both replicas by their own ports, and the others
          for (const sentinel of sentinels) {
            assert.strictEqual(
              yield* cli(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "lockstep"),
              `127.0.0.1\n${primary.port}`
            )
            const master = fields(yield* cli(sentinel.port, "SENTINEL", "MASTER", "lockstep"))
            assert.strictEqual(master.get("quorum"), "2")
            assert.strictEqual(master.get("down-after-milliseconds"), "1000")
            // pings (and link re-connections) four times per down-after: see `calledDown`
            assert.strictEqual(fields(yield* cli(sentinel.port, "SENTINEL", "DEBUG")).get("PING-PERIOD"), "250")
            assert.strictEqual(master.get("num-other-sentinels"), "2")
            assert.strictEqual(master.get("num-slaves"), "2")
            const known = yield* cli(sentinel.port, "SENTINEL", "REPLICAS", "lockstep")
            for (const replica of replicas) assert.include(known, `127.0.0.1:${replica.port}`)
          }
          assert.strictEqual((yield* topology.master).name, "primary")
          assert.strictEqual(yield* primary.role, "master")
          for (const replica of replicas) assert.strictEqual(yield* replica.role, "replica")

          // replication goes through the proxies, while the primary names the replicas by their own ports
          const primaryInfo = yield* replication(primary.port)
          assert.strictEqual(infoField(primaryInfo, "connected_slaves"), "2")
          for (const [index, replica] of replicas.entries()) {
            const proxy = yield* topology.proxyOf(index)
            assert.notStrictEqual(proxy.port, primary.port)
            const replicaInfo = yield* replication(replica.port)
            assert.strictEqual(infoField(replicaInfo, "master_port"), String(proxy.port))
            assert.strictEqual(infoField(replicaInfo, "master_link_status"), "up")
            assert.include(primaryInfo, `ip=127.0.0.1,port=${replica.port},`)
            assert.notInclude(primaryInfo, `port=${proxy.port},`)
            assert.isAtLeast(yield* proxy.connections, 1)
          }

          // writes replicate to both replicas
          assert.strictEqual(yield* cli(primary.port, "SET", "greeting", "hello"), "OK")
          yield* topology.awaitSync()
          for (const replica of replicas) assert.strictEqual(yield* cli(replica.port, "GET", "greeting"), "hello")

          const pids = yield* Effect.forEach([...topology.nodes, ...sentinels], pidOf)
          return { dirs: [...topology.nodes, ...sentinels].map((server) => server.dir), pids, ports }
        })
      )
      for (const pid of pids) assert.isFalse(processExists(pid), `redis-server ${pid} still exists`)
      for (const port of ports) assert.isTrue(yield* portFree(port), `port ${port} still bound`)
      for (const dir of dirs) assert.isFalse(existsSync(dir), `${dir} still exists`)
    }))

  it.scopedLive("cutReplication stops a replica receiving writes, sentinels cannot undo it; restore undoes it", () =>
    Effect.gen(function*() {
      // a short failover-timeout: sentinels soon try to re-point the proxied replicas (+fix-slave-config)
      const topology = yield* RedisSentinel.make({ failoverTimeout: "2 seconds" })
      const { primary, replicas } = topology
      const [r0, r1] = replicas as readonly [RedisSentinel.Node, RedisSentinel.Node]

      yield* topology.cutReplication(1)
      assert.isTrue(yield* topology.isCut(1))
      yield* topology.cutReplication(1) // nothing if already cut
      assert.strictEqual(infoField(yield* replication(r1.port), "master_link_status"), "down")

      // the primary keeps serving; the cut replica gets nothing, the other one everything
      assert.strictEqual(yield* cli(primary.port, "SET", "k1", "v1"), "OK")
      yield* topology.awaitSync()
      assert.strictEqual(yield* cli(r0.port, "GET", "k1"), "v1")
      assert.strictEqual(yield* cli(r1.port, "GET", "k1"), "")
      assert.strictEqual(yield* cli(r1.port, "DBSIZE"), "0")

      // the sentinels try to re-point the cut replica straight at the primary, and cannot
      const sentinelsTried = Effect.gen(function*() {
        for (const sentinel of topology.sentinels) {
          if ((yield* sentinel.logs).includes(`+fix-slave-config slave 127.0.0.1:${r1.port}`)) return true
        }
        return false
      })
      yield* Effect.repeat(sentinelsTried, { until: (tried) => tried, schedule: Schedule.spaced("100 millis") }).pipe(
        Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("no +fix-slave-config seen") }),
        Effect.orDie
      )
      assert.include(yield* cli(r1.port, "REPLICAOF", "127.0.0.1", String(primary.port)), "NOPERM")
      const cutInfo = yield* replication(r1.port)
      assert.strictEqual(infoField(cutInfo, "master_link_status"), "down")
      assert.strictEqual(infoField(cutInfo, "master_port"), String((yield* topology.proxyOf(1)).port))
      assert.strictEqual(yield* cli(r1.port, "GET", "k1"), "")

      // a restart keeps the cut (and the refusal)
      yield* r1.restart
      yield* Effect.sleep("1500 millis") // a replica retries its master once a second
      assert.strictEqual(infoField(yield* replication(r1.port), "master_link_status"), "down")
      assert.strictEqual(yield* cli(r1.port, "DBSIZE"), "0")
      assert.include(yield* cli(r1.port, "REPLICAOF", "127.0.0.1", String(primary.port)), "NOPERM")

      yield* topology.restoreReplication(1)
      assert.isFalse(yield* topology.isCut(1))
      assert.strictEqual(yield* cli(r1.port, "GET", "k1"), "v1")
      assert.strictEqual(infoField(yield* replication(r1.port), "master_link_status"), "up")

      // the sentinels re-point replica 0 straight at the primary; a cut routes it through its proxy again
      yield* Effect.repeat(replication(r0.port), {
        until: (text) => infoField(text, "master_port") === String(primary.port),
        schedule: Schedule.spaced("100 millis")
      }).pipe(Effect.timeout("10 seconds"), Effect.orDie)
      yield* topology.cutReplication(0)
      assert.strictEqual(
        infoField(yield* replication(r0.port), "master_port"),
        String((yield* topology.proxyOf(0)).port)
      )
      assert.strictEqual(yield* cli(primary.port, "SET", "k2", "v2"), "OK")
      yield* topology.awaitSync()
      assert.strictEqual(yield* cli(r1.port, "GET", "k2"), "v2")
      assert.strictEqual(yield* cli(r0.port, "GET", "k2"), "")
      yield* topology.restoreReplication(0)
      assert.strictEqual(yield* cli(r0.port, "GET", "k2"), "v2")

      // bad uses are typed errors
      const noSuch = yield* Effect.either(topology.cutReplication(2))
      assert.isTrue(Either.isLeft(noSuch) && noSuch.left._tag === "RedisServerError")
      assert.isTrue(Either.isLeft(noSuch) && /no replica 2/.test(noSuch.left.message))
      yield* r0.kill
      const stopped = yield* Effect.either(topology.cutReplication(0))
      assert.isTrue(Either.isLeft(stopped) && /not running/.test(stopped.left.message))
    }))

  it.scopedLive("a planned failover moves the master to a replica; ioredis through the sentinels writes there", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      const { primary, replicas } = topology
      const client = yield* sentinelClient(topology)
      assert.strictEqual(yield* Effect.promise(() => client.set("before", "1")), "OK")
      assert.strictEqual(yield* cli(primary.port, "GET", "before"), "1")
      yield* topology.awaitSync()

      const start = performance.now()
      const promoted = yield* topology.failover()
      const failoverMs = millisSince(start)
      assert.notStrictEqual(promoted, primary)
      assert.include(replicas, promoted)
      assert.strictEqual(yield* promoted.role, "master")
      assert.strictEqual(yield* topology.master, promoted)
      for (const sentinel of topology.sentinels) {
        assert.strictEqual(
          yield* cli(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "lockstep"),
          `127.0.0.1\n${promoted.port}`
        )
      }
      assert.strictEqual(yield* cli(promoted.port, "GET", "before"), "1")

      // a client that connects now finds the new master through the sentinels
      const fresh = yield* sentinelClient(topology)
      assert.strictEqual(yield* Effect.promise(() => fresh.set("fresh", "2")), "OK")
      assert.strictEqual(yield* cli(promoted.port, "GET", "fresh"), "2")

      // the sentinels convert the old primary (dropping its clients); the old client follows
      yield* topology.awaitSync()
      console.log(
        `planned failover: ${promoted.name} is master after ${failoverMs} ms; ` +
          `old primary converted to a replica and in sync after ${millisSince(start)} ms`
      )
      assert.strictEqual(yield* primary.role, "replica")
      assert.strictEqual(yield* Effect.promise(() => client.set("after", "3")), "OK")
      assert.strictEqual(yield* cli(promoted.port, "GET", "after"), "3")
      yield* topology.awaitSentinels()
    }))

  it.scopedLive("killing the primary: automatic promotion; it rejoins as a replica; a cut link is re-aimed", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      const { primary, replicas } = topology
      const [r0, r1] = replicas as readonly [RedisSentinel.Node, RedisSentinel.Node]
      assert.strictEqual(yield* cli(primary.port, "SET", "k", "v"), "OK")
      // replica 1 misses the failover: its link is cut, and replica 0 is the one to promote
      yield* topology.cutReplication(1)
      yield* topology.preferReplica(0)
      const oldProxy = yield* topology.proxyOf(1)

      const start = performance.now()
      yield* primary.kill
      const promoted = yield* topology.awaitMaster({ filter: (node) => node !== primary })
      console.log(`unplanned failover: ${promoted.name} promoted ${millisSince(start)} ms after the primary was killed`)
      assert.strictEqual(promoted, r0)
      assert.strictEqual(yield* cli(r0.port, "GET", "k"), "v")
      assert.strictEqual(yield* cli(r0.port, "SET", "k2", "v2"), "OK")

      // back without its data (no persistence), it is converted into a replica of the new master
      const back = performance.now()
      yield* primary.restart
      yield* topology.awaitSync()
      console.log(`restarted old primary converted and in sync after ${millisSince(back)} ms`)
      assert.strictEqual(yield* primary.role, "replica")
      assert.strictEqual(yield* cli(primary.port, "GET", "k2"), "v2")
      assert.strictEqual(yield* topology.master, r0)

      // still aimed at the dead primary, replica 1 gets a proxy to the new master when restored
      assert.strictEqual(yield* cli(r1.port, "GET", "k2"), "")
      yield* topology.restoreReplication(1)
      const newProxy = yield* topology.proxyOf(1)
      assert.notStrictEqual(newProxy.port, oldProxy.port)
      assert.strictEqual(infoField(yield* replication(r1.port), "master_port"), String(newProxy.port))
      assert.strictEqual(yield* cli(r1.port, "GET", "k2"), "v2")
      yield* topology.awaitSentinels()
      assert.deepStrictEqual(yield* calledDown(topology, r0), [], "sentinels that called the promoted replica down")
    }))

  it.scopedLive("a stale replica (link cut before a write) can be the one promoted: the write is lost", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      const { primary, replicas } = topology
      const [r0, r1] = replicas as readonly [RedisSentinel.Node, RedisSentinel.Node]

      yield* topology.cutReplication(1)
      assert.strictEqual(yield* cli(primary.port, "SET", "K", "acknowledged"), "OK")
      yield* topology.awaitSync()
      assert.strictEqual(yield* cli(r0.port, "GET", "K"), "acknowledged")
      assert.strictEqual(yield* cli(r1.port, "GET", "K"), "")

      yield* topology.preferReplica(1)
      assert.strictEqual(yield* cli(r0.port, "CONFIG", "GET", "replica-priority"), "replica-priority\n0")

      const start = performance.now()
      yield* primary.kill
      const promoted = yield* topology.awaitMaster({ filter: (node) => node !== primary })
      console.log(`stale promotion: ${promoted.name} promoted ${millisSince(start)} ms after the primary was killed`)
      assert.strictEqual(promoted, r1)
      assert.strictEqual(yield* cli(promoted.port, "GET", "K"), "")

      // the up-to-date replica follows the stale master and loses the write too
      yield* topology.awaitSync()
      assert.strictEqual(yield* r0.role, "replica")
      assert.strictEqual(yield* cli(r0.port, "GET", "K"), "")

      // restoring a promoted replica only lifts the cut
      yield* topology.restoreReplication(1)
      assert.isFalse(yield* topology.isCut(1))
      assert.strictEqual(yield* r1.role, "master")
      const notReplica = yield* Effect.either(topology.cutReplication(1))
      assert.isTrue(Either.isLeft(notReplica) && /it is the master/.test(notReplica.left.message))
      assert.deepStrictEqual(yield* calledDown(topology, r1), [], "sentinels that called the promoted replica down")
    }))

  it.live("bad options and failed startups are typed RedisServerErrors", () =>
    Effect.gen(function*() {
      for (const options of [{ replicas: 0 }, { sentinels: 1.5 }, { sentinels: 3, quorum: 4 }, { name: "two words" }]) {
        const result = yield* Effect.either(Effect.scoped(RedisSentinel.make(options)))
        assert.isTrue(Either.isLeft(result), JSON.stringify(options))
        if (Either.isLeft(result)) assert.instanceOf(result.left, RedisServer.RedisServerError)
      }
      const badArgs = yield* Effect.either(Effect.scoped(RedisSentinel.make({ args: ["--no-such-directive", "1"] })))
      assert.isTrue(Either.isLeft(badArgs) && /no-such-directive/.test(badArgs.left.message))
      // a bound too short to be met: the error says what was awaited and shows the replicas' logs
      const tooShort = yield* Effect.either(Effect.scoped(RedisSentinel.make({ readyTimeout: "1 millis" })))
      assert.isTrue(Either.isLeft(tooShort))
      if (Either.isLeft(tooShort)) {
        assert.instanceOf(tooShort.left, RedisServer.RedisServerError)
        assert.match(tooShort.left.message, /replicas did not catch up with primary/)
        assert.match(tooShort.left.message, /--- replica-0 \(port \d+\), last lines:/)
      }
    }))

  it("leaves no redis-server child processes behind", () => {
    assert.deepStrictEqual(childRedisServers(), [])
  })
})
