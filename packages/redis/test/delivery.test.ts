/**
 * At-least-once delivery on a real redis-server: the connection is reset right after the server
 * executed a command and before its reply reached the client, so ioredis re-sends the command on
 * its new connection (`autoResendUnfulfilledCommands`, on by default) and the server runs it twice.
 */
import { createHash } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import { Lock } from "@lockstep/core"
import { RedisServer, TcpProxy } from "@lockstep/servers"
import { functionOf } from "../src/internal/scripts/library.js"
import type { Script } from "../src/internal/scripts/descriptor.js"
import * as scripts from "../src/internal/scripts/lock.js"
import { backendOn, call, rawClient, runnable, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("Redis delivery suite (delivery.test.ts)")

const sha = (lua: string) => createHash("sha1").update(lua).digest("hex")
/** What names a script in the command that runs it: its SHA1 (EVALSHA) or its function (FCALL). */
const namesOf = (script: Script) => [sha(script.lua), functionOf(script)]
const releaseNames = namesOf(scripts.release)
const acquireNames = namesOf(scripts.acquire)
const runs = (names: ReadonlyArray<string>) => (data: string) => names.some((name) => data.includes(name))
/** Scripts the server has run so far (EVALSHA and FCALL calls). */
const scriptsRun = (raw: Parameters<typeof call>[0]) =>
  Effect.map(call(raw, "INFO", "commandstats"), (info) =>
    ["evalsha", "fcall"].reduce(
      (sum, command) => sum + Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(String(info))?.[1] ?? 0),
      0
    ))

// long enough for ioredis to reconnect and re-send before the call gives up
const tuning = { commandTimeout: "3 seconds" } as const

describe.runIf(runnable)("Redis backend under re-sent commands", () => {
  it.scopedLive("a re-entrant release executed twice takes one hold: no one else gets the lock", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const proxy = yield* TcpProxy.make(server)
      const raw = yield* rawClient(server.url)
      const holder = yield* backendOn(proxy.url, tuning)
      const other = yield* backendOn(server.url, tuning)
      const key = "delivery-release"
      const lock = yield* Lock.make(key).pipe(withBackend(holder))
      const otherLock = yield* Lock.make(key).pipe(withBackend(other))
      yield* Effect.scoped(Effect.gen(function*() {
        const outer = yield* Lock.acquire(lock)
        yield* Effect.scoped(Lock.acquire(lock))
        const fired = yield* proxy.arm({ kind: "replyLost", match: runs(releaseNames) })
        const before = yield* scriptsRun(raw)
        yield* Effect.scoped(Lock.acquire(lock))
        yield* fired.pipe(Effect.timeout("5 seconds"))
        // acquire, release, and the release again
        assert.strictEqual((yield* scriptsRun(raw)) - before, 3, "the release was not executed twice")
        // the re-sent release ran as well, yet the outer hold is intact
        const fields = (yield* call(raw, "HGETALL", key)) as ReadonlyArray<string>
        assert.strictEqual(fields[fields.indexOf(outer.holder) + 1], "1", `hash after the re-sent release: ${fields.join(" ")}`)
        assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(otherLock))), "another process took a held lock")
      }))
      assert.strictEqual(yield* call(raw, "EXISTS", key), 0)
    }))

  it.scopedLive("an acquisition executed twice takes one hold: the lock is free after the release", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const proxy = yield* TcpProxy.make(server)
      const raw = yield* rawClient(server.url)
      const holder = yield* backendOn(proxy.url, tuning)
      const key = "delivery-acquire"
      const lock = yield* Lock.make(key).pipe(withBackend(holder))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock)
        const fired = yield* proxy.arm({ kind: "replyLost", match: runs(acquireNames) })
        const before = yield* scriptsRun(raw)
        yield* Lock.acquire(lock)
        yield* fired.pipe(Effect.timeout("5 seconds"))
        assert.strictEqual((yield* scriptsRun(raw)) - before, 2, "the acquisition was not executed twice")
        assert.strictEqual(yield* Lock.holdCount(lock), 2)
      }))
      assert.strictEqual(yield* call(raw, "EXISTS", key), 0, "a hold was left behind")
    }))
})
