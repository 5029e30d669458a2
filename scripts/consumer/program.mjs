// An ES module program, run with plain node in a project that installed the packed tarballs with
// npm (scripts/consumer-check.sh): it takes and releases locks on the memory backend and on a real
// redis-server that @lockstep/servers' root starts on a free loopback port, outside any test
// runner. It prints what it did and exits non-zero on any failure. program.cjs is the same in
// CommonJS.
import { Config, ConfigProvider, Effect, Redacted } from "effect"
import { Redis } from "ioredis"
import { Lock, Semaphore } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"
import { RedisBackend } from "@lockstep/redis"
import { SqlBackend } from "@lockstep/sql"
import { RedisServer } from "@lockstep/servers"
import { createRequire } from "node:module"

const format = "esm"
const ioredis = createRequire(import.meta.url)("ioredis/package.json").version
const check = (ok, message) => (ok ? Effect.void : Effect.dieMessage(`${format}: ${message}`))

// take a lock, hold it (re-entering once), release it, and take it again: the second grant has a
// higher fence; then a semaphore's permits
const session = (label) =>
  Effect.gen(function* () {
    const lock = yield* Lock.make("consumer:orders:42", { name: "consumer" })
    const first = yield* Effect.scoped(
      Effect.gen(function* () {
        const lease = yield* Lock.acquire(lock)
        const again = yield* Lock.acquire(lock)
        const count = yield* Lock.holdCount(lock)
        yield* check(again.fence === lease.fence && count === 2, `${label}: re-entry gave fence ${again.fence}, count ${count}`)
        return lease.fence
      })
    )
    const free = yield* Lock.holdCount(lock)
    yield* check(free === 0, `${label}: still held after its scope closed (count ${free})`)
    const second = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
    yield* check(second > first, `${label}: fences out of order: ${first}, ${second}`)
    const mine = yield* Lock.withLock(Lock.isHeldByCurrentFiber(lock), lock)
    const quota = yield* Semaphore.make("consumer:quota", { limit: 3 })
    const left = yield* Semaphore.withPermits(Semaphore.available(quota), quota, { permits: 2 })
    console.log(
      `${format} ${label}: acquired fence ${first} (re-entered, hold count 2), released; ` +
        `acquired again fence ${second} > ${first}, released; held by me inside withLock: ${mine}; ` +
        `semaphore: 2 of 3 permits taken, ${left} left`
    )
  })

const program = Effect.gen(function* () {
  yield* session("memory").pipe(Effect.provide(MemoryBackend.layer))

  const server = yield* RedisServer.make()
  // on a client the program owns, as RedisBackend.layer({ client }) borrows it
  const client = new Redis(server.url)
  yield* Effect.addFinalizer(() => Effect.promise(() => client.quit()))
  yield* session(`redis ${server.url} ioredis ${ioredis} layer({ client })`).pipe(
    Effect.provide(RedisBackend.layer({ client }))
  )
  const left = yield* Effect.promise(() => client.exists("consumer:orders:42"))
  yield* check(left === 0, `the lock's hash is still in Redis after its release`)
  // on connections the layer opens itself, from REDIS_URL
  yield* session(`redis ${server.url} ioredis ${ioredis} layerConfig()`).pipe(
    Effect.provide(RedisBackend.layerConfig()),
    Effect.withConfigProvider(ConfigProvider.fromMap(new Map([["REDIS_URL", server.url]])))
  )
  // @lockstep/sql on PostgreSQL, through the driver package the URL names (a database of the check's own)
  const postgres = process.env["LOCKSTEP_CONSUMER_PG_URL"]
  yield* check(postgres !== undefined, "LOCKSTEP_CONSUMER_PG_URL is not set")
  yield* session(`sql ${postgres} layerConfig`).pipe(
    Effect.provide(SqlBackend.layerConfig(Config.succeed(Redacted.make(postgres))))
  )
}).pipe(Effect.scoped)

// implementation modules are not part of the package
for (const specifier of ["@lockstep/core/internal/lock", "@lockstep/core/internal/lock.js", "@lockstep/redis/dist/esm/index.js"]) {
  const outcome = await import(specifier).then(() => "imported", (error) => error.code)
  if (outcome !== "ERR_PACKAGE_PATH_NOT_EXPORTED") throw new Error(`${format}: import("${specifier}"): ${outcome}`)
}
console.log(`${format}: @lockstep/core/internal/* and dist/ paths are not exported (ERR_PACKAGE_PATH_NOT_EXPORTED)`)

await Effect.runPromise(program)
