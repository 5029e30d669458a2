/**
 * The Redis backend on a Redis configured as managed services ship it: commands renamed or
 * disabled (`rename-command X ""`) and a small `maxclients`. Every test starts its own
 * redis-server (never the shared 6379). The commands lockstep never sends leave it working (every
 * lock kind, a waiter woken by a release, a watchdog renewal, a latch), through `layerFrom` and
 * through `layer({ client })`; a command it needs fails the build with one line naming it; a
 * connection refused at the client limit says so.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Option } from "effect"
import { Redis } from "ioredis"
import type { RedisOptions } from "ioredis"
import { CountDownLatch, FairLock, Lock, ReadWriteLock, Semaphore } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import type { BackendError } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import * as RedisMock from "@lockstep/testkit/RedisMock"
import { probeCommands, probedCommands } from "../src/internal/commands.js"
import { errorDetail } from "../src/internal/descriptions.js"
import { track } from "../src/internal/tracker.js"
import { call, counted, eventually, rawClient, runnable, typedFailure, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis managed-restrictions suite (managed.test.ts)")

const tuning: RedisBackend.Tuning = { commandTimeout: "5 seconds" }

/** `rename-command X ""` for each of `commands`, as redis-server arguments. */
const disabling = (commands: ReadonlyArray<string>): ReadonlyArray<string> => commands.flatMap((c) => ["--rename-command", c, ""])

/** A server with `commands` disabled. */
const serverWithout = (commands: ReadonlyArray<string>, args: ReadonlyArray<string> = []) =>
  Effect.orDie(RedisServer.make({ args: [...disabling(commands), ...args] }))

/** A client of the test's own (the `layer({ client })` path), closed with the scope. */
const borrowed = (url: string, options: RedisOptions = {}): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const client = new Redis(url, { maxRetriesPerRequest: 2, ...options })
      client.on("error", () => undefined)
      return client
    }),
    (client) => Effect.sync(() => client.disconnect())
  )

/** The two ways to build the backend: on its own connection, and on a borrowed client. */
const layers = (url: string) => ({
  layerFrom: Effect.succeed(RedisBackend.layerFrom(url, tuning)),
  "layer({ client })": Effect.map(borrowed(url), (client) => RedisBackend.layer({ client, ...tuning }))
})

const ready = <A>(deferred: Deferred.Deferred<A>) => Deferred.await(deferred)

/**
 * Every lock kind acquired and released, a waiter woken by a release (its retry would come only
 * after 30 s), a watchdog renewal (watchdog 1.5 s: a renewal every 0.5 s, the lease held 2.5 s),
 * and a latch counted down to its waiter. Returns the renewals the backend was asked for.
 */
