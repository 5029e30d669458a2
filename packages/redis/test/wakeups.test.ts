/**
 * The wake-up hub of the Redis backend, without a server: which waiters a message wakes, and how
 * long a channel stays subscribed.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Option, Scope } from "effect"
import { BackendKit } from "@lockstep/core"
import { makeWakeups, wakeCode } from "../src/internal/wakeups.js"

const fakeConnection = () => {
  const log: Array<string> = []
  return {
    log,
    connection: {
      subscribe: (channel: string) => {
        log.push(`subscribe ${channel}`)
        return Promise.resolve()
      },
      unsubscribe: (channel: string) => {
        log.push(`unsubscribe ${channel}`)
        return Promise.resolve()
      }
    }
  }
}

const hub = (idleMs = 1_000) => {
  const fake = fakeConnection()
  const lifecycle = BackendKit.makeLifecycle({ backend: "Redis backend" })
  const wakeups = makeWakeups(fake.connection, (ready) => Effect.promise(() => ready), lifecycle, idleMs)
  return { ...fake, wakeups }
}

/** Whether the subscription's `await` completes at once (a wake-up is pending or arrives). */
const woken = (await_: Effect.Effect<void>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.fork(await_)
    yield* Effect.yieldNow()
    const done = Option.isSome(yield* Fiber.poll(fiber))
    yield* Fiber.interrupt(fiber)
    return done
  })

