/**
 * The Redis backend on a Sentinel-managed master: real processes (a primary, 2 replicas and 3
 * sentinels from `RedisSentinel.make`), reached through `layerFrom` / `layerConfig` with ioredis
 * options and with the `redis+sentinel://` URL form. Covers the basic paths of every kind, a
 * planned failover (`SENTINEL FAILOVER`) and an unplanned one (the master killed) while a lock is
 * held and waiters wait, the errors of bad URLs and of sentinels that cannot help, and a process
 * that ends at once after its backend closed, also with a sentinel down.
 *
 * Across a failover the suite records every backend call (start, end, outcome) and every grant,
 * renewal and release (`History`): no two valid leases overlap, fences increase, and a release on
 * the new master wakes its waiter at once (without a wake-up, a waiter looks again only when the
 * holder's lease would run out). It prints the failover's duration, how soon the backends
 * followed, and the longest call.
 */
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { ConfigProvider, Context, Deferred, Effect, Either, Exit, Fiber, Layer, Logger, Option, Schedule } from "effect"
import { Redis } from "ioredis"
import type { RedisOptions } from "ioredis"
import { CountDownLatch, FairLock, Lock, ReadWriteLock, Semaphore } from "@lockstep/core"
import type { Lease } from "@lockstep/core/Lease"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { History } from "@lockstep/testkit"
import { RedisSentinel } from "@lockstep/servers"
import { runChild } from "../../core/test/fixtures/exitScenarios.js"
import { sentinelOptions } from "../src/internal/clients.js"
import { libraryName } from "../src/internal/scripts/library.js"
import { eventually, nowMs, runnable, trapRejections, typedFailure, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis Sentinel suite (sentinel.test.ts)")

const escaped = trapRejections()

// the exit of a whole process on a loaded 2-core machine took up to ~460 ms (as in exit.test.ts);
// the bound stays below the shortest timer this must catch when one is left (an idle channel's
// unsubscribe, 1 s; ioredis's sentinel and reconnect timers, 2 s)
const exitBoundMs = 800

/** `redis+sentinel://host:port,.../<name>` of a topology. */
const urlOf = (topology: RedisSentinel.RedisSentinel, path = ""): string =>
  `redis+sentinel://${topology.sentinelAddresses.map((a) => `${a.host}:${a.port}`).join(",")}/${topology.name}${path}`

/** The ioredis options of a topology. */
const optionsOf = (topology: RedisSentinel.RedisSentinel): RedisOptions => ({
  sentinels: topology.sentinelAddresses.map((a) => ({ host: a.host, port: a.port })),
  name: topology.name
})

/** A backend from `layer`, closed with the scope. */
const backendFrom = <E>(layer: Layer.Layer<LockBackend, E>): Effect.Effect<Service, E, Scope.Scope> =>
  Effect.map(Layer.build(layer), Context.get(LockBackend))

/** One backend call: when it was sent and answered (monotonic ms), and whether it succeeded. */
interface Timed {
  readonly op: string
  readonly start: number
  readonly end: number
  readonly ok: boolean
}

/** Wraps a backend so that every call it receives is timed. */
const timed = (backend: Service) => {
  const calls: Array<Timed> = []
  const time = <A, E, R>(op: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    Effect.suspend(() => {
      const start = nowMs()
      return Effect.onExit(effect, (exit) => Effect.sync(() => calls.push({ op, start, end: nowMs(), ok: Exit.isSuccess(exit) })))
    })
  const service: Service = {
    ...backend,
    acquire: (r) => time("acquire", backend.acquire(r)),
    release: (r) => time("release", backend.release(r)),
    renew: (r) => time("renew", backend.renew(r)),
    inspect: (k) => time("inspect", backend.inspect(k)),
    cancel: (r) => time("cancel", backend.cancel(r)),
    raiseFence: (r) => time("raiseFence", backend.raiseFence(r)),
    forceRelease: (r) => time("forceRelease", backend.forceRelease(r)),
    subscribe: (k, h, m) => time("subscribe", backend.subscribe(k, h, m))
  }
  return { service, calls }
}

/** The longest call that was in flight at some point in [from, to]. */
const longestCall = (calls: ReadonlyArray<Timed>, from: number, to: number): Timed | undefined =>
  calls
    .filter((c) => c.end >= from && c.start <= to)
    .reduce<Timed | undefined>((longest, c) => (longest === undefined || c.end - c.start > longest.end - longest.start ? c : longest), undefined)

const describeCall = (call: Timed | undefined): string =>
  call === undefined ? "none" : `${call.op} ${Math.round(call.end - call.start)} ms (${call.ok ? "ok" : "failed"})`

/** A raw connection to one data node, closed with the scope. */
const nodeClient = (node: RedisSentinel.Node): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const client = new Redis(node.url, { maxRetriesPerRequest: 1, lazyConnect: true })
      client.on("error", () => undefined)
      return client
    }),
    (client) => Effect.sync(() => client.disconnect())
  )

