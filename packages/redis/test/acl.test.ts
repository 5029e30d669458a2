import { assert, describe, it } from "@effect/vitest"
import { readFileSync } from "node:fs"
import type { Scope } from "effect"
import { Duration, Effect, Fiber, Layer, Option } from "effect"
import { Redis } from "ioredis"
import { CountDownLatch, Lock } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import { FaultyBackend } from "@lockstep/testkit"
import { RedisServer } from "@lockstep/servers"
import * as Conformance from "@lockstep/testkit/Conformance"
import { permissionError } from "../src/internal/redisBackend.js"
import * as scripts from "../src/internal/scripts/lock.js"

// The least-privilege ACL rules of the security guide (docs/security.md), as documented: every test
// here creates its user with exactly that text, so the documentation and what is tested cannot part ways.
const guide = readFileSync(new URL("../../../docs/security.md", import.meta.url), "utf8")
const section = guide.slice(guide.indexOf("\n## Redis: least-privilege ACL"), guide.indexOf("\n## What lockstep stores"))
const ruleOf = (user: string): ReadonlyArray<string> => {
  const line = section.split("\n").find((l) => l.startsWith(`ACL SETUSER ${user} `))
  if (line === undefined) throw new Error(`docs/security.md documents no ACL rule for user ${user}`)
  return line.trim().split(/\s+/).slice(3)
}
const namespaced = ruleOf("lockstep")
const redissonLayout = ruleOf("lockstep-redisson")
/** The namespace of the documented rule: its `~<prefix>*`. */
const namespace = namespaced.find((t) => t.startsWith("~"))!.slice(1, -1)
/** The password of the documented rules (`>...`). */
const passwordOf = (rule: ReadonlyArray<string>) => rule.find((t) => t.startsWith(">"))!.slice(1)

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
if (!available) {
  console.warn("Redis ACL tests NOT RUN: redis-server not found (set REDIS_SERVER_BIN)")
}

/** A connection as the default (unrestricted) user, closed with the scope. */
const admin = (server: RedisServer.RedisServer): Effect.Effect<Redis, never, Scope.Scope> =>
  Effect.acquireRelease(Effect.sync(() => new Redis(server.url)), (c) => Effect.sync(() => c.disconnect()))

/** A server with `user` created by `rule` (the README's words), and an admin connection to it. */
const serverWithUser = (user: string, rule: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const server = yield* Effect.orDie(RedisServer.make())
    const raw = yield* admin(server)
    yield* Effect.promise(() => raw.call("ACL", "SETUSER", user, ...rule))
    return { server, raw }
  })

/** The options of a connection as `user` to `server`. */
const as = (server: RedisServer.RedisServer, user: string, rule: ReadonlyArray<string>, keyPrefix?: string) => ({
  host: server.host,
  port: server.port,
  username: user,
  password: passwordOf(rule),
  ...(keyPrefix === undefined ? {} : { keyPrefix })
})

/**
 * Every kind of key and channel a lock touches, on keys starting with `prefix`: the quarantine's
 * epoch record, a wake-up on a lock's channel, a forced release (which remembers the holders it
 * dropped), a latch and its channel.
 */