const workload = (backend: Service) =>
  Effect.gen(function*() {
    const { calls, service } = counted(backend)
    const run = withBackend(service)
    const lease = { lease: "30 seconds", waiterTimeout: "30 seconds" } as const

    // every lock kind, acquired and released
    const lock = yield* run(Lock.make("managed:lock", lease))
    assert.isTrue(yield* run(Lock.withLock(Effect.succeed(true), lock)))
    const fair = yield* run(FairLock.make("managed:fair", lease))
    assert.isTrue(yield* run(Lock.withLock(Effect.succeed(true), fair)))
    const rw = yield* run(ReadWriteLock.make("managed:rw", lease))
    assert.isTrue(yield* run(Lock.withLock(Effect.succeed(true), rw.write)))
    assert.isTrue(yield* run(Lock.withLock(Effect.succeed(true), rw.read)))
    const semaphore = yield* run(Semaphore.make("managed:semaphore", { ...lease, limit: 2 }))
    assert.isTrue(yield* run(Semaphore.withPermits(Effect.succeed(true), semaphore, { permits: 2 })))
    assert.isTrue(Option.isSome(yield* run(Effect.scoped(Lock.tryAcquire(lock)))))

    // a waiter woken by the release (a different fiber: re-entrancy is per fiber)
    const holding = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.fork(run(Lock.withLock(Effect.zipRight(Deferred.succeed(holding, undefined), ready(release)), lock)))
    yield* ready(holding)
    const waiter = yield* Effect.fork(run(Effect.scoped(Effect.gen(function*() {
      const other = yield* Lock.make("managed:lock", lease)
      yield* Lock.acquire(other, { timeout: "20 seconds" })
      return performance.now()
    }))))
    yield* Effect.sleep("300 millis")
    const released = performance.now()
    yield* Deferred.succeed(release, undefined)
    yield* Fiber.join(holder)
    const granted = yield* Fiber.join(waiter)
    assert.isBelow(granted - released, 10_000, "the waiter was not woken by the release")

    // a watchdog renewal
    const renewedBefore = calls.renew
    const watched = yield* run(Lock.make("managed:watchdog", { watchdog: "1500 millis" }))
    yield* run(Effect.scoped(Effect.gen(function*() {
      const held = yield* Lock.acquire(watched)
      yield* Effect.sleep("2500 millis")
      assert.strictEqual(yield* held.state, "Held")
      assert.isAbove(Duration.toMillis(yield* held.expiresIn), 0)
    })))
    assert.isAtLeast(calls.renew - renewedBefore, 1, "the watchdog renewed nothing")

    // a latch
    const latch = yield* run(CountDownLatch.make("managed:latch"))
    assert.isTrue(yield* run(CountDownLatch.trySetCount(latch, 1)))
    const awaiting = yield* Effect.fork(run(CountDownLatch.await(latch, { timeout: "20 seconds" })))
    yield* Effect.sleep("100 millis")
    assert.strictEqual(yield* run(CountDownLatch.countDown(latch)), 0)
    yield* Fiber.join(awaiting)
    return calls.renew - renewedBefore
  })

/** Builds `layer` in its own scope and runs `use` on the backend. */
const on = <A, E>(layer: Layer.Layer<LockBackend, BackendError>, use: (backend: Service) => Effect.Effect<A, E>) =>
  Effect.scoped(Effect.flatMap(Layer.build(layer), (context) => use(Context.get(context, LockBackend))))

/** `message` is exactly one line: the build failed on the server, naming what it refuses. */
const refusal = (what: string) =>
  new RegExp(
    `^lock backend failed during connect on Redis 127\\.0\\.0\\.1:\\d+: the server refuses ${what} \\(renamed or disabled\\), which lockstep needs [^\\n]+$`
  )

/** Where the server counts its clients. */
const connectedClients = (raw: Redis) =>
  Effect.map(call(raw, "INFO", "clients"), (info) => Number(/connected_clients:(\d+)/.exec(String(info))?.[1] ?? NaN))

describe("the words for refused commands and connections", () => {
  it("an unknown command (Redis 7, 6, older, and a ready check's) is named with what lockstep needs it for", () => {
    const named = "the server refuses EVALSHA (renamed or disabled), which lockstep needs to run its scripts"
    const reply = (message: string) => Object.assign(new Error(message), { name: "ReplyError" })
    assert.strictEqual(errorDetail(reply("ERR unknown command 'evalsha', with args beginning with: 'abc' '1' ")), named)
    assert.strictEqual(errorDetail(reply("ERR unknown command `evalsha`, with args beginning with: ")), named)
    assert.strictEqual(errorDetail(reply("ERR unknown command 'evalsha'")), named)
    assert.match(
      errorDetail(new Error("Ready check failed: ERR unknown command 'info', with args beginning with: ")),
      /^the server refuses INFO \(renamed or disabled\), which lockstep needs for the connection's ready check/
    )
    // a command lockstep does not need is named as it is
    assert.strictEqual(errorDetail(reply("ERR unknown command 'flushall'")), "the server refuses FLUSHALL (renamed or disabled)")
    // other errors keep their words
    assert.strictEqual(errorDetail(reply("ERR wrong number of arguments for 'evalsha' command")), "ERR wrong number of arguments for 'evalsha' command")
  })

  it("Redis's refusal at its client limit names maxclients", () => {
    for (const message of ["ERR max number of clients reached", "Ready check failed: ERR max number of clients reached"]) {
      assert.match(errorDetail(new Error(message)), /^the server refused the connection: it has reached its client limit \(maxclients; ERR max number of clients reached\)/)
    }
  })

  it.scoped("the probe names the commands it asks for, and passes on a mock client (ioredis-mock renames nothing)", () =>
    Effect.gen(function*() {
      const client = yield* RedisMock.client
      assert.deepStrictEqual(probedCommands(client, { replication: true }), ["EVALSHA", "EVAL", "SUBSCRIBE", "WAIT"])
      const tracker = yield* track(client, tuning)
      yield* probeCommands(client, tracker, { replication: true, reachable: true })
    }))
})