/** The client connections of a node other than the sentinels' own and replication links. */
const ourClients = (client: Redis): Effect.Effect<ReadonlyArray<string>> =>
  Effect.map(
    Effect.promise(() => client.call("CLIENT", "LIST") as Promise<string>),
    (list) =>
      list.trim().split("\n").filter((line) =>
        !/ name=sentinel-/.test(line) && !/ flags=[^ ]*[SM]/.test(line) && !/ cmd=client\|list /.test(line)
      )
  )

/** Whether a node has at least `count` of our subscriber connections (pub/sub with a channel). */
const subscribersOn = (client: Redis, count: number): Effect.Effect<boolean> =>
  Effect.map(ourClients(client), (lines) => lines.filter((line) => / sub=[1-9]/.test(line)).length >= count)

/** Calls of `command` (`INFO commandstats`) on a node. */
const callsOf = (client: Redis, command: string): Effect.Effect<number> =>
  Effect.map(
    Effect.promise(() => client.info("commandstats")),
    (info) => Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, "m").exec(info)?.[1] ?? 0)
  )

interface Grant {
  readonly waiter: number
  readonly fence: number
  readonly at: number
}

/**
 * A lock held on backend `holderBackend` by a fiber until `release` completes (or the lease is
 * lost), and `waiterBackends.length` waiters (one per backend given) queued behind it, each of
 * which holds for 50 ms once granted. Waiters retry on BackendError every 100 ms.
 */
const holdAndQueue = (
  key: string,
  options: Lock.Options,
  holderBackend: Service,
  waiterBackends: ReadonlyArray<Service>
) =>
  Effect.gen(function*() {
    const holderLock = yield* Lock.make(key, options).pipe(withBackend(holderBackend))
    const acquired = yield* Deferred.make<Lease>()
    const release = yield* Deferred.make<void>()
    let lostAt: number | undefined
    const holder = yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
      const lease = yield* Lock.acquire(holderLock)
      yield* Deferred.succeed(acquired, lease)
      yield* Effect.raceFirst(
        Deferred.await(release),
        Effect.tapError(lease.lost, () => Effect.sync(() => (lostAt = nowMs())))
      )
    })))
    const lease = yield* Deferred.await(acquired)
    const grants: Array<Grant> = []
    const waiters = yield* Effect.forEach(waiterBackends, (backend, waiter) =>
      Effect.gen(function*() {
        const lock = yield* Lock.make(key, options).pipe(withBackend(backend))
        return yield* Effect.fork(Effect.scoped(Effect.gen(function*() {
          const granted = yield* Lock.acquire(lock, { retry: Schedule.spaced("100 millis") })
          grants.push({ waiter, fence: granted.fence, at: nowMs() })
          yield* Effect.sleep(50)
        })))
      }))
    return { lease, release, holder, waiters, grants, lostAt: () => lostAt }
  })