const exercise = (prefix: string) =>
  Effect.scoped(Effect.gen(function*() {
    // the first grant is held back by the quarantine until a lease has passed since the server started
    const warm = yield* Lock.make(`${prefix}orders:6`, { lease: "1 second" })
    yield* Effect.scoped(Lock.acquire(warm, { timeout: "5 seconds" }))
    const lock = yield* Lock.make(`${prefix}orders:7`, { lease: "1 second" })
    const first = yield* Effect.fork(Effect.scoped(Effect.zipRight(
      Lock.acquire(lock, { timeout: "5 seconds" }),
      Effect.sleep("200 millis")
    )))
    yield* Effect.sleep("50 millis")
    const other = yield* Lock.make(`${prefix}orders:7`, { lease: "1 second" })
    const waited = yield* Effect.scoped(Effect.timed(Lock.acquire(other, { timeout: "5 seconds" })))
    yield* first.await
    // woken by the release on the lock's channel, long before the first lease would have ended
    const [elapsed] = waited
    assert.isBelow(Duration.toMillis(elapsed), 700, "the waiter was not woken by the release")
    // a forced release remembers the holders it dropped (their ended keys)
    const forced = yield* Lock.make(`${prefix}orders:8`, { lease: "1 second" })
    const unlocked = yield* Effect.scoped(Effect.gen(function*() {
      assert.isTrue(Option.isSome(yield* Lock.tryAcquire(forced)))
      return yield* Lock.forceUnlock(forced)
    }))
    assert.isTrue(unlocked)
    // a latch's channel
    const latch = yield* CountDownLatch.make(`${prefix}batch:1`)
    assert.isTrue(yield* CountDownLatch.trySetCount(latch, 1))
    const awaiting = yield* Effect.fork(CountDownLatch.await(latch, { timeout: "5 seconds" }))
    yield* Effect.sleep("100 millis")
    yield* CountDownLatch.countDown(latch)
    const start = Date.now()
    yield* Fiber.join(awaiting)
    assert.isBelow(Date.now() - start, 1_000, "the latch's waiter was not woken")
  }))

