import { assert, describe, it } from "@effect/vitest"
import { execFile } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import * as net from "node:net"
import * as path from "node:path"
import { Effect, Either, Option, Schedule } from "effect"
import * as ZooKeeperServer from "@lockstep/servers/ZooKeeperServer"
import { childProcesses, pidOf, portFree, processExists } from "./fixtures/processes.js"

const required = process.env["LOCKSTEP_REQUIRE_ZOOKEEPER"] === "1"
const available = await Effect.runPromise(ZooKeeperServer.available)
const runnable = available || required
const title = available
  ? "ZooKeeperServer"
  : required
  ? "ZooKeeperServer (ZooKeeper not found, but LOCKSTEP_REQUIRE_ZOOKEEPER=1)"
  : "ZooKeeperServer (ZooKeeper not found: not run)"
if (!runnable) {
  console.warn(
    "ZooKeeperServer suite NOT RUN: java or ZooKeeper not found " +
      "(install Debian's zookeeper package or set ZOOKEEPER_HOME, or set LOCKSTEP_REQUIRE_ZOOKEEPER=1 to fail instead)"
  )
}

// ---------------------------------------------------------------------------------------------
// independent probes (raw sockets, ZooKeeper's own command-line client, /proc), not the
// launcher's own helpers
// ---------------------------------------------------------------------------------------------

type Probe = "refused" | "timeout" | `answer: ${string}` | `other: ${string}`

/** A four-letter word on a fresh connection; the answer is what arrives before the server closes. */
const fourLetterWord = (port: number, word: string, timeoutMs = 1_000): Effect.Effect<Probe> =>
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
    socket.on("connect", () => socket.write(word))
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString()
    })
    socket.on("error", (error: NodeJS.ErrnoException) =>
      settle(error.code === "ECONNREFUSED" ? "refused" : `other: ${error.message}`))
    socket.on("close", () => settle(`answer: ${received}`))
    return Effect.sync(() => {
      settled = true
      clearTimeout(timer)
      socket.destroy()
    })
  })

const ruok = (port: number, timeoutMs?: number) => fourLetterWord(port, "ruok", timeoutMs)

/** The `Mode:` of a `srvr` answer, or the whole probe result when there is none. */
const srvrMode = (port: number): Effect.Effect<string> =>
  Effect.map(fourLetterWord(port, "srvr"), (probe) => /Mode: (\S+)/.exec(probe)?.[1] ?? probe)

/** One `key=value` line of the `conf` four-letter word (the configuration the server runs with). */
const confValue = (port: number, key: string): Effect.Effect<string | undefined> =>
  Effect.map(fourLetterWord(port, "conf"), (probe) => new RegExp(`^${key}=(.*)$`, "m").exec(probe)?.[1])

// ZooKeeper's own client runs from the installation the servers run from
const installation = await Effect.runPromise(Effect.either(ZooKeeperServer.installation()))
const zkJava = Either.isRight(installation) ? installation.right.java : "java"
const zkClasspath = Either.isRight(installation)
  ? installation.right.classpath.join(path.delimiter)
  : "/usr/share/java/zookeeper.jar"

/**
 * ZooKeeper's own command-line client (`ZooKeeperMain`, one command): its stdout, or a failure
 * (exit code 1: e.g. the node does not exist).
 */
const zkCli = (connectionString: string, ...command: ReadonlyArray<string>): Effect.Effect<string, string> =>
  Effect.async<string, string>((resume) => {
    const argv = [
      "-XX:TieredStopAtLevel=1",
      "-cp",
      zkClasspath,
      "org.apache.zookeeper.ZooKeeperMain",
      "-server",
      connectionString,
      ...command
    ]
    const child = execFile(zkJava, argv, { timeout: 20_000, killSignal: "SIGKILL" }, (error, stdout, stderr) =>
      resume(error === null ? Effect.succeed(stdout) : Effect.fail(`zkCli ${command.join(" ")}: ${stdout} ${stderr}`)))
    return Effect.sync(() => {
      child.kill("SIGKILL")
    })
  })

/** `get <node>` until it succeeds (a follower may apply a write a moment after the leader). */
const zkGet = (connectionString: string, node: string): Effect.Effect<string, string> =>
  zkCli(connectionString, "get", node).pipe(
    Effect.map((stdout) => stdout.split("\n").map((line) => line.trim()).filter((line) => line !== "").at(-1) ?? ""),
    Effect.retry({ times: 3 })
  )



