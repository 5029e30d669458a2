/**
 * The Redis backend over TLS, against `redis-server` processes that speak TLS only (no plaintext
 * port) with a throwaway CA: a single server and a cluster grant, release and wake a waiter (its
 * subscription goes over TLS too); a certificate the client cannot trust (no CA given, or a
 * certificate for another host) fails the layer at once with one line naming the server and the
 * TLS problem.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Scope , Exit} from "effect"
import { Cause, Context, Deferred, Effect, Fiber, Layer, Logger, Option } from "effect"
import { Redis } from "ioredis"
import type { RedisOptions } from "ioredis"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { RedisSentinel, RedisServer } from "@lockstep/servers"
import { eventually, nowMs, runnable, trapRejections, typedFailure, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis TLS suite (tls.test.ts)")

const escaped = trapRejections()

/** The options of a TLS connection to `server`, trusting its CA. */
const trusting = (server: RedisServer.RedisServer): RedisOptions => ({
  host: server.host,
  port: server.port,
  tls: { ca: server.ca ?? "" }
})

/** A backend on its own connections, closed with the scope. */
const backendFrom = (
  connection: RedisBackend.Connection,
  tuning: RedisBackend.Tuning = {}
): Effect.Effect<Service, BackendError, Scope.Scope> =>
  Effect.map(Layer.build(RedisBackend.layerFrom(connection, { commandTimeout: "2 seconds", ...tuning })), Context.get(LockBackend))

/** A plain ioredis client of the test's own over TLS (probing the server), closed with the scope. */
const probeClient = (server: RedisServer.RedisServer): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const client = new Redis({ ...trusting(server), maxRetriesPerRequest: 1 })
      client.on("error", () => undefined)
      return client
    }),
    (client) => Effect.sync(() => client.disconnect())
  )

/** How many connections of `server` hold a subscription (CLIENT LIST: `sub=` or `psub=` above 0). */
const subscribers = (client: Redis): Effect.Effect<number> =>
  Effect.map(
    Effect.promise(() => client.call("CLIENT", "LIST") as Promise<string>),
    (list) => list.split("\n").filter((line) => /\b(?:sub|psub|ssub)=[1-9]/.test(line)).length
  )

/**
 * On `holderBackend`, takes `key` and keeps it; on `waiterBackend`, a waiter asks for it and
 * waits (subscribed: `subscribed` says when); the holder releases; the waiter must get the lock
 * promptly (leases are 30 s: nothing but the release can let it in). Returns the waiter's wait
 * after the release.
 */
const handOver = (
  key: string,
  holderBackend: Service,
  waiterBackend: Service,
  subscribed: Effect.Effect<boolean>
): Effect.Effect<number, unknown> =>
  Effect.gen(function*() {
    const holderLock = yield* Effect.provideService(Lock.make(key, { lease: "30 seconds" }), LockBackend, holderBackend)
    const waiterLock = yield* Effect.provideService(Lock.make(key, { lease: "30 seconds" }), LockBackend, waiterBackend)
    const held = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.fork(
      Lock.withLock(Effect.zipRight(Deferred.succeed(held, undefined), Deferred.await(release)), holderLock)
    )
    yield* Deferred.await(held)
    const waiter = yield* Effect.fork(Lock.withLock(Effect.sync(nowMs), waiterLock, { timeout: "10 seconds" }))
    yield* eventually("the waiter's subscription", subscribed, 5_000)
    assert.isNull(yield* Fiber.poll(waiter).pipe(Effect.map(Option.getOrNull)), "the waiter waits while the lock is held")
    const releasedAt = nowMs()
    yield* Deferred.succeed(release, undefined)
    yield* Fiber.join(holder)
    const grantedAt = yield* Fiber.join(waiter)
    return grantedAt - releasedAt
  })

/** The typed failure of `exit`, which must be a BackendError of operation "connect" on one line. */
const connectFailure = <A, E>(exit: Exit.Exit<A, E>): BackendError => {
  const failure = typedFailure(exit)
  assert.isTrue(Option.isSome(failure), `expected a typed failure, got ${String(exit)}`)
  const error = Option.getOrThrow(failure)
  assert.instanceOf(error, BackendError, `expected BackendError, got ${String(error)}`)
  const backendError = error as BackendError
  assert.strictEqual(backendError.operation, "connect", backendError.message)
  assert.notInclude(backendError.message, "\n", `one line: ${JSON.stringify(backendError.message)}`)
  return backendError
}

/** Builds `layer` and returns its exit and how long it took. */
const build = (layer: Layer.Layer<LockBackend, BackendError>) =>
  Effect.gen(function*() {
    const start = nowMs()
    const exit = yield* Effect.exit(Effect.scoped(Layer.build(layer)))
    return { exit, ms: nowMs() - start }
  })