describe.runIf(available || required)("Redis backend as a least-privilege ACL user", () => {
  it("the documented rule is least privilege: one key pattern, one channel pattern, no category", () => {
    assert.deepStrictEqual(namespaced.filter((t) => t.startsWith("~")), [`~${namespace}*`])
    assert.deepStrictEqual(namespaced.filter((t) => t.startsWith("&")), [`&${namespace}*`])
    assert.isTrue(namespaced.includes("-@all"))
    assert.isFalse(namespaced.some((t) => t.startsWith("+@") || t === "allkeys" || t === "allchannels" || t === "allcommands"))
  })

  it("a key a script builds that the user may not access is named with the command that uses it", () => {
    // the line of forceRelease's script that writes the ended keys it builds
    const line = scripts.forceRelease.lua.split("\n").findIndex((l) => l.includes("endedPrefix .. h")) + 1
    assert.isAbove(line, 0)
    const refusal = new Error(
      "ERR The user executing the script can't access at least one of the keys mentioned in the command arguments " +
        `script: ${scripts.forceRelease.sha}, on @user_script:${line}.`
    )
    const error = permissionError(scripts.forceRelease, refusal)
    assert.instanceOf(error, Error)
    assert.match((error as Error).message, /^NOPERM this user has no permissions to access a key that the SET command names, in the forceRelease script/)
    // any other error is left as it is
    const other = new Error("ERR something else")
    assert.strictEqual(permissionError(scripts.forceRelease, other), other)
  })

  it.scopedLive("a handle outside the namespace fails with a BackendError naming the missing permission", () =>
    Effect.gen(function*() {
      const { server } = yield* serverWithUser("lockstep", namespaced)
      // the same user, without the namespace: its keys are not the user's
      const outside = RedisBackend.layerFrom(as(server, "lockstep", namespaced))
      const error = yield* Effect.flip(
        Effect.scoped(Effect.flatMap(Lock.make("orders:42"), (lock) => Lock.tryAcquire(lock)))
      ).pipe(Effect.provide(outside))
      assert.strictEqual(error._tag, "BackendError")
      assert.match(error.message, /NOPERM/)
      assert.match(error.message, /key/)
      // inside the namespace, the same user and key work
      const inside = RedisBackend.layerFrom(as(server, "lockstep", namespaced, namespace))
      const held = yield* Effect.scoped(
        Effect.flatMap(Lock.make("orders:42"), (lock) => Effect.map(Lock.tryAcquire(lock), (lease) => lease._tag))
      ).pipe(Effect.provide(inside))
      assert.strictEqual(held, "Some")
    }))

  it.scopedLive("a command the rule leaves out fails with a BackendError naming it", () =>
    Effect.gen(function*() {
      // the documented rule without EXISTS, which every acquisition's script calls first
      const { server } = yield* serverWithUser("lockstep", [...namespaced, "-exists"])
      const backend = RedisBackend.layerFrom(as(server, "lockstep", namespaced, namespace))
      const error = yield* Effect.flip(Effect.scoped(Effect.gen(function*() {
        const lock = yield* Lock.make("orders:42")
        return yield* Lock.tryAcquire(lock)
      }))).pipe(Effect.provide(backend))
      assert.strictEqual(error._tag, "BackendError")
      assert.match(error.message, /NOPERM this user has no permissions to run the EXISTS command, in the acquire script/)
    }))

  it.scopedLive("wake-ups, latches, forced releases and the quarantine stay in the namespace", () =>
    Effect.gen(function*() {
      const { raw, server } = yield* serverWithUser("lockstep", namespaced)
      const backend = RedisBackend.layerFrom(as(server, "lockstep", namespaced, namespace), {
        quarantine: { longestLease: "1 second" }
      })
      yield* exercise("").pipe(Effect.provide(backend))
      const keys = yield* Effect.promise(() => raw.keys("*"))
      assert.isAbove(keys.length, 0)
      assert.deepStrictEqual(keys.filter((k) => !k.startsWith(namespace)), [])
    }))

  it.scopedLive("the Redisson layout's rule (no namespace) covers locks under its prefix", () =>
    Effect.gen(function*() {
      const { raw, server } = yield* serverWithUser("lockstep-redisson", redissonLayout)
      const backend = RedisBackend.layerFrom(as(server, "lockstep-redisson", redissonLayout), {
        quarantine: { longestLease: "1 second" }
      })
      yield* exercise("locks:").pipe(Effect.provide(backend))
      yield* Effect.scoped(Effect.gen(function*() {
        // a lock outside the rule's prefix is refused
        const error = yield* Effect.flip(
          Effect.flatMap(Lock.make("orders:7", { lease: "1 second" }), (l) => Lock.tryAcquire(l))
        )
        assert.strictEqual(error._tag, "BackendError")
        assert.match(error.message, /NOPERM/)
      })).pipe(Effect.provide(backend))
      const keys = yield* Effect.promise(() => raw.keys("*"))
      assert.isAbove(keys.length, 0)
    }))

  it.scopedLive("on a Redis Cluster, a hash-tagged namespace and the documented rule with CLUSTER SLOTS and INFO", () =>
    Effect.gen(function*() {
      const cluster = yield* Effect.orDie(RedisServer.makeCluster({ masters: 3 }))
      // the README's rule, in the namespace it advises for a cluster, and the command it adds
      const tagged = "{lockstep}:"
      const rule = [
        ...namespaced.map((t) => t === `~${namespace}*` ? `~${tagged}*` : t === `&${namespace}*` ? `&${tagged}*` : t),
        "+cluster|slots",
        "+cluster|info"
      ]
      const admins = yield* Effect.forEach(cluster.nodes, admin)
      yield* Effect.forEach(admins, (raw) => Effect.promise(() => raw.call("ACL", "SETUSER", "lockstep", ...rule)))
      const backend = RedisBackend.layerFrom({
        cluster: cluster.startupNodes,
        options: { keyPrefix: tagged, redisOptions: { username: "lockstep", password: passwordOf(rule) } }
      })
      yield* exercise("").pipe(Effect.provide(backend))
      const keys = (yield* Effect.forEach(admins, (raw) => Effect.promise(() => raw.keys("*")))).flat()
      assert.isAbove(keys.length, 0)
      assert.deepStrictEqual(keys.filter((k) => !k.startsWith(tagged)), [])
    }), 60_000)

  describe("the Redis conformance suite as the documented user, in the namespace", () => {
    const restricted = Effect.gen(function*() {
      const { raw, server } = yield* serverWithUser("lockstep", namespaced)
      return { raw, layer: RedisBackend.layerFrom(as(server, "lockstep", namespaced, namespace)) }
    })
    const layer = Layer.unwrapScoped(Effect.map(restricted, ({ layer }) => layer)).pipe(Layer.orDie)
    const dataLoss = Layer.unwrapScoped(Effect.map(restricted, ({ layer, raw }) =>
      Layer.merge(layer, Layer.succeed(FaultyBackend.DataLoss, { wipe: Effect.asVoid(Effect.promise(() => raw.flushall())) }))
    )).pipe(Layer.orDie)
    Conformance.suite({ name: "redis (ACL user)", layer, clock: "live", dataLoss })
  })
})