describe("wake-up hub", () => {
  it("wake codes are numbers a Java long holds, never 0, 1 or 2, and differ per holder", () => {
    const codes = Array.from({ length: 1000 }, (_, i) => wakeCode(`6f1c0e2a-0000-4000-8000-000000000000:${i}`))
    for (const code of codes) {
      assert.match(code, /^\d+$/)
      assert.isAtLeast(Number(code), 3)
      assert.isBelow(Number(code), 2 ** 53)
    }
    assert.strictEqual(new Set(codes).size, codes.length)
  })

  it.scoped("a hand-off wakes the waiter it names and is taken once, only if its fence is above the waiter's last denial", () =>
    Effect.gen(function*() {
      const { wakeups } = hub()
      const a = yield* wakeups.subscribe("ch", "c:1", "exclusive")
      const b = yield* wakeups.subscribe("ch", "c:2", "exclusive")
      const handOff = (holder: string, fence: number) => {
        wakeups.onMessage("ch", `1${wakeCode(holder).padStart(17, "0")}`)
        wakeups.onMessage("ch", String(fence))
      }
      // before any denial: no floor, nothing to rely on (it still wakes the waiter, which looks again)
      handOff("c:1", 1_000)
      assert.isTrue(yield* woken(a.await))
      assert.isUndefined(yield* a.takeHandOff!)
      // denied with floor 1000, asking for claims of 500 ms
      wakeups.denied("ch", "c:1", wakeCode("c:1"), 1_000, 500)
      // a stale one (a fence not above the floor: granted before that denial was processed)
      handOff("c:1", 1_000)
      assert.isTrue(yield* woken(a.await))
      assert.isUndefined(yield* a.takeHandOff!)
      // a fresh one: taken once; a copy of it later is not taken again
      handOff("c:1", 1_001)
      assert.isFalse(yield* woken(b.await), "a hand-off woke another waiter")
      assert.isTrue(yield* woken(a.await))
      assert.deepStrictEqual(yield* a.takeHandOff!, { fence: 1_001, claimMs: 500 })
      assert.isUndefined(yield* a.takeHandOff!)
      // the two messages are one: a 0 right after the first is not taken as a plain 0
      assert.isFalse(yield* woken(b.await))
      // a waiter that asked for no claim (0 ms) relies on none
      wakeups.denied("ch", "c:2", wakeCode("c:2"), 1_000, 0)
      handOff("c:2", 2_000)
      assert.isTrue(yield* woken(b.await))
      assert.isUndefined(yield* b.takeHandOff!)
      // a hand-off to a waiter of another process wakes no one here
      handOff("c:99", 3_000)
      assert.isFalse(yield* woken(a.await))
      assert.isFalse(yield* woken(b.await))
    }))

  it.scoped("a code wakes only the waiter it names; the 0 that follows '-<code>' wakes no one", () =>
    Effect.gen(function*() {
      const { wakeups } = hub()
      const a = yield* wakeups.subscribe("ch", "c:1", "exclusive")
      const b = yield* wakeups.subscribe("ch", "c:2", "exclusive")
      wakeups.onMessage("ch", `-${wakeCode("c:2")}`)
      wakeups.onMessage("ch", "0")
      assert.isFalse(yield* woken(a.await), "the 0 of a targeted release woke another waiter")
      assert.isTrue(yield* woken(b.await))
      // a later 0 (Redisson's unlock) wakes the longest-waiting one
      wakeups.onMessage("ch", "0")
      assert.isTrue(yield* woken(a.await))
      // a code of a waiter in another process wakes no one here
      wakeups.onMessage("ch", wakeCode("c:99"))
      assert.isFalse(yield* woken(a.await))
      assert.isFalse(yield* woken(b.await))
    }))

  it.scoped("'-1' and the 0 that follows wake no one: a release that had no lockstep waiter to wake", () =>
    Effect.gen(function*() {
      const { wakeups } = hub()
      const readers = yield* Effect.forEach([1, 2, 3], (i) => wakeups.subscribe("ch", `c:${i}`, "shared"))
      wakeups.onMessage("ch", "-1")
      wakeups.onMessage("ch", "0")
      for (const reader of readers) assert.isFalse(yield* woken(reader.await))
      // a 0 alone (Redisson's unlock, or a release that knew of no registered waiter) wakes the
      // longest-waiting one only, shared or not: no herd
      wakeups.onMessage("ch", "0")
      assert.deepStrictEqual(yield* Effect.forEach(readers, (reader) => woken(reader.await)), [true, false, false])
    }))

  it.scoped("2 wakes every shared waiter, and no exclusive one", () =>
    Effect.gen(function*() {
      const { wakeups } = hub()
      const writer = yield* wakeups.subscribe("ch", "c:1", "exclusive")
      const readers = yield* Effect.forEach([2, 3, 4], (i) => wakeups.subscribe("ch", `c:${i}`, "shared"))
      wakeups.onMessage("ch", "2")
      assert.isFalse(yield* woken(writer.await))
      for (const reader of readers) assert.isTrue(yield* woken(reader.await))
    }))

  it.effect("a channel stays subscribed for a while after its last waiter left, and is reused", () =>
    Effect.gen(function*() {
      const { log, wakeups } = hub(60_000)
      for (let i = 0; i < 5; i++) {
        yield* Effect.scoped(wakeups.subscribe("ch", `c:${i}`, "exclusive"))
      }
      assert.deepStrictEqual(log, ["subscribe ch"], "one SUBSCRIBE for five waits, no UNSUBSCRIBE in between")
      assert.strictEqual(wakeups.channelCount(), 1)
      wakeups.close()
    }))

  it.live("an idle channel is unsubscribed once its grace period passed", () =>
    Effect.gen(function*() {
      const { log, wakeups } = hub(50)
      yield* Effect.scoped(wakeups.subscribe("ch", "c:1", "exclusive"))
      yield* Effect.sleep(150)
      assert.deepStrictEqual(log, ["subscribe ch", "unsubscribe ch"])
      assert.strictEqual(wakeups.channelCount(), 0)
      yield* Effect.scoped(wakeups.subscribe("ch", "c:2", "exclusive"))
      assert.deepStrictEqual(log, ["subscribe ch", "unsubscribe ch", "subscribe ch"])
      wakeups.close()
    }))

  it.effect("a registered waiter that leaves without a grant gives its entry back; one granted does not", () =>
    Effect.gen(function*() {
      const { wakeups } = hub()
      const abandoned: Array<string> = []
      const abandon = (member: string) => void abandoned.push(member)
      // granted: its scope closes successfully
      yield* Effect.scoped(Effect.gen(function*() {
        yield* wakeups.subscribe("ch", "c:1", "exclusive", abandon)
        wakeups.registered("ch", "c:1", wakeCode("c:1"), "m1")
      }))
      // gives up: its scope closes with a failure
      const scope = yield* Scope.make()
      yield* wakeups.subscribe("ch", "c:2", "exclusive", abandon).pipe(Scope.extend(scope))
      wakeups.registered("ch", "c:2", wakeCode("c:2"), "m2")
      assert.isTrue(wakeups.isWaiting("ch", "c:2", wakeCode("c:2")))
      yield* Scope.close(scope, Exit.fail("timeout"))
      assert.isFalse(wakeups.isWaiting("ch", "c:2", wakeCode("c:2")))
      assert.deepStrictEqual(abandoned, ["m2"])
      wakeups.close()
    }))
})