const childZooKeeperServers = () => childProcesses((_, commandLine) => commandLine().includes("QuorumPeerMain"))


describe.skipIf(!runnable)(title, () => {
  it("java and the ZooKeeper jar are present", () => {
    assert.isTrue(
      available,
      "java or ZooKeeper not found and LOCKSTEP_REQUIRE_ZOOKEEPER=1 requires them: " +
        (Either.isLeft(installation) ? installation.left.message : "java -version failed")
    )
  })

  it.scopedLive("starts a standalone server on a free loopback port: ruok imok, srvr standalone", () =>
    Effect.gen(function*() {
      const started = Date.now()
      const server = yield* ZooKeeperServer.make()
      const startMs = Date.now() - started
      assert.isBelow(startMs, 15_000)
      assert.strictEqual(server.host, "127.0.0.1")
      assert.notStrictEqual(server.port, 2181)
      assert.strictEqual(server.connectionString, `127.0.0.1:${server.port}`)
      assert.isTrue(existsSync(path.join(server.dir, "zoo.cfg")))
      assert.isTrue(existsSync(path.join(server.dir, "data", "version-2")), "no data written to the data dir")
      assert.isTrue(yield* server.isRunning)
      assert.isTrue(processExists(yield* pidOf(server)))
      assert.strictEqual(yield* ruok(server.port), "answer: imok")
      assert.strictEqual(yield* srvrMode(server.port), "standalone")
      assert.strictEqual(yield* server.mode, "standalone")
      // the defaults: quick ticks, and clients may ask for 1-30 s sessions
      assert.strictEqual(yield* confValue(server.port, "tickTime"), "200")
      assert.strictEqual(yield* confValue(server.port, "minSessionTimeout"), "1000")
      assert.strictEqual(yield* confValue(server.port, "maxSessionTimeout"), "30000")
      assert.strictEqual(yield* confValue(server.port, "dataDir"), path.join(server.dir, "data", "version-2"))
      if (existsSync("/usr/share/java/slf4j-simple.jar")) {
        assert.include(yield* server.logs, "Processing srvr command") // its log is captured
      }
      // it serves clients
      yield* zkCli(server.connectionString, "create", "/lockstep", "hello")
      assert.strictEqual(yield* zkGet(server.connectionString, "/lockstep"), "hello")
    }))

  it.scopedLive("options: tick time, session bounds and extra config reach zoo.cfg", () =>
    Effect.gen(function*() {
      const server = yield* ZooKeeperServer.make({
        tickTimeMs: 100,
        minSessionTimeoutMs: 500,
        maxSessionTimeoutMs: 8_000,
        extraConfig: { maxClientCnxns: "7" }
      })
      assert.strictEqual(yield* confValue(server.port, "tickTime"), "100")
      assert.strictEqual(yield* confValue(server.port, "minSessionTimeout"), "500")
      assert.strictEqual(yield* confValue(server.port, "maxSessionTimeout"), "8000")
      assert.strictEqual(yield* confValue(server.port, "maxClientCnxns"), "7")
      assert.include(readFileSync(path.join(server.dir, "zoo.cfg"), "utf8"), "maxClientCnxns=7\n")
    }))

  it.scopedLive("restart: same port, new process, the data is kept", () =>
    Effect.gen(function*() {
      const server = yield* ZooKeeperServer.make()
      const first = yield* pidOf(server)
      yield* zkCli(server.connectionString, "create", "/kept", "v1")

      yield* server.restart
      const second = yield* pidOf(server)
      assert.notStrictEqual(second, first)
      assert.isFalse(processExists(first))
      assert.strictEqual(yield* ruok(server.port), "answer: imok")
      assert.strictEqual(yield* server.mode, "standalone")
      assert.strictEqual(yield* zkGet(server.connectionString, "/kept"), "v1")
    }))

  it.scopedLive("pause: ruok gets no answer; resume: it answers again", () =>
    Effect.gen(function*() {
      const server = yield* ZooKeeperServer.make()
      yield* server.pause
      assert.isTrue(yield* server.isRunning)
      assert.strictEqual(yield* ruok(server.port, 500), "timeout")
      assert.strictEqual(yield* server.mode, "unknown")
      yield* server.resume
      assert.strictEqual(yield* ruok(server.port), "answer: imok")
      assert.strictEqual(yield* server.mode, "standalone")

      // restart also works on a paused server
      yield* server.pause
      yield* server.restart
      assert.strictEqual(yield* ruok(server.port), "answer: imok")
    }))

  it.scopedLive("kill: connection refused; restart: answers again on the same port with its data", () =>
    Effect.gen(function*() {
      const server = yield* ZooKeeperServer.make()
      const first = yield* pidOf(server)
      yield* zkCli(server.connectionString, "create", "/survivor", "still-here")

      yield* server.kill
      assert.isFalse(processExists(first))
      assert.isFalse(yield* server.isRunning)
      assert.isTrue(Option.isNone(yield* server.pid))
      assert.strictEqual(yield* ruok(server.port), "refused")
      assert.strictEqual(yield* server.mode, "unknown")
      yield* server.kill // idempotent

      yield* server.restart
      assert.notStrictEqual(yield* pidOf(server), first)
      assert.strictEqual(yield* ruok(server.port), "answer: imok")
      assert.strictEqual(yield* zkGet(server.connectionString, "/survivor"), "still-here")
    }))

  it.live("closing the scope ends the process (even paused), frees the port and removes the dir", () =>
    Effect.gen(function*() {
      const { dir, pid, port } = yield* Effect.scoped(
        Effect.gen(function*() {
          const server = yield* ZooKeeperServer.make()
          const pid = yield* pidOf(server)
          yield* server.pause
          return { dir: server.dir, pid, port: server.port }
        })
      )
      assert.isFalse(processExists(pid), `ZooKeeper ${pid} still exists`)
      assert.isTrue(yield* portFree(port), `port ${port} still bound`)
      assert.isFalse(existsSync(dir), `${dir} still exists`)
      assert.strictEqual(yield* ruok(port), "refused")
    }))

  it.scopedLive("failures are typed ZooKeeperServerErrors", () =>
    Effect.gen(function*() {
      const invalid = yield* Effect.either(ZooKeeperServer.make({ minSessionTimeoutMs: 5_000, maxSessionTimeoutMs: 1_000 }))
      assert.isTrue(Either.isLeft(invalid))
      if (Either.isLeft(invalid)) {
        assert.strictEqual(invalid.left._tag, "ZooKeeperServerError")
        assert.match(invalid.left.message, /minSessionTimeoutMs/)
      }

      const bad = yield* Effect.either(ZooKeeperServer.make({ extraConfig: { tickTime: "not-a-number" } }))
      assert.isTrue(Either.isLeft(bad))
      if (Either.isLeft(bad)) {
        assert.instanceOf(bad.left, ZooKeeperServer.ZooKeeperServerError)
        assert.match(bad.left.message, /exited \(exit code \d+\) before serving/)
        assert.match(bad.left.message, /Invalid config/) // the log tail names the problem
      }

      const tooSmall = yield* Effect.either(ZooKeeperServer.makeEnsemble({ size: 1 }))
      assert.isTrue(Either.isLeft(tooSmall) && /at least 2 members/.test(tooSmall.left.message))

      const server = yield* ZooKeeperServer.make()
      yield* server.kill
      const pause = yield* Effect.either(server.pause)
      assert.isTrue(Either.isLeft(pause) && /not running/.test(pause.left.message))
      const resume = yield* Effect.either(server.resume)
      assert.isTrue(Either.isLeft(resume) && /not running/.test(resume.left.message))
    }))

  it.live("ensemble of 3: one leader; killing it elects another; the old one rejoins as follower", () =>
    Effect.gen(function*() {
      const { pids, ports } = yield* Effect.scoped(
        Effect.gen(function*() {
          const started = Date.now()
          const ensemble = yield* ZooKeeperServer.makeEnsemble({ size: 3 })
          const startMs = Date.now() - started
          assert.isBelow(startMs, 20_000)
          const { members } = ensemble
          assert.deepStrictEqual(members.map((member) => member.id), [1, 2, 3])
          const ports = members.map((member) => member.port)
          assert.strictEqual(new Set(ports).size, 3)
          assert.strictEqual(ensemble.connectionString, ports.map((port) => `127.0.0.1:${port}`).join(","))
          for (const member of members) {
            assert.strictEqual(readFileSync(path.join(member.dir, "data", "myid"), "utf8").trim(), String(member.id))
            assert.strictEqual(yield* ruok(member.port), "answer: imok")
          }
          // every member serves, exactly one as leader (read with srvr, independently of the launcher)
          const modes = yield* Effect.forEach(members, (member) => srvrMode(member.port))
          assert.deepStrictEqual([...modes].sort(), ["follower", "follower", "leader"])
          const leader = yield* ensemble.leader
          assert.strictEqual(modes[members.indexOf(leader)], "leader")
          assert.strictEqual(yield* leader.mode, "leader")

          // a write through the leader is replicated to the followers
          yield* zkCli(leader.connectionString, "create", "/replicated", "r1")
          for (const member of members) {
            assert.strictEqual(yield* zkGet(member.connectionString, "/replicated"), "r1")
          }

          // kill the leader: one of the other two is elected. Measured here (tickTime 200,
          // cnxTimeout 500): about 0.4 s from the kill until a new leader serves.
          const oldPid = yield* pidOf(leader)
          const killedAt = Date.now()
          yield* leader.kill
          assert.isFalse(processExists(oldPid))
          const next = yield* ensemble.leader
          const electionMs = Date.now() - killedAt
          assert.notStrictEqual(next.id, leader.id)
          assert.strictEqual(yield* srvrMode(next.port), "leader")
          assert.isBelow(electionMs, 5_000, `re-election took ${electionMs} ms`)
          const others = members.filter((member) => member !== leader && member !== next)
          assert.strictEqual(others.length, 1)
          assert.strictEqual(yield* srvrMode(others[0]!.port), "follower")
          assert.strictEqual(yield* ruok(leader.port), "refused")
          yield* zkCli(next.connectionString, "create", "/after-failover", "r2")

          // the old leader comes back as a follower, with the data it had and what it missed
          yield* leader.restart
          assert.strictEqual(yield* srvrMode(leader.port), "follower")
          assert.strictEqual(yield* leader.mode, "follower")
          assert.strictEqual((yield* ensemble.leader).id, next.id)
          assert.strictEqual(yield* zkGet(leader.connectionString, "/replicated"), "r1")
          assert.strictEqual(yield* zkGet(leader.connectionString, "/after-failover"), "r2")

          const pids = yield* Effect.forEach(members, pidOf)
          assert.isTrue(pids.every(processExists))
          console.log(`ZooKeeper ensemble: started in ${startMs} ms, re-elected a leader in ${electionMs} ms`)
          return { pids, ports }
        })
      )
      for (const pid of pids) assert.isFalse(processExists(pid), `ZooKeeper ${pid} still exists`)
      for (const port of ports) assert.isTrue(yield* portFree(port), `port ${port} still bound`)
    }))

  it.scopedLive("ensemble: a paused leader is replaced; leader fails in time without a quorum", () =>
    Effect.gen(function*() {
      const ensemble = yield* ZooKeeperServer.makeEnsemble({ electionTimeout: "3 seconds" })
      const leader = yield* ensemble.leader
      yield* leader.pause
      // stopped once every thread of the JVM has taken the signal (on a loaded machine, not at
      // once): the process's state says so, and from then on its port answers nothing
      const pid = Option.getOrThrow(yield* leader.pid)
      yield* Effect.sync(() => readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0]).pipe(
        Effect.flatMap((state) => state === "T" ? Effect.void : Effect.fail(state)),
        Effect.retry(Schedule.spaced("20 millis")),
        Effect.timeout("5 seconds")
      )
      assert.strictEqual(yield* ruok(leader.port, 500), "timeout")
      const next = yield* ensemble.leader
      assert.notStrictEqual(next.id, leader.id)
      yield* leader.resume
      // the resumed old leader learns it lost and follows
      yield* Effect.flatMap(leader.mode, (mode) => mode === "follower" ? Effect.void : Effect.fail(mode)).pipe(
        Effect.retry(Schedule.spaced("100 millis")),
        Effect.timeout("10 seconds")
      )
      assert.strictEqual(yield* srvrMode(leader.port), "follower")

      // two of three down: no quorum, no leader, and `leader` says so within its timeout
      const survivor = ensemble.members.find((member) => member.id !== next.id)!
      for (const member of ensemble.members) {
        if (member !== survivor) yield* member.kill
      }
      assert.strictEqual(yield* survivor.mode, "unknown")
      const none = yield* Effect.either(ensemble.leader)
      assert.isTrue(Either.isLeft(none))
      if (Either.isLeft(none)) assert.match(none.left.message, /no single ZooKeeper leader within 3s/)
    }))

  it("no ZooKeeper process is left behind", () => {
    assert.deepStrictEqual(childZooKeeperServers(), [])
  })
})
