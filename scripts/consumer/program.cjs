// program.mjs as a CommonJS program: the same locks through require(), which loads the packages'
// CommonJS build (dist/cjs).
const { Config, ConfigProvider, Effect, Redacted } = require("effect")
const { Redis } = require("ioredis")
const { Lock, Semaphore } = require("@lockstep/core")
const { MemoryBackend } = require("@lockstep/memory")
const { RedisBackend } = require("@lockstep/redis")
const { SqlBackend } = require("@lockstep/sql")
const { RedisServer } = require("@lockstep/servers")

const format = "cjs"
const ioredis = require("ioredis/package.json").version
const check = (ok, message) => (ok ? Effect.void : Effect.dieMessage(`${format}: ${message}`))

const session = (label) =>
  Effect.gen(function* () {
    const lock = yield* Lock.make("consumer:orders:43", { name: "consumer" })
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
  const client = new Redis(server.url)
  yield* Effect.addFinalizer(() => Effect.promise(() => client.quit()))
  yield* session(`redis ${server.url} ioredis ${ioredis} layer({ client })`).pipe(
    Effect.provide(RedisBackend.layer({ client }))
  )
  const left = yield* Effect.promise(() => client.exists("consumer:orders:43"))
  yield* check(left === 0, `the lock's hash is still in Redis after its release`)
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

for (const specifier of ["@lockstep/core/internal/lock", "@lockstep/core/internal/lock.js", "@lockstep/redis/dist/cjs/index.js"]) {
  let outcome = "required"
  try {
    require(specifier)
  } catch (error) {
    outcome = error.code
  }
  if (outcome !== "ERR_PACKAGE_PATH_NOT_EXPORTED") throw new Error(`${format}: require("${specifier}"): ${outcome}`)
}
console.log(`${format}: @lockstep/core/internal/* and dist/ paths are not exported (ERR_PACKAGE_PATH_NOT_EXPORTED)`)

Effect.runPromise(program).catch((error) => {
  console.error(error)
  process.exit(1)
})
