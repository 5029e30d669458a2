/**
 * Connection trouble under the Redis backend: an unreachable server (a dead port: nothing listens
 * on it), a bad URL, a password the server refuses, and a server killed while fibers are acquiring.
 * Errors must name the endpoint and the connection's own error, constructors that open their own
 * connections must fail fast (and close them), and an outage must be reported once, not once per
 * call, with nothing printed by ioredis itself.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Cause, ConfigProvider, Context, Effect, Exit, Fiber, Layer, Logger, Option } from "effect"
import { Redis } from "ioredis"
import type { RedisOptions } from "ioredis"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { AcquireRequest, Service } from "@lockstep/core/LockBackend"
import { BackendError } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import { backendOn, call, deadPort, eventually, fastTuning, nowMs, rawClient, retryWhileReconnecting, runnable, trapRejections, typedFailure, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis connection suite (connection.test.ts)")

const escaped = trapRejections()

/** A client the test owns, with quick retries and, like many applications, no 'error' listener. */
const ownClient = (url: string, options: RedisOptions = {}): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => new Redis(url, { maxRetriesPerRequest: 1, retryStrategy: () => 25, ...options })),
    (client) => Effect.sync(() => client.disconnect())
  )

let requests = 0
const request = (key: string): AcquireRequest => ({
  key,
  holder: `connection-test:${requests++}`,
  mode: "exclusive",
  permits: 1,
  limit: 1,
  leaseMs: 5_000,
  fair: false,
  waiterTtlMs: 5_000,
  count: 1
})

/** The typed failure of `exit`, which must be a BackendError. */
const backendErrorOf = <A, E>(exit: Exit.Exit<A, E>): BackendError => {
  const failure = typedFailure(exit)
  assert.isTrue(Option.isSome(failure), `expected a typed failure, got ${String(exit)}`)
  const error = Option.getOrThrow(failure)
  assert.instanceOf(error, BackendError, `expected BackendError, got ${String(error)}`)
  return error as BackendError
}

/** One line, no stack trace. */
const assertOneLine = (error: BackendError) => {
  assert.notInclude(error.message, "\n", `message on one line: ${JSON.stringify(error.message)}`)
  assert.notMatch(error.message, /\bat .+:\d+:\d+/, `no stack frame in the message: ${error.message}`)
}

/** Builds `layer`: its exit and how long it took. */
const build = (layer: Layer.Layer<LockBackend, unknown>) =>
  Effect.gen(function*() {
    const start = nowMs()
    const exit = yield* Effect.exit(Effect.scoped(Layer.build(layer)))
    return { exit, ms: nowMs() - start }
  })

/** The construction must fail within `withinMs` with BackendError(connect) whose message names all of `names`. */
const assertConnectFailure = (
  outcome: { readonly exit: Exit.Exit<unknown, unknown>; readonly ms: number },
  names: ReadonlyArray<string>,
  withinMs = 1_500
): BackendError => {
  const error = backendErrorOf(outcome.exit)
  assert.strictEqual(error.operation, "connect", error.message)
  for (const name of names) assert.include(error.message, name)
  assertOneLine(error)
  assert.isBelow(outcome.ms, withinMs, `failed fast: ${Math.round(outcome.ms)} ms (${error.message})`)
  return error
}

interface Logged {
  readonly level: string
  readonly message: string
}

/** Runs `effect` with a logger that records into `into` (and prints nothing). */
const capturingLogs = (into: Array<Logged>) =>
  Effect.provide(Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ logLevel, message }) => {
      into.push({ level: logLevel.label, message: (Array.isArray(message) ? message : [message]).map(String).join(" ") })
    })
  ))

