import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Scope } from "effect"
import type { Redis } from "ioredis"
import IORedisMock from "ioredis-mock"
import * as Lock from "@lockstep/core/Lock"
import { FaultyBackend } from "@lockstep/testkit"
import * as RedisMock from "@lockstep/testkit/RedisMock"

const nodeHrtime = process.hrtime
const nativeGetTime = Date.prototype.getTime
const restored = () => {
  assert.strictEqual(process.hrtime, nodeHrtime)
  assert.strictEqual(Date.prototype.getTime, nativeGetTime)
}

/** Epoch microseconds of a TIME reply. */
const micros = (reply: ReadonlyArray<unknown>): number => Number(reply[0]) * 1_000_000 + Number(reply[1])

/**
 * Reads TIME `count` times, directly and from a script, each between two Date.now() readings.
 */
const readTimes = (client: Redis, count: number) =>
  Effect.gen(function*() {
    const readings: Array<{ readonly before: number; readonly time: number; readonly after: number }> = []
    for (let i = 0; i < count; i++) {
      const before = Date.now()
      const reply = i % 2 === 0
        ? yield* Effect.promise(() => client.time())
        : (yield* Effect.promise(() => client.eval("return redis.call('TIME')", 0))) as ReadonlyArray<unknown>
      readings.push({ before, time: micros(reply), after: Date.now() })
      // a few readings land on a later millisecond
      if (i % 50 === 0) yield* Effect.sleep("1 millis")
    }
    return readings
  })

describe("RedisMock clock", () => {
  it.effect("installs a consistent process.hrtime for the scope and restores Node's", () =>
    Effect.gen(function*() {
      restored()
      yield* Effect.scoped(Effect.gen(function*() {
        yield* RedisMock.installClock
        assert.notStrictEqual(process.hrtime, nodeHrtime)
        assert.notStrictEqual(Date.prototype.getTime, nativeGetTime)
        assert.strictEqual(typeof process.hrtime.bigint(), "bigint")
        // getTime answers as before
        const date = new Date(1_700_000_000_123)
        assert.strictEqual(date.getTime(), 1_700_000_000_123)
        assert.throws(() => Date.prototype.getTime.call({} as Date))
      }))
      restored()
    }))

  it.effect("a reading right after a Date keeps that Date's seconds, and adds up to now", () =>
    Effect.gen(function*() {
      yield* RedisMock.installClock
      // a Date of the last second, whose rounded seconds often differ from now's, as when the
      // clock passes the half second between the two readings of TIME (900 ms old: a loaded
      // machine may take some ms to the reading, which must still be within the Date's second)
      const date = new Date(Date.now() - 900).getTime()
      const before = Date.now()
      const [seconds, nanos] = process.hrtime()
      const after = Date.now()
      assert.strictEqual(seconds, Math.round(date / 1000))
      const reading = seconds * 1000 + nanos / 1e6
      assert.isTrue(reading >= before && reading <= after, `${reading} within [${before}, ${after}]`)
      // only the reading right after it: the next one rounds its own time
      const nextBefore = Date.now()
      const [next] = process.hrtime()
      const nextAfter = Date.now()
      assert.include([Math.round(nextBefore / 1000), Math.round(nextAfter / 1000)], next)
    }).pipe(Effect.scoped))

  it.effect("nested and overlapping scopes share one installation; the last to close restores", () =>
    Effect.gen(function*() {
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      yield* Scope.extend(RedisMock.installClock, first)
      const installed = process.hrtime
      assert.notStrictEqual(installed, nodeHrtime)
      yield* Scope.extend(RedisMock.installClock, second)
      assert.strictEqual(process.hrtime, installed)
      // nested inside both
      yield* Effect.scoped(RedisMock.installClock)
      assert.strictEqual(process.hrtime, installed)
      // the first one closes first
      yield* Scope.close(first, Exit.void)
      assert.strictEqual(process.hrtime, installed)
      yield* Scope.close(second, Exit.void)
      restored()
      // and again from scratch
      yield* Effect.scoped(Effect.zipRight(RedisMock.installClock, Effect.sync(() => assert.notStrictEqual(process.hrtime, nodeHrtime))))
      restored()
    }))

  it.effect("closing the scope of a client or a layer restores process.hrtime", () =>
    Effect.gen(function*() {
      yield* Effect.scoped(Effect.zipRight(RedisMock.client, Effect.sync(() => assert.notStrictEqual(process.hrtime, nodeHrtime))))
      restored()
      yield* Effect.scoped(Effect.gen(function*() {
        const lock = yield* Lock.make("clock:layer")
        yield* Lock.withLock(Effect.void, lock)
        assert.notStrictEqual(process.hrtime, nodeHrtime)
      }).pipe(Effect.provide(RedisMock.layer)))
      restored()
    }))

  it.effect("process.hrtime measures from its own readings on the wall clock, from earlier ones on Node's", () =>
    Effect.gen(function*() {
      const earlier = process.hrtime()
      const earlierBig = process.hrtime.bigint()
      yield* Effect.scoped(Effect.gen(function*() {
        yield* RedisMock.installClock
        const start = process.hrtime()
        const wall = Date.now()
        // a reading: the seconds and nanoseconds add up to Date.now() in whole milliseconds
        assert.strictEqual(start[1] % 1_000_000, 0)
        assert.isBelow(Math.abs(start[1]), 1_500_000_000)
        assert.isAtMost(Math.abs(start[0] * 1000 + start[1] / 1e6 - wall), 5)
        yield* Effect.promise(() => new Promise((resolve) => setTimeout(resolve, 30)))
        const [seconds, nanos] = process.hrtime(start)
        assert.isAtLeast(nanos, 0)
        assert.isBelow(nanos, 1e9)
        const elapsedMs = seconds * 1000 + nanos / 1e6
        assert.isAtLeast(elapsedMs, 25)
        assert.isBelow(elapsedMs, 5_000)
        // from a reading of Node's clock, taken before: Node's clock
        const sinceEarlier = process.hrtime(earlier)
        assert.isAtLeast(sinceEarlier[0] * 1000 + sinceEarlier[1] / 1e6, 25)
        assert.isBelow(sinceEarlier[0], 60)
        assert.isTrue(process.hrtime.bigint() > earlierBig)
      }))
    }))
})

