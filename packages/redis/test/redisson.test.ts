import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Option } from "effect"
import { Redis } from "ioredis"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
if (!available) console.warn("Redisson interoperability suite NOT RUN: redis-server not found")

/**
 * A client following Redisson's RLock protocol: the lock is a hash `name` whose field
 * `<id>:<thread>` counts holds, the key's PEXPIRE is the lease, and an unlock publishes 0 on
 * `redisson_lock__channel:{name}`.
 */
const redissonLike = (client: Redis, name: string, field: string) => ({
  /** null when granted, else the remaining TTL of the holder. */
  tryLock: (leaseMs: number) =>
    Effect.promise(() =>
      client.eval(
        `if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
           redis.call('hincrby', KEYS[1], ARGV[2], 1)
           redis.call('pexpire', KEYS[1], ARGV[1])
           return nil
         end
         return redis.call('pttl', KEYS[1])`,
        1,
        name,
        leaseMs,
        field
      )
    ),
  unlock: Effect.promise(() =>
    client.eval(
      `if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil end
       if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then return 0 end
       redis.call('del', KEYS[1])
       redis.call('publish', KEYS[2], 0)
       return 1`,
      2,
      name,
      `redisson_lock__channel:{${name}}`,
      field
    )
  )
})

describe.runIf(available || required)("Redisson's RLock protocol and lockstep exclude each other", () => {
  const withRedis = <A, E>(f: (client: Redis) => Effect.Effect<A, E, LockBackend.LockBackend>) =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const client = yield* Effect.acquireRelease(Effect.sync(() => new Redis(server.url)), (c) => Effect.sync(() => c.disconnect()))
      return yield* f(client).pipe(Effect.provide(RedisBackend.layerFrom(server.url).pipe(Layer.orDie)))
    }).pipe(Effect.scoped)

  it.live("a lock held through Redisson's protocol keeps lockstep out, and its unlock wakes a lockstep waiter", () =>
    withRedis((client) =>
      Effect.gen(function*() {
        const redisson = redissonLike(client, "shared-name", "7c1f0e2a-redisson:1")
        assert.isNull(yield* redisson.tryLock(30_000))
        const lock = yield* Lock.make("shared-name")
        assert.isTrue(yield* Lock.isLocked(lock))
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(lock))))
        const waiter = yield* Effect.fork(Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
        yield* Effect.sleep("100 millis")
        assert.strictEqual(yield* redisson.unlock, 1)
        // the Redisson lease is 30 s: only the unlock message can wake the waiter this soon
        const fence = yield* Fiber.join(waiter).pipe(Effect.timeout("3 seconds"))
        assert.isAbove(fence, 0)
      })))

  it.live("every release that frees the key ends with Redisson's unlock message 0; a release that hands the key to a lockstep waiter keeps it held (for Redisson too) and says so in two numbers; every message is a Java long", () =>
    withRedis((client) =>
      Effect.gen(function*() {
        const messages: Array<string> = []
        const listener = yield* Effect.acquireRelease(
          Effect.promise(async () => {
            const sub = client.duplicate()
            sub.on("message", (_channel: string, message: string) => void messages.push(message))
            await sub.subscribe("redisson_lock__channel:{shared-name}")
            return sub
          }),
          (sub) => Effect.sync(() => sub.disconnect())
        )
        assert.isDefined(listener)
        const redisson = redissonLike(client, "shared-name", "7c1f0e2a-redisson:1")
        const lock = yield* Lock.make("shared-name")
        const holding = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const holder = yield* Effect.fork(
          Lock.withLock(Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(release)), lock)
        )
        yield* Deferred.await(holding)
        const handedOver = yield* Deferred.make<void>()
        const done = yield* Deferred.make<void>()
        const waiter = yield* Effect.fork(
          Lock.withLock(Effect.zipRight(Deferred.succeed(handedOver, undefined), Deferred.await(done)), lock, { timeout: "10 seconds" })
        )
        yield* Effect.sleep("200 millis")
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        yield* Deferred.await(handedOver)
        // the key went from the holder to the waiter without being free: a Redisson client is kept out
        const ttl = yield* redisson.tryLock(30_000)
        assert.isTrue(typeof ttl === "number" && ttl > 0, `Redisson client got a handed-over lock: ${String(ttl)}`)
        yield* Deferred.succeed(done, undefined)
        yield* Fiber.join(waiter)
        yield* Effect.sleep("200 millis")
        // the holder's release handed the key over ('1' and the waiter's code in 18 digits, then the
        // fence), and said no 0: the key stayed held; the waiter's release freed it and said 0
        assert.strictEqual(messages.length, 3, messages.join(" "))
        assert.match(messages[0]!, /^1\d{17}$/)
        assert.match(messages[1]!, /^[1-9]\d*$/)
        assert.deepStrictEqual(messages.slice(2), ["0"])
        for (const message of messages) assert.isTrue(BigInt(message) < 2n ** 63n && BigInt(message) >= -(2n ** 63n))
        // and a Redisson client gets it now
        assert.isNull(yield* redisson.tryLock(30_000))
      }).pipe(Effect.scoped)))

  it.live("a lock held by lockstep keeps a Redisson-protocol client out until it is released", () =>
    withRedis((client) =>
      Effect.gen(function*() {
        const redisson = redissonLike(client, "shared-name", "7c1f0e2a-redisson:1")
        const lock = yield* Lock.make("shared-name")
        yield* Effect.scoped(Effect.gen(function*() {
          const lease = yield* Lock.acquire(lock)
          // Redisson's layout: a hash field per holder with its hold count
          assert.strictEqual(yield* Effect.promise(() => client.hget("shared-name", lease.holder)), "1")
          const ttl = yield* redisson.tryLock(30_000)
          assert.isTrue(typeof ttl === "number" && ttl > 0, `Redisson client got the lock: ${String(ttl)}`)
        }))
        assert.isNull(yield* redisson.tryLock(30_000))
        assert.strictEqual(yield* redisson.unlock, 1)
      })))
})