describe("redis+sentinel:// URLs", () => {
  const parsed = (url: string) => Either.getOrThrowWith(sentinelOptions(url), (problem) => new Error(`${url}: ${problem}`))
  const problemOf = (url: string) => Either.match(sentinelOptions(url), { onLeft: (p) => p, onRight: () => "accepted" })

  it("reads sentinels, master name, database and credentials", () => {
    assert.deepStrictEqual(parsed("redis+sentinel://10.0.0.1:26380,10.0.0.2,[::1]:26381/orders"), {
      sentinels: [{ host: "10.0.0.1", port: 26380 }, { host: "10.0.0.2", port: 26379 }, { host: "::1", port: 26381 }],
      name: "orders"
    })
    assert.deepStrictEqual(
      parsed("redis+sentinel://app:p%40ss+word@s1.internal:26379/orders%2Fmain/3?sentinelUsername=watch&sentinelPassword=s%26p"),
      {
        sentinels: [{ host: "s1.internal", port: 26379 }],
        name: "orders/main",
        db: 3,
        username: "app",
        password: "p@ss+word",
        sentinelUsername: "watch",
        sentinelPassword: "s&p"
      }
    )
    assert.deepStrictEqual(parsed("redis+sentinel://:secret@h/m/"), {
      sentinels: [{ host: "h", port: 26379 }],
      name: "m",
      password: "secret"
    })
    assert.deepStrictEqual(parsed("REDISS+SENTINEL://h:1/m"), {
      sentinels: [{ host: "h", port: 1 }],
      name: "m",
      tls: {},
      sentinelTLS: {},
      enableTLSForSentinelMode: true
    })
  })

  it("names what is wrong with a malformed one", () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ["redis+sentinel://h1:26379", "no master name"],
      ["redis+sentinel://h1:26379/", "no master name"],
      ["redis+sentinel:///m", "no sentinel address"],
      ["redis+sentinel://h1,,h2/m", "empty sentinel address"],
      ["redis+sentinel://h1:99999/m", "port 99999 is out of range"],
      ["redis+sentinel://h1:0/m", "port 0 is out of range"],
      ["redis+sentinel://h1:x/m", "a sentinel address is no host[:port]"],
      ["redis+sentinel://h1/m/x", "the database must be a number"],
      ["redis+sentinel://h1/m/1/2", "the path must be /<master name>[/<db>]"],
      ["redis+sentinel://h1/m?password=x", "an unknown parameter"],
      ["redis+sentinel://h1/m#x", "fragment"],
      ["redis+sentinel://h1/%zz", "malformed master name"],
      ["redis+sentinel://u:%zz@h1/m", "malformed credentials"]
    ]
    for (const [url, problem] of cases) assert.include(problemOf(url), problem, url)
  })

  it.effect("layerFrom and layerConfig fail with one line that names the problem and never a password", () =>
    Effect.gen(function*() {
      const cases: ReadonlyArray<readonly [string, string]> = [
        [
          "redis+sentinel://app:hunter2@127.0.0.1:1,127.0.0.1:99999/m?sentinelPassword=hunter3",
          "invalid Redis Sentinel URL (port 99999 is out of range)"
        ],
        ["redis+sentinel://127.0.0.1:26379", "invalid Redis Sentinel URL (no master name"],
        // other clients' spellings of the scheme
        ["redis-sentinel://127.0.0.1:26379/m", "expected redis+sentinel://"],
        ["sentinel://127.0.0.1:26379/m", "expected redis+sentinel://"]
      ]
      for (const [url, expected] of cases) {
        for (const layer of [
          RedisBackend.layerFrom(url),
          RedisBackend.layerConfig().pipe(
            Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map([["REDIS_URL", url]]))))
          )
        ]) {
          const start = nowMs()
          const exit = yield* Effect.exit(Effect.scoped(Layer.build(layer)))
          const error = Option.getOrThrow(typedFailure(exit))
          assert.instanceOf(error, BackendError)
          const message = (error as BackendError).message
          assert.include(message, expected)
          assert.include(message, "lock backend failed during connect on Redis")
          assert.notInclude(message, "hunter")
          assert.notInclude(message, "\n")
          assert.isBelow(nowMs() - start, 200)
        }
      }
      const noSentinels = yield* Effect.exit(Effect.scoped(Layer.build(RedisBackend.layerFrom({ sentinels: [], name: "m" }))))
      assert.include(String(Option.getOrThrow(typedFailure(noSentinels))), "invalid Sentinel options (no sentinels)")
      const noName = yield* Effect.exit(
        Effect.scoped(Layer.build(RedisBackend.layerFrom({ sentinels: [{ host: "127.0.0.1", port: 26379 }] })))
      )
      assert.include(String(Option.getOrThrow(typedFailure(noName))), "no master name")
    }))

  it.effect("unreachable sentinels fail the layer within the command timeout, with one line naming them", () =>
    Effect.gen(function*() {
      for (
        const connection of [
          "redis+sentinel://:hunter2@127.0.0.1:1,127.0.0.1:2/orders",
          { sentinels: [{ host: "127.0.0.1", port: 1 }, { host: "127.0.0.1", port: 2 }], name: "orders", password: "hunter2" }
        ]
      ) {
        const start = nowMs()
        const exit = yield* Effect.exit(
          Effect.scoped(Layer.build(RedisBackend.layerFrom(connection, { commandTimeout: "500 millis" })))
        )
        const ms = nowMs() - start
        const error = Option.getOrThrow(typedFailure(exit)) as BackendError
        console.log(`[sentinel] unreachable sentinels: failed after ${Math.round(ms)} ms: ${error.message}`)
        assert.strictEqual(error.operation, "connect")
        assert.strictEqual(
          error.message,
          "lock backend failed during connect on Redis master \"orders\" via sentinels 127.0.0.1:1, 127.0.0.1:2: " +
            "no sentinel answered (no answer from Redis within 500ms)"
        )
        assert.isBelow(ms, 1_500)
      }
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))
})

/** Replica acknowledgement and the failover quarantine both off: what the tests below are not about. */
const off: RedisBackend.Tuning = { replication: false, quarantine: false }

/**
 * Two timed backends on `topology` with `off` (one through its URL, one through ioredis options),
 * each also recorded in a fresh `History` (`onA`, `onB`).
 */
const recordedPair = (topology: RedisSentinel.RedisSentinel) =>
  Effect.gen(function*() {
    const history = yield* History.make
    const a = timed(yield* backendFrom(RedisBackend.layerFrom(urlOf(topology), off)))
    const b = timed(yield* backendFrom(RedisBackend.layerFrom(optionsOf(topology), off)))
    return { history, a, b, onA: History.instrument(history, a.service), onB: History.instrument(history, b.service) }
  })