describe("RedisMock TIME", () => {
  it.live("is the wall clock in milliseconds, never steps back, directly and in scripts", () =>
    Effect.gen(function*() {
      const client = yield* RedisMock.client
      const readings = yield* readTimes(client, 600)
      let previous = 0
      for (const { after, before, time } of readings) {
        assert.strictEqual(time % 1000, 0, "whole milliseconds")
        assert.isAtLeast(time, before * 1000)
        assert.isAtMost(time, after * 1000)
        assert.isAtLeast(time, previous, "never steps back")
        previous = time
      }
      assert.isAbove(readings[readings.length - 1]!.time, readings[0]!.time)
    }).pipe(Effect.scoped))

  it.live("without the clock, ioredis-mock's TIME is not Date.now()", () =>
    Effect.gen(function*() {
      // what installClock corrects: the microseconds come from an unrelated clock, so over a
      // second some readings are off by up to a second
      restored()
      const mock = new IORedisMock({ host: "redis-mock-test-unpatched" })
      let off = 0
      for (let i = 0; i < 60; i++) {
        const before = Date.now()
        const time = micros(yield* Effect.promise(() => mock.time()))
        if (time < before * 1000 - 1000 || time > Date.now() * 1000 + 1000) off++
        yield* Effect.sleep("20 millis")
      }
      mock.disconnect()
      assert.isAbove(off, 0)
    }))
})

