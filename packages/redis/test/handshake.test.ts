/**
 * Subscriptions asked for while the subscriber connection is still handshaking wait for it to be
 * ready (or closed), all on one pair of listeners: a burst of waiters never trips Node's
 * MaxListenersExceededWarning (10 listeners per event).
 */
import { EventEmitter } from "node:events"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Client } from "../src/RedisBackend.js"
import { whenNotHandshaking } from "../src/internal/clients.js"

/** A stand-in for an ioredis connection in its handshake (status `connect`). */
const handshaking = () => Object.assign(new EventEmitter(), { status: "connect" })

describe("commands while the subscriber handshakes", () => {
  it.effect("wait on one pair of listeners, run once it is ready, and leave no listener behind", () =>
    Effect.gen(function*() {
      const connection = handshaking()
      const ran: Array<number> = []
      const pending = Array.from({ length: 25 }, (_, i) =>
        whenNotHandshaking(connection as unknown as Client, () => {
          ran.push(i)
          return Promise.resolve(i)
        }))
      assert.isAtMost(connection.listenerCount("ready"), 1)
      assert.isAtMost(connection.listenerCount("close"), 1)
      assert.deepStrictEqual(ran, [])
      connection.status = "ready"
      connection.emit("ready")
      const results = yield* Effect.promise(() => Promise.all(pending))
      assert.deepStrictEqual(results, Array.from({ length: 25 }, (_, i) => i))
      assert.deepStrictEqual(ran, results, "in the order they were asked for")
      assert.strictEqual(connection.listenerCount("ready"), 0)
      assert.strictEqual(connection.listenerCount("close"), 0)
    }))

  it.effect("a close during the handshake lets them go out (ioredis queues them for the next connection)", () =>
    Effect.gen(function*() {
      const connection = handshaking()
      const pending = Array.from({ length: 3 }, (_, i) => whenNotHandshaking(connection as unknown as Client, () => Promise.resolve(i)))
      connection.status = "reconnecting"
      connection.emit("close")
      assert.deepStrictEqual(yield* Effect.promise(() => Promise.all(pending)), [0, 1, 2])
      assert.strictEqual(connection.listenerCount("ready") + connection.listenerCount("close"), 0)
    }))
})