describe.runIf(runnable)("Redis backend through Sentinel", () => {
  // once with both off, and once with the defaults (through sentinels: every replica acknowledges
  // each grant, and the quarantine holds the first grant until the master has been up 30 s)
  for (
    const [label, tuning] of [
      ["with replication and quarantine off", off],
      ["with the defaults (the first grant waits out the quarantine, every grant acknowledged)", undefined]
    ] as const
  ) {
    it.scopedLive(`every kind works through sentinels (options, URL, layerConfig) ${label}; sentinel passwords; an unknown master name fails clearly`, () =>
      Effect.gen(function*() {
        const startedAt = nowMs()
        const topology = yield* RedisSentinel.make()
        const viaOptions = yield* backendFrom(RedisBackend.layerFrom(optionsOf(topology), tuning))
        const viaUrl = yield* backendFrom(RedisBackend.layerFrom(urlOf(topology), tuning))
        const viaConfig = yield* backendFrom(
          RedisBackend.layerConfig(undefined, tuning).pipe(
            Layer.provide(Layer.setConfigProvider(ConfigProvider.fromMap(new Map([["REDIS_URL", urlOf(topology)]]))))
          )
        )
        const master = yield* topology.master
        const raw = yield* nodeClient(master)
        const waitsBefore = yield* callsOf(raw, "wait")

        // Lock: a grant, re-entrancy with the same fence, and a hand-off across processes on a wake-up
        const lock = yield* Lock.make("sentinel-basic", { waiterTimeout: "20 seconds" }).pipe(withBackend(viaOptions))
        const other = yield* Lock.make("sentinel-basic", { waiterTimeout: "20 seconds" }).pipe(withBackend(viaConfig))
        const askedAt = nowMs()
        const fences = yield* Lock.withLock(
          (outer: Lease) => Effect.map(Lock.withLock((inner: Lease) => Effect.succeed(inner.fence), lock), (inner) => [outer.fence, inner] as const),
          lock
        )
        const grantedAt = nowMs()
        assert.strictEqual(fences[0], fences[1])
        if (tuning === undefined) {
          // the master started after `startedAt` and grants nothing before it has been up 30 s
          // (its uptime counts whole seconds)
          assert.isAtLeast(grantedAt - startedAt, 29_000, "the first grant waited out the quarantine")
        } else {
          assert.isBelow(grantedAt - askedAt, 15_000, "no quarantine held the first grant")
        }
        console.log(
          `[sentinel] ${label}: first grant ${Math.round(grantedAt - askedAt)} ms after it was asked, ` +
            `${Math.round(grantedAt - startedAt)} ms after the topology was started`
        )
        const held = yield* Deferred.make<void>()
        const releasedAt = yield* Deferred.make<number>()
        const first = yield* Effect.fork(
          Lock.withLock(Effect.zipRight(Deferred.succeed(held, undefined), Effect.sleep(300)), lock).pipe(
            Effect.zipRight(Effect.sync(() => nowMs())),
            Effect.tap((at) => Deferred.succeed(releasedAt, at))
          )
        )
        yield* Deferred.await(held)
        const second = yield* Effect.fork(Lock.withLock((lease: Lease) => Effect.sync(() => ({ fence: lease.fence, at: nowMs() })), other))
        yield* Fiber.join(first)
        const handedOff = yield* Fiber.join(second)
        const handOffMs = handedOff.at - (yield* Deferred.await(releasedAt))
        assert.isAbove(handedOff.fence, fences[0])
        assert.isBelow(handOffMs, 500, "woken by the release, not by a retry")
        // the database of the URL
        const inDb2 = yield* backendFrom(RedisBackend.layerFrom(urlOf(topology, "/2"), tuning))
        yield* Effect.scoped(Lock.acquire(yield* Lock.make("sentinel-db", { lease: "5 seconds" }).pipe(withBackend(inDb2))))
        yield* Effect.promise(() => raw.select(2))
        assert.strictEqual(yield* Effect.promise(() => raw.exists("redisson_lock_token:{sentinel-db}")), 1)

        // FairLock: first come, first served
        const fair = (backend: Service) => FairLock.make("sentinel-fair", { waiterTimeout: "20 seconds" }).pipe(withBackend(backend))
        const fairHolder = yield* Deferred.make<void>()
        const fairRelease = yield* Deferred.make<void>()
        const order: Array<number> = []
        const fairFirst = yield* Effect.fork(
          Lock.withLock(Effect.zipRight(Deferred.succeed(fairHolder, undefined), Deferred.await(fairRelease)), yield* fair(viaOptions))
        )
        yield* Deferred.await(fairHolder)
        const queued: Array<Fiber.RuntimeFiber<void, unknown>> = []
        for (const [i, backend] of [viaUrl, viaOptions, viaConfig].entries()) {
          const fairLock = yield* fair(backend)
          queued.push(yield* Effect.fork(Lock.withLock(Effect.sync(() => void order.push(i)), fairLock)))
          yield* Effect.sleep(150)
        }
        yield* Deferred.succeed(fairRelease, undefined)
        yield* Fiber.join(fairFirst)
        for (const fiber of queued) yield* Fiber.join(fiber)
        assert.deepStrictEqual(order, [0, 1, 2])

        // Semaphore: never more than its limit at once
        let inside = 0
        let most = 0
        yield* Effect.forEach([viaOptions, viaUrl, viaConfig, viaOptions], (backend) =>
          Effect.flatMap(Semaphore.make("sentinel-semaphore", { limit: 2, waiterTimeout: "20 seconds" }).pipe(withBackend(backend)), (sem) =>
            Effect.sync(() => {
              inside++
              most = Math.max(most, inside)
            }).pipe(Effect.zipRight(Effect.sleep(100)), Effect.ensuring(Effect.sync(() => inside--)), Semaphore.withPermits(sem))), {
          concurrency: "unbounded"
        })
        assert.strictEqual(most, 2)

        // ReadWriteLock: two readers at once, the writer after both
        const rwA = yield* ReadWriteLock.make("sentinel-rw", { waiterTimeout: "20 seconds" }).pipe(withBackend(viaOptions))
        const rwB = yield* ReadWriteLock.make("sentinel-rw", { waiterTimeout: "20 seconds" }).pipe(withBackend(viaConfig))
        const events: Array<string> = []
        const reader = (rw: ReadWriteLock.ReadWriteLock, name: string) =>
          Lock.withLock(Effect.zipRight(Effect.sync(() => events.push(`${name}+`)), Effect.zipRight(Effect.sleep(200), Effect.sync(() => events.push(`${name}-`)))), rw.read)
        const readers = yield* Effect.fork(Effect.all([reader(rwA, "r1"), reader(rwB, "r2")], { concurrency: "unbounded" }))
        yield* Effect.sleep(50)
        yield* Lock.withLock(Effect.sync(() => events.push("w")), rwB.write)
        yield* Fiber.join(readers)
        assert.deepStrictEqual(events.slice(0, 2).sort(), ["r1+", "r2+"])
        assert.strictEqual(events[events.length - 1], "w")

        // CountDownLatch: a waiter in one process, the count in another
        const latchA = yield* CountDownLatch.make("sentinel-latch").pipe(withBackend(viaOptions))
        const latchB = yield* CountDownLatch.make("sentinel-latch").pipe(withBackend(viaUrl))
        assert.isTrue(yield* CountDownLatch.trySetCount(latchA, 2))
        const awaiting = yield* Effect.fork(CountDownLatch.await(latchA, { timeout: "5 seconds" }))
        yield* Effect.sleep(100)
        yield* CountDownLatch.countDown(latchB)
        yield* CountDownLatch.countDown(latchB)
        const opened = nowMs()
        yield* Fiber.join(awaiting)
        assert.isBelow(nowMs() - opened, 500)
        // the defaults sent WAITs (acknowledgement by the replicas); off, none was sent
        const waits = (yield* callsOf(raw, "wait")) - waitsBefore
        if (tuning === undefined) assert.isAbove(waits, 0, "grants were acknowledged by the replicas")
        else assert.strictEqual(waits, 0, "replication: false sends no WAIT")

        // a master name the sentinels do not know: one line, within the command timeout
        const unknown = yield* Effect.exit(
          Effect.scoped(Layer.build(RedisBackend.layerFrom(`${urlOf(topology).replace(/\/[^/]*$/, "")}/nope`, { ...tuning, commandTimeout: "500 millis" })))
        ).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
        const error = Option.getOrThrow(typedFailure(unknown)) as BackendError
        console.log(`[sentinel] unknown master name: ${error.message}`)
        assert.include(error.message, "Redis master \"nope\" via sentinels 127.0.0.1:")
        assert.include(error.message, "the sentinels know no master of that name")
        assert.notInclude(error.message, "\n")

        // sentinels that require a password of their own: `sentinelPassword` of the URL (percent-encoded)
        const setSentinelPassword = (current: string | undefined, args: ReadonlyArray<string>) =>
          Effect.forEach(topology.sentinelAddresses, (address) =>
            Effect.acquireUseRelease(
              Effect.sync(() => new Redis({ ...address, password: current, maxRetriesPerRequest: 1 })),
              (client) => Effect.promise(() => client.call("ACL", "SETUSER", "default", ...args)),
              (client) => Effect.sync(() => client.disconnect())
            ))
        const password = "s+p&w"
        yield* Effect.acquireRelease(
          setSentinelPassword(undefined, ["on", "resetpass", `>${password}`]),
          () => setSentinelPassword(password, ["nopass"])
        )
        const withPassword = yield* backendFrom(
          RedisBackend.layerFrom(`${urlOf(topology)}?sentinelPassword=${encodeURIComponent(password)}`, tuning)
        )
        assert.strictEqual((yield* withPassword.inspect("sentinel-auth")).holders.length, 0)
        const refused = yield* Effect.exit(
          Effect.scoped(Layer.build(RedisBackend.layerFrom(urlOf(topology), { ...tuning, commandTimeout: "500 millis" })))
        ).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
        const refusal = (Option.getOrThrow(typedFailure(refused)) as BackendError).message
        console.log(`[sentinel] sentinels that require a password, none given: ${refusal}`)
        assert.include(refusal, "the sentinels refused the credentials (NOAUTH")
        assert.deepStrictEqual(escaped, [])
      }), 90_000)
  }

  it.scopedLive("nothing keeps the process alive once the backend closed, also with a sentinel down (quarantine off; replication off, and on by default)", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      yield* topology.sentinels[0]!.kill
      const fixture = fileURLToPath(new URL("./fixtures/sentinelExit.ts", import.meta.url))
      // the scenarios hold leases of a minute, which the default quarantine (30 s) refuses; with
      // replication left to its default, the acknowledged connection must not keep the process either
      for (const tuning of [off, { quarantine: false }] as const) {
        const { exitedAfterMs, reports, stdout } = yield* runChild(fixture, [urlOf(topology), JSON.stringify(tuning)])
        assert.isAtLeast(reports.length, 8, stdout)
        const failures: Array<string> = []
        for (const report of reports) {
          if (report.error !== undefined) failures.push(`${report.name}: ${report.error}`)
          // far below ioredis's 2 s timers
          if (report.left.length > 0 || report.settledMs >= 300) {
            failures.push(`${report.name}: alive ${report.settledMs} ms after its scope closed (${report.left.join(", ")})`)
          }
        }
        const slowest = Math.max(...reports.map((r) => r.settledMs))
        console.log(
          `[sentinel] exit ${JSON.stringify(tuning)}: ${reports.length} lock paths, slowest settled after ${slowest} ms; ` +
            `exited ${exitedAfterMs} ms after the program ended`
        )
        if (exitedAfterMs >= exitBoundMs) failures.push(`exited ${exitedAfterMs} ms after the program ended`)
        assert.deepStrictEqual(failures, [], JSON.stringify(tuning))
      }
    }))

  // the failovers below are about following the master; with the quarantine the waiters would
  // wait 30 s after the promotion (failover.test.ts has the failover with the defaults)
  it.scopedLive("planned failover while held (watchdog 3 s) with 3 waiters, replication and quarantine off: the hold follows, waiters are woken on the new master", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      const { a, b, history, onA, onB } = yield* recordedPair(topology)
      const key = "sentinel-planned"
      const scene = yield* holdAndQueue(key, { watchdog: "3 seconds", waiterTimeout: "20 seconds" }, onA, [onA, onB, onB])
      yield* Effect.sleep(400) // the waiters subscribed and were denied
      assert.strictEqual(scene.grants.length, 0)

      yield* topology.awaitSync()
      const old = yield* topology.master
      const start = nowMs()
      const promoted = yield* topology.failover()
      const switched = nowMs()
      const raw = yield* nodeClient(promoted)
      // both backends' subscriber connections moved to the new master
      yield* eventually("the subscribers on the new master", subscribersOn(raw, 2), 3_000, 10)
      const followed = nowMs()
      // the sentinels have not converted the old master yet (that takes several hello periods):
      // our connections left it when the switch was announced, not when it closed them
      const oldRaw = yield* nodeClient(old)
      const oldClients = yield* ourClients(oldRaw)
      yield* eventually("our connections to leave the old master", Effect.map(ourClients(oldRaw), (l) => l.length === 0), 1_000)
      // a renewal of the hold confirmed after the switch, by the new master
      yield* eventually(
        "a renewal on the new master",
        Effect.sync(() => a.calls.some((c) => c.op === "renew" && c.ok && c.start > followed)),
        2_000
      )
      const ttl = yield* Effect.promise(() => raw.pttl(key))
      assert.isAbove(ttl, 1_500, "the new master holds the renewed lease")
      const state = yield* scene.lease.state // before the release
      assert.strictEqual(scene.grants.length, 0, "nobody else was granted while the hold lasted")

      const releaseAt = nowMs()
      yield* Deferred.succeed(scene.release, undefined)
      yield* Fiber.join(scene.holder).pipe(Effect.catchTag("LockLost", () => Effect.void))
      for (const waiter of scene.waiters) yield* Fiber.join(waiter)
      const released = a.calls.find((c) => c.op === "release" && c.start >= releaseAt)
      const handOffMs = scene.grants[0]!.at - (released?.end ?? releaseAt)

      const evals = yield* callsOf(raw, "eval")
      // the waiters look again when the subscriber connection is back ('ready' wakes them all)
      const retried = [...a.calls, ...b.calls].filter((c) =>
        c.op === "acquire" && c.start >= switched - 300 && c.start <= followed + 300
      ).length
      const longest = longestCall([...a.calls, ...b.calls], start, followed)
      console.log(
        `[sentinel] planned failover ${old.name} -> ${promoted.name}: SENTINEL FAILOVER to agreement ${Math.round(switched - start)} ms; ` +
          `subscribers on the new master ${Math.round(followed - switched)} ms later; hold ${state}` +
          `${scene.lostAt() === undefined ? "" : ` (lost ${Math.round(scene.lostAt()! - start)} ms after the failover began)`}; ` +
          `waiters' attempts around the switch ${retried}; hand-off after the release ${Math.round(handOffMs)} ms; ` +
          `longest call across it: ${describeCall(longest)}; ` +
          `EVAL (NOSCRIPT fallback) on the new master: ${evals}; our connections still on the old master then: ${oldClients.length}`
      )

      if (state === "Lost") {
        // allowed only if it ended before anyone else was granted
        assert.isBelow(scene.lostAt()!, scene.grants[0]!.at)
      } else {
        assert.strictEqual(state, "Held")
      }
      assert.strictEqual(scene.grants.length, 3)
      assert.isBelow(handOffMs, 1_000, "the release woke a waiter on the new master")
      const fences = [scene.lease.fence, ...scene.grants.map((g) => g.fence)]
      for (let i = 1; i < fences.length; i++) assert.isAbove(fences[i]!, fences[i - 1]!, `fences ${fences.join(", ")}`)
      // the scripts run on the promoted master: loaded there by EVAL (EVALSHA answered NOSCRIPT), or
      // as Redis Functions, which the master replicated to it with the library
      const fcalls = yield* callsOf(raw, "fcall")
      const hasLibrary = JSON.stringify(yield* Effect.promise(() => raw.call("FUNCTION", "LIST"))).includes(libraryName)
      assert.isTrue(evals >= 1 || (fcalls >= 1 && hasLibrary), "scripts were loaded on the promoted master, or it had the library")
      assert.isBelow(longest === undefined ? 0 : longest.end - longest.start, 2_000, describeCall(longest))
      yield* history.assertValid
      assert.deepStrictEqual(escaped, [])
    }))

  it.scopedLive("unplanned failover (master killed) while held (watchdog 6 s), replication and quarantine off: the backends follow the promoted replica", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      const { a, b, history, onA, onB } = yield* recordedPair(topology)
      const key = "sentinel-unplanned"
      const scene = yield* holdAndQueue(key, { watchdog: "6 seconds", waiterTimeout: "20 seconds" }, onA, [onA, onB])
      // a probe on each backend: an inspect every 50 ms
      const probe = (service: Service) =>
        Effect.fork(Effect.forever(Effect.zipRight(Effect.ignore(service.inspect("sentinel-probe")), Effect.sleep(50))))
      const probes = [yield* probe(a.service), yield* probe(b.service)]
      yield* Effect.sleep(400)
      assert.strictEqual(scene.grants.length, 0)

      yield* topology.awaitSync()
      const old = yield* topology.master
      const killed = nowMs()
      yield* old.kill
      const promoted = yield* topology.awaitMaster({ filter: (node) => node !== old })
      const agreed = nowMs()
      const raw = yield* nodeClient(promoted)
      // the first answer of each backend after the sentinels agreed
      const firstAnswer = (calls: ReadonlyArray<Timed>) =>
        Effect.map(
          eventually("an answer from the new master", Effect.sync(() => calls.some((c) => c.ok && c.start >= agreed)), 5_000, 10),
          () => Math.min(...calls.filter((c) => c.ok && c.start >= agreed).map((c) => c.end))
        )
      const followedA = yield* firstAnswer(a.calls)
      const followedB = yield* firstAnswer(b.calls)
      yield* eventually("the subscribers on the new master", subscribersOn(raw, 2), 3_000, 10)
      const subscribed = nowMs()
      yield* Effect.forEach(probes, Fiber.interrupt)
      // a renewal confirmed by the new master, unless the hold was lost meanwhile
      yield* eventually(
        "a renewal on the new master, or the loss of the hold",
        Effect.map(scene.lease.state, (state) => state !== "Held" || a.calls.some((c) => c.op === "renew" && c.ok && c.start > agreed)),
        5_000
      )
      const state = yield* scene.lease.state // before the release
      const silent = (calls: ReadonlyArray<Timed>) => {
        // from the kill to the first answer after it
        const answers = calls.filter((c) => c.ok && c.start >= killed).map((c) => c.end).sort((x, y) => x - y)
        return (answers[0] ?? killed) - killed
      }

      const releaseAt = nowMs()
      yield* Deferred.succeed(scene.release, undefined)
      yield* Fiber.join(scene.holder).pipe(Effect.catchTag("LockLost", () => Effect.void))
      for (const waiter of scene.waiters) yield* Fiber.join(waiter)
      const released = a.calls.find((c) => c.op === "release" && c.start >= releaseAt)
      const handOffMs = state === "Held" ? scene.grants[0]!.at - (released?.end ?? releaseAt) : undefined
      const longest = longestCall([...a.calls, ...b.calls], killed, Math.max(followedA, followedB))
      const failed = [...a.calls, ...b.calls].filter((c) => !c.ok && c.end >= killed).length
      console.log(
        `[sentinel] unplanned failover (${old.name} killed) -> ${promoted.name}: sentinels agreed ${Math.round(agreed - killed)} ms after the kill; ` +
          `first answers ${Math.round(followedA - agreed)} / ${Math.round(followedB - agreed)} ms after that ` +
          `(${Math.round(silent(a.calls))} / ${Math.round(silent(b.calls))} ms after the kill); subscribers moved ${
            Math.round(subscribed - agreed)
          } ms after; hold ${state}; hand-off ${handOffMs === undefined ? "n/a" : `${Math.round(handOffMs)} ms`}; ` +
          `longest call: ${describeCall(longest)}; ${failed} calls failed meanwhile`
      )

      if (state === "Lost") {
        assert.isBelow(scene.lostAt()!, scene.grants[0]!.at, "the holder knew it had lost the lock before anyone else got it")
      } else {
        assert.strictEqual(state, "Held")
        assert.isBelow(handOffMs!, 1_000, "the release woke a waiter on the new master")
      }
      // within the failover and one reconnect attempt (ioredis backs off by 50 ms more per attempt, at most 2 s)
      assert.isBelow(followedA - agreed, 2_500)
      assert.isBelow(followedB - agreed, 2_500)
      // no call waits past the command timeout (2 s)
      assert.isBelow(longest === undefined ? 0 : longest.end - longest.start, 2_300, describeCall(longest))
      assert.strictEqual(scene.grants.length, 2)
      const fences = [scene.lease.fence, ...scene.grants.map((g) => g.fence)]
      for (let i = 1; i < fences.length; i++) assert.isAbove(fences[i]!, fences[i - 1]!, `fences ${fences.join(", ")}`)
      yield* history.assertValid
      assert.deepStrictEqual(escaped, [])
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))
})