describe.runIf(runnable)("Redis backend over TLS", () => {
  it.scopedLive("a single TLS server: acquire, release, and a waiter on another backend woken by the release", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: true })
      assert.match(server.url, /^rediss:\/\/127\.0\.0\.1:\d+$/)
      assert.include(server.ca ?? "", "-----BEGIN CERTIFICATE-----")
      const a = yield* backendFrom(trusting(server))
      const b = yield* backendFrom(trusting(server))
      const lock = yield* Effect.provideService(Lock.make("tls:single"), LockBackend, a)
      const fence = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
      assert.isAbove(fence, 0)
      assert.isFalse(yield* Effect.provideService(Lock.isLocked(lock), LockBackend, a), "released")
      const probe = yield* probeClient(server)
      const waited = yield* handOver("tls:single:handover", a, b, Effect.map(subscribers(probe), (n) => n > 0))
      assert.isBelow(waited, 1_000, `the waiter got the lock ${Math.round(waited)} ms after the release`)
      assert.deepStrictEqual(escaped, [])
    }))

  it.scopedLive("a rediss:// URL with ioredis options: the CA and the key prefix the URL has no place for", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: true })
      const ca = server.ca ?? ""
      const a = yield* backendFrom({ url: server.url, options: { tls: { ca }, keyPrefix: "ns:" } })
      const b = yield* backendFrom({ url: server.url, options: { tls: { ca }, keyPrefix: "ns:" } })
      const lock = yield* Effect.provideService(Lock.make("tls:url"), LockBackend, a)
      const probe = yield* probeClient(server)
      yield* Lock.withLock(
        Effect.gen(function*() {
          // the key lives under the prefix the options gave
          const keys = yield* Effect.promise(() => probe.keys("*tls:url*"))
          assert.isNotEmpty(keys)
          for (const key of keys) assert.isTrue(key.startsWith("ns:"), `${key} is in the namespace`)
        }),
        lock
      )
      const waited = yield* handOver("tls:url:handover", a, b, Effect.map(subscribers(probe), (n) => n > 0))
      assert.isBelow(waited, 1_000, `the waiter got the lock ${Math.round(waited)} ms after the release`)
      // the same URL without the CA is refused at once
      const { exit, ms } = yield* build(RedisBackend.layerFrom({ url: server.url, options: { keyPrefix: "ns:" } }))
        .pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
      assert.include(connectFailure(exit).message, "self-signed certificate")
      assert.isBelow(ms, 1_000, `failed at once: ${Math.round(ms)} ms`)
      assert.deepStrictEqual(escaped, [])
    }), 30_000)

  it.scopedLive("a TLS cluster (TLS bus too): grants, releases and wakes a waiter", () =>
    Effect.gen(function*() {
      const certificates = yield* RedisServer.makeCertificates()
      const cluster = yield* RedisServer.makeCluster({ tls: certificates })
      for (const node of cluster.nodes) assert.match(node.url, /^rediss:\/\//)
      const connection: RedisBackend.Connection = {
        cluster: cluster.startupNodes,
        options: { redisOptions: { tls: { ca: certificates.ca } } }
      }
      const a = yield* backendFrom(connection)
      const b = yield* backendFrom(connection)
      const lock = yield* Effect.provideService(Lock.make("tls:cluster"), LockBackend, a)
      assert.isAbove(yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock), 0)
      const probes = yield* Effect.forEach(cluster.nodes, probeClient)
      const subscribed = Effect.map(Effect.forEach(probes, subscribers), (counts) => counts.some((n) => n > 0))
      const waited = yield* handOver("tls:cluster:handover", a, b, subscribed)
      assert.isBelow(waited, 1_000, `the waiter got the lock ${Math.round(waited)} ms after the release`)
      // without the CA: the nodes' certificates are refused, at once
      const { exit, ms } = yield* build(
        RedisBackend.layerFrom({ cluster: cluster.startupNodes, options: { redisOptions: { tls: {} } } })
      ).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
      const error = connectFailure(exit)
      console.log(`[tls] cluster without the CA: ${error.message}`)
      assert.include(error.message, `127.0.0.1:${cluster.nodes[0]!.port}`)
      assert.include(error.message, "self-signed certificate in certificate chain")
      assert.isBelow(ms, 1_000, `failed at once: ${Math.round(ms)} ms`)
      assert.deepStrictEqual(escaped, [])
    }), 30_000)

  it.scopedLive("a TLS Sentinel topology (sentinels, data nodes and replication over TLS), replica acknowledgement and quarantine off: grants, releases and wakes a waiter", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make({ tls: true, replicas: 1, sentinels: 1, quorum: 1 })
      const ca = topology.ca ?? ""
      assert.include(ca, "-----BEGIN CERTIFICATE-----")
      const connection: RedisBackend.Connection = {
        sentinels: topology.sentinelAddresses.map((address) => ({ ...address })),
        name: topology.name,
        tls: { ca },
        sentinelTLS: { ca },
        enableTLSForSentinelMode: true
      }
      // TLS is what this is about: the quarantine (on by default through sentinels) would hold the
      // first grant for 30 s, and replica acknowledgement is another matter
      const off: RedisBackend.Tuning = { replication: false, quarantine: false }
      const a = yield* backendFrom(connection, off)
      const b = yield* backendFrom(connection, off)
      const lock = yield* Effect.provideService(Lock.make("tls:sentinel"), LockBackend, a)
      assert.isAbove(yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock), 0)
      const probe = yield* probeClient(topology.primary)
      const waited = yield* handOver("tls:sentinel:handover", a, b, Effect.map(subscribers(probe), (n) => n > 0))
      assert.isBelow(waited, 1_000, `the waiter got the lock ${Math.round(waited)} ms after the release`)
      // the URL with the CA in ioredis options
      const sentinel = topology.sentinelAddresses[0]!
      const url = `rediss+sentinel://${sentinel.host}:${sentinel.port}/${topology.name}`
      const c = yield* backendFrom({ url, options: { tls: { ca }, sentinelTLS: { ca } } }, off)
      const onC = yield* Effect.provideService(Lock.make("tls:sentinel:url"), LockBackend, c)
      assert.isAbove(yield* Lock.withLock((lease) => Effect.succeed(lease.fence), onC), 0)
      // rediss+sentinel:// alone trusts Node's default CAs only: this CA is none of them
      const { exit, ms } = yield* build(
        RedisBackend.layerFrom(`rediss+sentinel://${sentinel.host}:${sentinel.port}/${topology.name}`)
      ).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
      const error = connectFailure(exit)
      console.log(`[tls] rediss+sentinel:// without the CA: ${error.message}`)
      assert.include(error.message, `${sentinel.host}:${sentinel.port}`)
      assert.include(error.message, "self-signed certificate in certificate chain")
      assert.isBelow(ms, 1_000, `failed at once: ${Math.round(ms)} ms`)
      assert.deepStrictEqual(escaped, [])
    }), 30_000)

  it.scopedLive("no CA for a self-signed chain: the layer fails at once naming the server and the TLS problem", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: true })
      for (
        const layer of [
          RedisBackend.layerFrom(server.url),
          RedisBackend.layerFrom({ host: server.host, port: server.port, tls: {} }),
          // ioredis would retry for ever: a certificate no retry can fix fails the layer anyway
          RedisBackend.layerFrom({ host: server.host, port: server.port, tls: {}, maxRetriesPerRequest: null }, {
            commandTimeout: "5 seconds"
          })
        ]
      ) {
        const { exit, ms } = yield* build(layer)
        const error = connectFailure(exit)
        console.log(`[tls] untrusted CA: ${error.message}`)
        assert.include(error.message, `127.0.0.1:${server.port}`)
        assert.include(error.message, "self-signed certificate in certificate chain")
        assert.isBelow(ms, 1_000, `failed at once: ${Math.round(ms)} ms`)
      }
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it.scopedLive("a certificate for another host: the layer fails at once naming the server, the mismatch and the names", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: { altNames: ["other.example"] } })
      for (
        const layer of [
          RedisBackend.layerFrom(trusting(server)),
          RedisBackend.layerFrom({ ...trusting(server), maxRetriesPerRequest: null }, { commandTimeout: "5 seconds" })
        ]
      ) {
        const { exit, ms } = yield* build(layer)
        const error = connectFailure(exit)
        console.log(`[tls] certificate for another host: ${error.message}`)
        assert.include(error.message, `127.0.0.1:${server.port}`)
        assert.include(error.message, "Hostname/IP does not match certificate's altnames")
        assert.include(error.message, "DNS:other.example")
        // the error (and its cause, Node's TLS error) can be rendered and logged as any other
        assert.doesNotThrow(() => JSON.stringify(error))
        assert.doesNotThrow(() => JSON.stringify(error.cause))
        assert.include(Cause.pretty(Cause.fail(error)), "Hostname/IP does not match")
        assert.isBelow(ms, 1_000, `failed at once: ${Math.round(ms)} ms`)
      }
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))

  it.scopedLive("a refused connection (no TLS server there) still fails as before", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: true })
      yield* server.kill
      const { exit } = yield* build(RedisBackend.layerFrom(trusting(server), { commandTimeout: "300 millis" }))
      const error = connectFailure(exit)
      assert.include(error.message, `connect ECONNREFUSED 127.0.0.1:${server.port}`)
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))
})