/** Records what is written to stderr (console.error included) while the scope is open. */
const capturingStderr: Effect.Effect<Array<string>, never, Scope.Scope> = Effect.acquireRelease(
  Effect.sync(() => {
    const lines: Array<string> = []
    const write = process.stderr.write
    const consoleError = console.error
    process.stderr.write = ((chunk: string | Uint8Array, ...rest: Array<never>) => {
      lines.push(typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8"))
      return write.call(process.stderr, chunk, ...rest)
    }) as typeof process.stderr.write
    console.error = (...args: Array<unknown>) => {
      lines.push(args.map(String).join(" "))
    }
    return { lines, write, consoleError }
  }),
  ({ consoleError, write }) =>
    Effect.sync(() => {
      process.stderr.write = write
      console.error = consoleError
    })
).pipe(Effect.map(({ lines }) => lines))

describe.runIf(runnable)("Redis backend: unreachable servers and lost connections", () => {
  it.scopedLive("a call on a borrowed client to a dead port names the endpoint and the connection error", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const client = yield* ownClient(`redis://127.0.0.1:${port}`)
      const backend = yield* RedisBackend.make({ client, commandTimeout: "300 millis" })
      const error = backendErrorOf(yield* Effect.exit(backend.acquire(request("connection-dead"))))
      console.log(`[connection] dead port, borrowed client: ${error.message}`)
      assert.strictEqual(error.operation, "acquire")
      assert.include(error.message, `127.0.0.1:${port}`)
      assert.include(error.message, `connect ECONNREFUSED 127.0.0.1:${port}`)
      assert.instanceOf(error.cause, Error, "cause: what the call failed with")
      assertOneLine(error)
    }))

  it.scopedLive("a call to a paused server times out naming the endpoint", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const backend = yield* backendOn(server.url)
      yield* server.pause
      const error = backendErrorOf(yield* Effect.exit(backend.inspect("connection-paused")))
      yield* server.resume
      assert.include(error.message, `127.0.0.1:${server.port}`)
      assert.include(error.message, "no answer")
      assertOneLine(error)
    }))

  it.effect("layerFrom(url) on a dead port fails fast with BackendError(connect) naming the endpoint and cause", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const outcome = yield* build(RedisBackend.layerFrom(`redis://127.0.0.1:${port}`, { commandTimeout: "300 millis" }))
      const error = assertConnectFailure(outcome, [`127.0.0.1:${port}`, `connect ECONNREFUSED 127.0.0.1:${port}`])
      console.log(`[connection] layerFrom(url) on a dead port: ${error.message}`)
      assert.instanceOf(error.cause, Error)
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it.effect("layerFrom(options) and layerConfig on a dead port fail fast the same way", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const names = [`127.0.0.1:${port}`, `connect ECONNREFUSED 127.0.0.1:${port}`]
      assertConnectFailure(
        yield* build(RedisBackend.layerFrom({ host: "127.0.0.1", port, retryStrategy: () => 25 }, fastTuning)),
        names
      )
      // the default command timeout (2 s) is longer than ioredis needs to give up on the PING
      assertConnectFailure(yield* build(RedisBackend.layerFrom({ host: "127.0.0.1", port })), names)
      const fromConfig = RedisBackend.layerConfig(undefined, fastTuning).pipe(
        Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map([["REDIS_URL", `redis://127.0.0.1:${port}`]]))))
      )
      assertConnectFailure(yield* build(fromConfig), names)
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it.effect("layerFrom({ cluster }) on dead startup nodes fails within the command timeout, naming the nodes", () =>
    Effect.gen(function*() {
      const a = yield* deadPort
      const b = yield* deadPort
      const outcome = yield* build(RedisBackend.layerFrom(
        { cluster: [{ host: "127.0.0.1", port: a }, { host: "127.0.0.1", port: b }] },
        fastTuning
      ))
      // what ioredis reports: the refusals themselves stay inside its slot refresher
      const error = assertConnectFailure(outcome, [`127.0.0.1:${a}`, `127.0.0.1:${b}`, "Failed to refresh slots cache"])
      console.log(`[connection] layerFrom(cluster) on dead nodes: ${error.message}`)
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it.effect("a bad URL fails with a clear BackendError(connect), not a defect, and never shows the password", () =>
    Effect.gen(function*() {
      for (
        const url of [
          "not a url",
          "http://127.0.0.1:6379",
          "redis://127.0.0.1:99999",
          "redis://:hunter2@127.0.0.1:99999",
          "127.0.0.1:6379"
        ]
      ) {
        const outcome = yield* build(RedisBackend.layerFrom(url, fastTuning))
        const error = assertConnectFailure(outcome, ["invalid Redis URL"], 500)
        assert.notInclude(error.message, "hunter2")
        if (!url.includes("hunter2")) assert.include(error.message, JSON.stringify(url))
        console.log(`[connection] ${JSON.stringify(url)}: ${error.message}`)
      }
    }))

  it.effect("a password with '/', '@' or '&' in it, or given as a parameter, never reaches the message", () =>
    Effect.gen(function*() {
      for (
        const url of [
          "redis://:se/cr3t@127.0.0.1:99999/0",
          "redis://user:se@cr3t@127.0.0.1:99999/0",
          "redis://127.0.0.1:99999/0?password=se/cr3t",
          "redis+sentinel://:se/cr3t@127.0.0.1:1/locks",
          "redis+sentinel://127.0.0.1:99999/locks?sentinelPassword=se&cr3t"
        ]
      ) {
        const { exit } = yield* build(RedisBackend.layerFrom(url, { commandTimeout: "300 millis" }))
        assert.isTrue(Exit.isFailure(exit), url)
        // the whole failure, causes and all
        assert.notInclude(JSON.stringify(exit) + String(Exit.isFailure(exit) ? Cause.pretty(exit.cause) : ""), "cr3t", url)
      }
    }))

  it.scopedLive("a refused password fails layerFrom fast (NOAUTH, WRONGPASS) and closes its connections", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--requirepass", "secret"] })
      const admin = yield* rawClient(`redis://:secret@127.0.0.1:${server.port}`)
      const endpoint = `127.0.0.1:${server.port}`

      const noPassword = assertConnectFailure(yield* build(RedisBackend.layerFrom(server.url, fastTuning)), [
        endpoint,
        "NOAUTH"
      ])
      const wrongPassword = assertConnectFailure(
        yield* build(RedisBackend.layerFrom(`redis://:not-the-secret@127.0.0.1:${server.port}`, fastTuning)),
        [endpoint, "WRONGPASS"]
      )
      assert.notInclude(wrongPassword.message, "not-the-secret")
      console.log(`[connection] no password: ${noPassword.message}`)
      console.log(`[connection] wrong password: ${wrongPassword.message}`)

      // the failed layers closed what they opened: only the admin connection is left
      yield* eventually(
        "the refused connections to be closed",
        Effect.map(call(admin, "CLIENT", "LIST"), (list) => String(list).trim().split("\n").length === 1),
        2_000
      )

      // the right password works
      const backend = yield* backendOn(`redis://:secret@127.0.0.1:${server.port}`)
      const granted = yield* backend.acquire(request("connection-auth"))
      assert.strictEqual(granted._tag, "Granted")
    }).pipe(capturingLogs([])))

  it.scopedLive("layer({ client }) stays lazy: it builds on a dead port without a round trip", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const client = yield* ownClient(`redis://127.0.0.1:${port}`)
      client.on("error", () => undefined)
      const start = nowMs()
      const context = yield* Layer.build(RedisBackend.layer({ client, commandTimeout: "300 millis" }))
      assert.isBelow(nowMs() - start, 100)
      assert.isString(Context.get(context, LockBackend).clientId)
    }).pipe(capturingLogs([])))

  it.scopedLive("a borrowed client with no 'error' listener prints no \"[ioredis] Unhandled error event\"", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const stderr = yield* capturingStderr
      yield* Effect.scoped(Effect.gen(function*() {
        const client = yield* ownClient(`redis://127.0.0.1:${port}`)
        const backend = yield* RedisBackend.make({ client, commandTimeout: "300 millis" })
        backendErrorOf(yield* Effect.exit(backend.acquire(request("connection-stderr"))))
        // several reconnect attempts of both connections (every 25 ms)
        yield* Effect.sleep(300)
      }))
      const unhandled = stderr.filter((line) => line.includes("[ioredis] Unhandled error event"))
      assert.strictEqual(unhandled.length, 0, `printed:\n${unhandled.slice(0, 3).join("\n")}`)
    }).pipe(capturingLogs([])))

  it.scopedLive("a server killed under 10 acquiring fibers: 10 typed errors, the loss logged once per outage", () =>
    Effect.gen(function*() {
      const logs: Array<Logged> = []
      const server = yield* RedisServer.make()
      const endpoint = `127.0.0.1:${server.port}`
      const backend: Service = yield* backendOn(server.url).pipe(capturingLogs(logs))
      const lost = () => logs.filter((l) => l.level === "WARN" && l.message.includes(endpoint))
      const reconnected = () => logs.filter((l) => l.message.includes("reconnected") && l.message.includes(endpoint))
      const acquireAll = (round: string) =>
        Effect.forEach(
          Array.from({ length: 10 }, (_, i) => i),
          (i) => Effect.exit(backend.acquire(request(`connection-outage-${round}-${i}`))),
          { concurrency: "unbounded" }
        )

      assert.strictEqual((yield* backend.acquire(request("connection-outage-before")))._tag, "Granted")
      assert.strictEqual(lost().length, 0)

      for (const round of ["first", "second"]) {
        yield* server.kill
        const exits = yield* acquireAll(round)
        for (const exit of exits) {
          const error = backendErrorOf(exit)
          assert.include(error.message, endpoint)
          assertOneLine(error)
        }
        const messages = new Set(exits.map((exit) => backendErrorOf(exit).message))
        console.log(`[connection] ${round} outage, 10 acquires failed with: ${[...messages].join(" | ")}`)
        yield* Effect.sleep(200) // more reconnect attempts, more 'error' events: still one warning
        assert.strictEqual(lost().length, round === "first" ? 1 : 2, JSON.stringify(logs))
        // the cause, as the socket saw it: reset by the dying server, or refused once it is gone
        assert.match(lost()[lost().length - 1]!.message, /: (read ECONNRESET|connect ECONNREFUSED [\d.:]+);/, JSON.stringify(logs))

        yield* server.restart
        yield* eventually("the reconnection to be logged", Effect.sync(() => reconnected().length >= (round === "first" ? 1 : 2)), 5_000)
        const granted = yield* retryWhileReconnecting(backend.acquire(request(`connection-outage-after-${round}`)))
        assert.strictEqual(granted._tag, "Granted")
      }
      yield* Effect.sleep(100)
      assert.strictEqual(lost().length, 2, JSON.stringify(logs))
      assert.strictEqual(reconnected().length, 2, JSON.stringify(logs))
      console.log(`[connection] logged: ${logs.map((l) => `${l.level} ${l.message}`).join(" | ")}`)
    }))

  it.scopedLive("a waiter subscribing while the subscriber connection handshakes: no ready-check failure, no reconnect", () =>
    Effect.gen(function*() {
      // SUBSCRIBE may be written during the handshake (it may run while a server loads); with a
      // ready check, its INFO would then be refused in subscriber mode, which ioredis takes for a
      // fatal error (pending subscriptions failed, reconnect). A paused server holds the
      // subscriber connection in its handshake for as long as the test needs.
      const logs: Array<Logged> = []
      const server = yield* RedisServer.make()
      const client = yield* ownClient(server.url)
      yield* Effect.promise(() => client.ping())
      yield* server.pause
      const backend = yield* RedisBackend.make({ client, commandTimeout: "2 seconds" }).pipe(capturingLogs(logs))
      // the first waiter opens the subscriber connection
      const first = yield* Effect.fork(Effect.scoped(backend.subscribe("connection-handshake-first", "waiter-1", "exclusive")))
      yield* Effect.sleep(100) // the kernel accepted the connection: ioredis is in its handshake
      const second = yield* Effect.fork(Effect.scoped(backend.subscribe("connection-handshake", "waiter-2", "exclusive")))
      yield* Effect.sleep(100)
      yield* server.resume
      const exits = [yield* Fiber.await(first), yield* Fiber.await(second)]
      yield* Effect.sleep(300)
      for (const exit of exits) assert.isTrue(Exit.isSuccess(exit), `subscribe: ${String(exit)}`)
      assert.deepStrictEqual(logs.filter((l) => l.level === "WARN"), [])
    }))

  it.scopedLive("layer({ client }) on a dead port: withLock fails at the command timeout its message states", () =>
    Effect.gen(function*() {
      // a server that is down: nothing listens on its port until it is restarted
      const server = yield* RedisServer.make()
      yield* server.kill
      const port = server.port
      // an application's client with ioredis's defaults: it holds commands for ~10 s of retries
      const client = yield* Effect.acquireRelease(
        Effect.sync(() => new Redis(server.url)),
        (c) => Effect.sync(() => c.disconnect())
      )
      client.on("error", () => undefined)
      const context = yield* Layer.build(RedisBackend.layer({ client }))
      const lock = yield* Lock.make("connection-stated").pipe(Effect.provide(context))
      const start = nowMs()
      const exit = yield* Effect.exit(Lock.withLock(Effect.void, lock))
      const ms = nowMs() - start
      const error = backendErrorOf(exit)
      console.log(`[connection] layer({ client }) on a dead port: failed after ${Math.round(ms)} ms: ${error.message}`)
      assert.strictEqual(
        error.message,
        `lock backend failed during acquire on Redis 127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port} (no answer from Redis within 2s)`
      )
      // the attempt's clean-up (a release of what a lost reply may have granted) waits no second timeout
      assert.isAtLeast(ms, 1_900)
      assert.isBelow(ms, 2_600, `failed after ${Math.round(ms)} ms, the message says 2s`)

      // back: calls wait for their answers again
      yield* server.restart
      const ran = yield* retryWhileReconnecting(Lock.withLock(Effect.succeed("ran"), lock))
      assert.strictEqual(ran, "ran")
    }).pipe(capturingLogs([])))

  it.effect("connect errors name the connection's error, without ioredis's retry text, and the time they took", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const expected = `lock backend failed during connect on Redis 127.0.0.1:${port}: connect ECONNREFUSED 127.0.0.1:${port}`
      const fromUrl = yield* build(RedisBackend.layerFrom(`redis://127.0.0.1:${port}`))
      const fromConfig = yield* build(RedisBackend.layerConfig().pipe(
        Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map([["REDIS_URL", `redis://127.0.0.1:${port}`]]))))
      ))
      for (const [what, outcome] of [["layerFrom(url)", fromUrl], ["layerConfig", fromConfig]] as const) {
        const error = backendErrorOf(outcome.exit)
        console.log(`[connection] ${what} on a dead port: failed after ${Math.round(outcome.ms)} ms: ${error.message}`)
        assert.strictEqual(error.message, expected, what)
        assert.isBelow(outcome.ms, 1_500, what)
      }
      // a client that never gives up on a command: the PING's own timeout, as stated
      const patient = yield* build(RedisBackend.layerFrom({ host: "127.0.0.1", port, maxRetriesPerRequest: null }))
      const error = backendErrorOf(patient.exit)
      console.log(`[connection] layerFrom({ maxRetriesPerRequest: null }) on a dead port: failed after ${Math.round(patient.ms)} ms: ${error.message}`)
      assert.strictEqual(error.message, `${expected} (no answer from Redis within 2s)`)
      assert.isBelow(patient.ms, 2_600)
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it("nothing escaped as an unhandled rejection", () => {
    assert.deepStrictEqual(escaped, [])
  })
})
