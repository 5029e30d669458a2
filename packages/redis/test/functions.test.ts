/**
 * The scripts as Redis Functions (calls.ts, scripts/library.ts) on a real redis-server: loaded
 * once and called with FCALL; EVALSHA where the server or the user refuses them (an ACL user
 * without FCALL or FUNCTION LOAD, a server without FCALL); the library loaded again when the
 * server lost it; two versions side by side; a function's refused command named as a script's is.
 */
import { assert, describe, it } from "@effect/vitest"
import type { Scope } from "effect"
import { Context, Effect, Layer, Option } from "effect"
import type { Redis } from "ioredis"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import { permissionError } from "../src/internal/redisBackend.js"
import * as library from "../src/internal/scripts/library.js"
import { base, fence, prelude, quarantine } from "../src/internal/scripts/shared.js"
import * as scripts from "../src/internal/scripts/lock.js"
import {
  backendOn,
  call,
  commandStats,
  fastTuning,
  rawClient,
  runnable,
  warnIfNotRun,
  withBackend
} from "./fixtures/realRedis.js"

warnIfNotRun("Redis Functions suite (functions.test.ts)")

/** Script calls by command since the last CONFIG RESETSTAT. */
const scriptCalls = (raw: Redis) =>
  Effect.map(call(raw, "INFO", "commandstats"), (info) => {
    const stats = commandStats(String(info))
    return { fcall: stats.get("fcall") ?? 0, evalsha: stats.get("evalsha") ?? 0, eval: stats.get("eval") ?? 0 }
  })

/** The libraries loaded on the server, by name. */
const libraries = (raw: Redis) =>
  Effect.map(
    call(raw, "FUNCTION", "LIST"),
    (list) => (list as ReadonlyArray<ReadonlyArray<unknown>>).map((entry) => String(entry[1]))
  )

/** A few lock cycles on `backend`, each granted. */
const cycles = (backend: Service, key: string, n = 5) =>
  Effect.gen(function*() {
    const lock = yield* Lock.make(key).pipe(withBackend(backend))
    for (let i = 0; i < n; i++) {
      const held = yield* Effect.scoped(Effect.map(Lock.tryAcquire(lock), Option.isSome)).pipe(withBackend(backend))
      assert.isTrue(held, "the lock was not granted")
    }
  })

/** A backend on `server` as `user` (password `pw`, created by the admin connection with `rule`). */
const backendAs = (
  server: RedisServer.RedisServer,
  raw: Redis,
  user: string,
  rule: ReadonlyArray<string>
): Effect.Effect<Service, unknown, Scope.Scope> =>
  Effect.zipRight(
    call(raw, "ACL", "SETUSER", user, "on", ">pw", "resetkeys", "resetchannels", "~*", "&*", ...rule),
    backendOn(`redis://${user}:pw@${server.host}:${server.port}`)
  )

/** The commands the scripts call, as the README's ACL rule grants them. */
const scriptCommands = [
  "-@all", "+ping", "+info", "+evalsha", "+eval", "+subscribe", "+unsubscribe", "+time", "+type", "+exists", "+get",
  "+set", "+mget", "+del", "+decr", "+pexpire", "+pttl", "+hget", "+hgetall", "+hmget", "+hset", "+hdel", "+hexists",
  "+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zremrangebyscore", "+zscore", "+zmscore", "+publish"
]

describe("the function library", () => {
  it("defines each helper once, at library level, well below Lua 5.1's 60 upvalues per function", () => {
    const helperNames = [prelude, fence, quarantine, base].flatMap((helper) =>
      [...helper.matchAll(/^local (?:function )?([a-z_]+)/gm)].map((m) => m[1]!)
    )
    // every local of the library chunk may be an upvalue of every function
    assert.isBelow(helperNames.length, 40)
    for (const s of library.scripts) {
      const body = library.bodyOf(s)
      for (const name of helperNames) {
        assert.notMatch(body, new RegExp(`^local function ${name}\\(`, "m"), `${s.name} defines ${name} again`)
      }
    }
    // the version is in the library's name and in every function's
    assert.match(library.libraryName, /^lockstep_[0-9a-f]{16}$/)
    for (const s of library.scripts) assert.isTrue(library.functionOf(s).startsWith(`${library.libraryName}_`))
    assert.notInclude(library.source, "REPLACE")
  })

  it("a function's refused command is named from the library's line, as a script's is from its own", () => {
    const line = library.lines.findIndex((l) => l.includes("redis.call('EXISTS', key, ended, sentinel)")) + 1
    assert.isAbove(line, 0)
    const refusal = new Error(
      "ERR The user executing the script can't run this command or subcommand " +
        `script: ${library.functionOf(scripts.acquire)}, on @user_function:${line}.`
    )
    const error = permissionError(scripts.acquire, refusal)
    assert.instanceOf(error, Error)
    assert.match((error as Error).message, /^NOPERM this user has no permissions to run the EXISTS command, in the acquire script/)
  })
})