describe("RedisMock.client", () => {
  it.live("has data of its own, shared with its duplicates, emptied when the scope closes", () =>
    Effect.gen(function*() {
      const a = yield* RedisMock.client
      const b = yield* RedisMock.client
      yield* Effect.promise(() => a.set("k", "a"))
      assert.strictEqual(yield* Effect.promise(() => b.get("k")), null)
      const duplicate = a.duplicate()
      assert.strictEqual(yield* Effect.promise(() => duplicate.get("k")), "a")
      duplicate.disconnect()
      const inner = yield* Effect.scoped(Effect.gen(function*() {
        const c = yield* RedisMock.client
        yield* Effect.promise(() => c.set("k", "c"))
        return c.options.host ?? ""
      }))
      // another instance on the same host (port and db: the defaults) sees what is left: nothing
      const again = new IORedisMock({ host: inner })
      assert.strictEqual(yield* Effect.promise(() => again.get("k")), null)
      again.disconnect()
      assert.strictEqual(yield* Effect.promise(() => a.get("k")), "a")
    }).pipe(Effect.scoped))
})

describe("RedisMock.layer", () => {
  it.live("hands a lock over from one holder to a waiter, with a greater fence", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("handoff", { watchdog: "3 seconds" })
      const held = yield* Deferred.make<number>()
      const release = yield* Deferred.make<void>()
      const first = yield* Lock.withLock(
        (lease) => Effect.zipRight(Deferred.succeed(held, lease.fence), Deferred.await(release)),
        lock
      ).pipe(Effect.fork)
      const firstFence = yield* Deferred.await(held)
      const second = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock, { timeout: "10 seconds" }).pipe(
        Effect.fork
      )
      yield* Effect.sleep("100 millis")
      assert.isNull(second.unsafePoll(), "the waiter waits while the lock is held")
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(first)
      const secondFence = yield* Fiber.join(second)
      assert.isAbove(secondFence, firstFence)
      assert.isFalse(yield* Lock.isLocked(lock))
    }).pipe(Effect.provide(RedisMock.layer)))

  it.live("a fixed lease expires on the mock's clock: the holder loses it, a waiter gets the lock", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("expiry", { lease: "400 millis" })
      const scope = yield* Scope.make()
      const started = Date.now()
      const lease = yield* Scope.extend(Lock.acquire(lock), scope)
      // held by a fiber of its own, never released
      const waiter = yield* Lock.withLock((next) => Effect.succeed(next.fence), lock, { timeout: "10 seconds" }).pipe(
        Effect.fork
      )
      const lost = yield* Effect.flip(lease.lost)
      assert.strictEqual(lost._tag, "LockLost")
      const fence = yield* Fiber.join(waiter)
      assert.isAtLeast(Date.now() - started, 350)
      assert.isAbove(fence, lease.fence)
      assert.strictEqual(yield* lease.state, "Lost")
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(RedisMock.layer)))

  it.live("each build of the layer has data of its own", () =>
    Effect.gen(function*() {
      const holding = yield* Deferred.make<void>()
      const done = yield* Deferred.make<void>()
      const holder = yield* Effect.gen(function*() {
        const lock = yield* Lock.make("shared-name")
        yield* Lock.withLock(Effect.zipRight(Deferred.succeed(holding, undefined), Deferred.await(done)), lock)
      }).pipe(Effect.provide(RedisMock.layer), Effect.fork)
      yield* Deferred.await(holding)
      const other = yield* Effect.gen(function*() {
        const lock = yield* Lock.make("shared-name")
        return yield* Lock.isLocked(lock)
      }).pipe(Effect.provide(RedisMock.layer))
      assert.isFalse(other)
      yield* Deferred.succeed(done, undefined)
      yield* Fiber.join(holder)
    }))
})

describe("RedisMock.layerDataLoss", () => {
  it.live("wipe empties the mock under the running backend", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("wiped", { watchdog: "3 seconds" })
      const { wipe } = yield* FaultyBackend.DataLoss
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock)
        assert.isTrue(yield* Lock.isLocked(lock))
        yield* wipe
        assert.isFalse(yield* Lock.isLocked(lock))
      }))
      // the backend goes on working on the empty mock
      const fence = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
      assert.isAbove(fence, 0)
    }).pipe(Effect.provide(RedisMock.layerDataLoss)))
})