describe("reconnecting through sentinels", () => {
  it.scopedLive("a failover announced while a reconnection asks a paused sentinel: no connection ends for good, none waits on that sentinel", () =>
    Effect.gen(function*() {
      const topology = yield* RedisSentinel.make()
      // A waits on a sentinel as long as it takes (ioredis's own default): its reconnection is
      // still asking the paused sentinel when the others announce the switch, the moment at
      // which ioredis gave up on a connection for good. It also confirms with one replica, so
      // its three connections (commands, subscriber, acknowledged) all go through it. No
      // quarantine (on by default through sentinels): the waiters are granted on the promoted master at once.
      const a = timed(yield* backendFrom(RedisBackend.layerFrom(
        { ...optionsOf(topology), sentinelCommandTimeout: 60_000 },
        { replication: { replicas: 1, timeout: "500 millis" }, quarantine: false }
      )))
      // B has the connection defaults of a URL: it asks the next sentinel once one leaves it
      // unanswered (replication and quarantine off)
      const b = timed(yield* backendFrom(RedisBackend.layerFrom(urlOf(topology), off)))
      const key = "sentinel-reconnect"
      const scene = yield* holdAndQueue(key, { watchdog: "6 seconds", waiterTimeout: "30 seconds" }, a.service, [
        a.service,
        b.service
      ])
      yield* Effect.sleep(400) // the waiters subscribed and were denied
      yield* topology.awaitSync()
      const old = yield* topology.master
      // every connection asked sentinel 0 first when it connected, so it asks it first again
      const paused = topology.sentinels[0]!
      yield* paused.pause
      yield* old.kill
      const promoted = yield* topology.awaitMaster({ filter: (node) => node !== old })
      const agreed = nowMs()
      const answersSince = (calls: ReadonlyArray<Timed>, since: number) =>
        Effect.sync(() => calls.some((c) => c.ok && c.start >= since && c.op === "inspect"))
      const probe = (service: Service) =>
        Effect.fork(Effect.forever(Effect.zipRight(Effect.ignore(service.inspect("sentinel-probe")), Effect.sleep(50))))
      const probes = [yield* probe(a.service), yield* probe(b.service)]
      // B follows while the paused sentinel still does not answer
      yield* eventually("B answering from the new master, one sentinel paused", answersSince(b.calls, agreed), 5_000, 10)
      const followedB = nowMs()
      // the switch reached A's connections while they were asking the paused sentinel
      yield* Effect.sleep(1_000)
      const resumed = nowMs()
      yield* paused.resume
      yield* eventually("A answering from the new master after the sentinel answered", answersSince(a.calls, resumed), 5_000, 10)
      const followedA = nowMs()
      yield* Effect.forEach(probes, Fiber.interrupt)
      const raw = yield* nodeClient(promoted)
      yield* eventually("the subscribers on the new master", subscribersOn(raw, 2), 5_000, 10)

      yield* Deferred.succeed(scene.release, undefined)
      yield* Fiber.join(scene.holder).pipe(Effect.catchTag("LockLost", () => Effect.void))
      for (const waiter of scene.waiters) yield* Fiber.join(waiter)
      // a grant confirmed by the remaining replica, on A's acknowledged connection
      yield* eventually(
        "a grant on A acknowledged by the remaining replica",
        Effect.map(
          Effect.either(Effect.scoped(Effect.flatMap(Lock.make(`${key}-acknowledged`), Lock.acquire).pipe(withBackend(a.service)))),
          Either.isRight
        ),
        10_000,
        200
      )
      console.log(
        `[sentinel] failover with sentinel 0 paused: B answered ${Math.round(followedB - agreed)} ms after the sentinels agreed; ` +
          `A ${Math.round(followedA - resumed)} ms after the sentinel resumed; waiters granted: ${scene.grants.length}`
      )
      assert.strictEqual(scene.grants.length, 2)
      assert.deepStrictEqual(escaped, [])
    }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger))))
})