describe.runIf(runnable)("Redis Functions on a real redis-server", () => {
  it.scopedLive("the library is loaded once and every call is an FCALL", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url)
      yield* cycles(backend, "functions-used", 1)
      assert.deepStrictEqual(yield* libraries(raw), [library.libraryName])
      yield* call(raw, "CONFIG", "RESETSTAT")
      yield* cycles(backend, "functions-used", 10)
      const calls = yield* scriptCalls(raw)
      assert.strictEqual(calls.fcall, 20)
      assert.strictEqual(calls.evalsha + calls.eval, 0)
      const loads = commandStats(String(yield* call(raw, "INFO", "commandstats"))).get("function|load")
      assert.isUndefined(loads, "the library was loaded again")
    }))

  it.scopedLive("a library lost by the server (FUNCTION FLUSH, a restart without persistence) is loaded again", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url)
      yield* cycles(backend, "functions-flushed", 1)
      yield* call(raw, "FUNCTION", "FLUSH")
      // many calls at once meet the missing library: one load serves them
      yield* Effect.forEach(
        Array.from({ length: 20 }, (_, i) => i),
        (i) => cycles(backend, `functions-flushed:${i}`, 2),
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(yield* libraries(raw), [library.libraryName])
      yield* server.restart
      yield* Effect.eventually(cycles(backend, "functions-restarted", 1))
      yield* call(raw, "CONFIG", "RESETSTAT")
      yield* cycles(backend, "functions-restarted", 3)
      const calls = yield* scriptCalls(raw)
      assert.strictEqual(calls.fcall, 6)
      assert.strictEqual(calls.evalsha + calls.eval, 0)
    }))

  it.scopedLive("two versions on one server: each loads and calls its own library, neither replaces the other", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      // another version of lockstep, loaded first: the same code under another version's names
      const other = library.source.replaceAll(library.libraryName, "lockstep_0123456789abcdef")
      assert.strictEqual(yield* call(raw, "FUNCTION", "LOAD", other), "lockstep_0123456789abcdef")
      const backend = yield* backendOn(server.url)
      yield* cycles(backend, "functions-versions")
      assert.sameMembers(yield* libraries(raw), ["lockstep_0123456789abcdef", library.libraryName])
      // the other version's functions still answer, on the same layout: they see this version's hold
      const lock = yield* Lock.make("functions-versions:shared").pipe(withBackend(backend))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(lock)
        const keys = scripts.keysOf("functions-versions:shared", scripts.endedKeyOf("functions-versions:shared", "other:1"))
        const reply = yield* call(
          raw,
          "FCALL",
          "lockstep_0123456789abcdef_acquire",
          keys.length,
          ...keys,
          "other:1",
          "x",
          1,
          1,
          30_000,
          "0",
          5_000,
          1,
          "0",
          "0"
        )
        assert.strictEqual(Number((reply as ReadonlyArray<unknown>)[0]), 0, "the other version granted a held lock")
      })).pipe(withBackend(backend))
    }))

  it.scopedLive("an ACL user without FCALL or FUNCTION LOAD runs the scripts with EVALSHA", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      // the README's rule: no FCALL
      const plain = yield* backendAs(server, raw, "plain", scriptCommands)
      yield* cycles(plain, "functions-acl-plain")
      // FCALL but no FUNCTION LOAD, on a server without the library
      const callOnly = yield* backendAs(server, raw, "callonly", [...scriptCommands, "+fcall"])
      yield* cycles(callOnly, "functions-acl-callonly")
      assert.deepStrictEqual(yield* libraries(raw), [])
      const before = yield* scriptCalls(raw)
      yield* cycles(plain, "functions-acl-plain", 3)
      yield* cycles(callOnly, "functions-acl-callonly", 3)
      const after = yield* scriptCalls(raw)
      assert.strictEqual(after.evalsha - before.evalsha, 12)
      assert.strictEqual(after.fcall - before.fcall, 0, "a backend that met a refusal tried FCALL again")
      // with both, the library is loaded and used
      const both = yield* backendAs(server, raw, "both", [...scriptCommands, "+fcall", "+function|load"])
      yield* cycles(both, "functions-acl-both")
      assert.deepStrictEqual(yield* libraries(raw), [library.libraryName])
      // FCALL without FUNCTION LOAD, once another process loaded the library: FCALL
      const later = yield* backendAs(server, raw, "callonly2", [...scriptCommands, "+fcall"])
      const fcalls = (yield* scriptCalls(raw)).fcall
      yield* cycles(later, "functions-acl-later", 3)
      assert.strictEqual((yield* scriptCalls(raw)).fcall - fcalls, 6)
    }))

  it.scopedLive("a function's refused command fails with a BackendError naming it", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make()
      const raw = yield* rawClient(server.url)
      const backend = yield* backendAs(server, raw, "noexists", [
        ...scriptCommands.filter((c) => c !== "+exists"),
        "+fcall",
        "+function|load"
      ])
      const lock = yield* Lock.make("functions-refused").pipe(withBackend(backend))
      const error = yield* Effect.flip(Effect.scoped(Lock.tryAcquire(lock))).pipe(withBackend(backend))
      assert.strictEqual(error._tag, "BackendError")
      assert.match(error.message, /NOPERM this user has no permissions to run the EXISTS command, in the acquire script/)
      assert.match(error.message, /@user_function:/)
    }))

  it.scopedLive("a server without FCALL (renamed away, as before Redis 7) runs the scripts with EVALSHA", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--rename-command", "FCALL", ""] })
      const raw = yield* rawClient(server.url)
      const backend = yield* backendOn(server.url)
      yield* cycles(backend, "functions-none", 1)
      yield* call(raw, "CONFIG", "RESETSTAT")
      yield* cycles(backend, "functions-none", 4)
      const calls = yield* scriptCalls(raw)
      assert.strictEqual(calls.evalsha, 8)
      assert.strictEqual(calls.fcall, 0)
    }))

  it.scopedLive("on a Redis Cluster, every master gets the library, and a node that lost it loads it again", () =>
    Effect.gen(function*() {
      const cluster = yield* Effect.orDie(RedisServer.makeCluster({ masters: 3 }))
      const raws = yield* Effect.forEach(cluster.nodes, (node) => rawClient(node.url))
      const backend = yield* Effect.map(
        Layer.build(RedisBackend.layerFrom({ cluster: cluster.startupNodes }, fastTuning)),
        Context.get(LockBackend)
      )
      // keys in many slots: every master serves some
      const keys = Array.from({ length: 12 }, (_, i) => `functions-cluster:${i}`)
      for (const key of keys) yield* cycles(backend, key, 1)
      for (const raw of raws) assert.deepStrictEqual(yield* libraries(raw), [library.libraryName])
      // one node loses its functions (as a node restarted without persistence would)
      yield* call(raws[0]!, "FUNCTION", "FLUSH")
      for (const raw of raws) yield* call(raw, "CONFIG", "RESETSTAT")
      for (const key of keys) yield* cycles(backend, key, 2)
      for (const raw of raws) assert.deepStrictEqual(yield* libraries(raw), [library.libraryName])
      const evalshas = yield* Effect.forEach(raws, (raw) => Effect.map(scriptCalls(raw), (c) => c.evalsha + c.eval))
      assert.deepStrictEqual(evalshas, [0, 0, 0], "a node fell back to EVALSHA")
    }))

  it.scopedLive("with replica acknowledgement, the acknowledged calls are FCALLs too", () =>
    Effect.gen(function*() {
      const primary = yield* RedisServer.make()
      const replica = yield* RedisServer.make({ args: ["--replicaof", primary.host, String(primary.port)] })
      const raw = yield* rawClient(primary.url)
      const replicaRaw = yield* rawClient(replica.url)
      yield* Effect.eventually(Effect.flatMap(call(replicaRaw, "INFO", "replication"), (info) =>
        String(info).includes("master_link_status:up") ? Effect.void : Effect.fail("not yet")))
      const backend = yield* backendOn(primary.url, { commandTimeout: "2 seconds", replication: { replicas: 1 } })
      yield* cycles(backend, "functions-replicated", 1)
      yield* call(raw, "CONFIG", "RESETSTAT")
      yield* cycles(backend, "functions-replicated", 3)
      const calls = yield* scriptCalls(raw)
      const stats = commandStats(String(yield* call(raw, "INFO", "commandstats")))
      assert.strictEqual(calls.fcall, 6)
      assert.strictEqual(calls.evalsha + calls.eval, 0)
      assert.strictEqual(stats.get("wait"), 3, "each grant was acknowledged")
      // the replica has the library too: a promoted replica needs no load
      assert.deepStrictEqual(yield* libraries(replicaRaw), [library.libraryName])
    }))
})