describe.runIf(runnable)("Redis backend on managed Redis: disabled commands and connection limits", () => {
  // none of these is sent by the backend (CLIENT: ioredis's own CLIENT SETINFO and SETNAME, whose
  // refusal it ignores); PING neither: building the layer checks the commands it needs instead
  const unneeded = ["CONFIG", "DEBUG", "SCRIPT", "CLIENT", "FUNCTION", "KEYS", "PING"] as const
  for (const disabled of [...unneeded.map((c) => [c]), [...unneeded]]) {
    it.scopedLive(`without ${disabled.join(", ")}: every lock kind, a woken waiter, a renewal and a latch, through both layers`, () =>
      Effect.gen(function*() {
        const server = yield* serverWithout(disabled)
        for (const [name, make] of Object.entries(layers(server.url))) {
          const renewals = yield* on(yield* make, workload).pipe(
            Effect.catchAll((error) => Effect.dieMessage(`${name}: ${error.message}`))
          )
          assert.isAtLeast(renewals, 1, name)
        }
      }), 60_000)
  }

  const needed: ReadonlyArray<{
    readonly command: string
    readonly tuning?: RedisBackend.Tuning
    readonly path?: string
  }> = [
    { command: "EVALSHA" },
    { command: "EVAL" },
    { command: "SUBSCRIBE" },
    { command: "INFO" },
    { command: "SELECT", path: "/1" },
    { command: "WAIT", tuning: { replication: { replicas: 1 } } },
    { command: "COMMAND", tuning: { replication: { replicas: 1, aof: true } } }
  ]
  for (const { command, path, tuning: extra } of needed) {
    it.scopedLive(`without ${command}, which it needs: building the layer fails with one line naming it`, () =>
      Effect.gen(function*() {
        const server = yield* serverWithout([command])
        const url = `${server.url}${path ?? ""}`
        const error = yield* Effect.flip(on(RedisBackend.layerFrom(url, { ...tuning, ...extra }), () => Effect.void))
        console.log(`[managed] without ${command}: ${error.message}`)
        assert.strictEqual(error._tag, "BackendError")
        assert.strictEqual(error.operation, "connect")
        assert.match(error.message, refusal(command))
        // on a client of the user's own, the probe says the same (COMMAND is asked only by
        // `replication.aof`'s own check, which the build runs on any client)
        const client = yield* borrowed(url)
        const tracker = yield* track(client, tuning)
        if (command !== "COMMAND") {
          const probed = yield* Effect.flip(probeCommands(client, tracker, { replication: extra !== undefined, reachable: false }))
          assert.match(probed.message, refusal(command))
        }
        // and the backend built on it fails its build with the same line
        const built = yield* Effect.flip(on(RedisBackend.layer({ client, ...tuning, ...extra }), () => Effect.void))
        assert.strictEqual(built.operation, "connect")
        assert.match(built.message, refusal(command))
      }), 60_000)
  }

  it.scopedLive("every command it needs refused at once: one line names them all", () =>
    Effect.gen(function*() {
      const server = yield* serverWithout(["EVALSHA", "EVAL", "SUBSCRIBE", "WAIT", "SELECT"])
      const error = yield* Effect.flip(
        on(RedisBackend.layerFrom(`${server.url}/2`, { ...tuning, replication: { replicas: 1 } }), () => Effect.void)
      )
      assert.match(error.message, refusal("EVALSHA, EVAL, SUBSCRIBE, WAIT, SELECT"))
    }), 60_000)

  it.scopedLive("at the client limit, building the layer fails naming maxclients", () =>
    Effect.gen(function*() {
      const server = yield* Effect.orDie(RedisServer.make({ args: ["--maxclients", "2"] }))
      const raw = yield* rawClient(server.url)
      yield* rawClient(server.url).pipe(Effect.tap((other) => call(other, "PING")))
      yield* eventually("two clients connected", Effect.map(connectedClients(raw), (n) => n === 2), 10_000)
      const error = yield* Effect.flip(on(RedisBackend.layerFrom(server.url, tuning), () => Effect.void))
      console.log(`[managed] at maxclients, layerFrom: ${error.message}`)
      assert.strictEqual(error.operation, "connect")
      assert.match(
        error.message,
        /^lock backend failed during connect on Redis 127\.0\.0\.1:\d+: the server refused the connection: it has reached its client limit \(maxclients; ERR max number of clients reached\)/
      )
      assert.notMatch(error.message, /no answer|EPIPE/)
    }), 60_000)

  it.scopedLive("at the client limit, the first waiter's subscriber connection is refused naming maxclients", () =>
    Effect.gen(function*() {
      const server = yield* Effect.orDie(RedisServer.make({ args: ["--maxclients", "2"] }))
      const raw = yield* rawClient(server.url)
      yield* eventually("one client connected", Effect.map(connectedClients(raw), (n) => n === 1), 10_000)
      const failure = yield* on(RedisBackend.layerFrom(server.url, tuning), (backend) =>
        withBackend(backend)(Effect.gen(function*() {
          // the backend's commands connection is the second client: nothing is left for a third
          const lock = yield* Lock.make("managed:limit", { lease: "30 seconds" })
          const held = yield* Effect.scoped(Lock.tryAcquire(lock))
          assert.isTrue(Option.isSome(held))
          return yield* Effect.scoped(Effect.gen(function*() {
            yield* Lock.acquire(lock, { timeout: "10 seconds" })
            const waiter = yield* Effect.fork(Effect.scoped(Effect.flatMap(
              Lock.make("managed:limit", { lease: "30 seconds" }),
              (other) => Lock.acquire(other, { timeout: "20 seconds" })
            )))
            return yield* Fiber.await(waiter)
          }))
        })))
      const error = typedFailure(failure)
      assert.isTrue(Option.isSome(error), `the waiter did not fail: ${Exit.isSuccess(failure) ? "granted" : String(failure.cause)}`)
      const message = (error as Option.Some<{ readonly message: string }>).value.message
      console.log(`[managed] at maxclients, the subscriber: ${message}`)
      assert.match(
        message,
        /^lock backend failed during subscribe on Redis 127\.0\.0\.1:\d+: the server refused the connection: it has reached its client limit \(maxclients/
      )
    }), 60_000)

  it.scopedLive("at the client limit, the acknowledged connection is refused naming maxclients", () =>
    Effect.gen(function*() {
      const server = yield* Effect.orDie(RedisServer.make({ args: ["--maxclients", "2"] }))
      const raw = yield* rawClient(server.url)
      yield* eventually("one client connected", Effect.map(connectedClients(raw), (n) => n === 1), 10_000)
      const error = yield* on(
        RedisBackend.layerFrom(server.url, { ...tuning, replication: { replicas: 1, timeout: "100 millis" } }),
        (backend) => Effect.flip(withBackend(backend)(Effect.scoped(Effect.flatMap(Lock.make("managed:acknowledged"), Lock.tryAcquire))))
      )
      console.log(`[managed] at maxclients, the acknowledged connection: ${error.message}`)
      assert.strictEqual(error._tag, "BackendError")
      assert.match(
        error.message,
        /^lock backend failed during acquire on Redis 127\.0\.0\.1:\d+: the server refused the connection: it has reached its client limit \(maxclients/
      )
    }), 60_000)
})
