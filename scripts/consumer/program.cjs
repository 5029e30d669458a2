// The same as program.mjs, as a CommonJS program.
const { Effect } = require("effect")
const { Lock } = require("@lockstep/core")
const { MemoryBackend } = require("@lockstep/memory")
const { RedisBackend } = require("@lockstep/redis")
const { RedisServer } = require("@lockstep/testkit")
const ioredisVersion = require("ioredis/package.json").version

const twoGrants = (label) =>
  Effect.gen(function* () {
    const lock = yield* Lock.make("consumer:orders:43")
    const first = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
    const second = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
    if (!(second > first)) return yield* Effect.dieMessage(`${label}: fences out of order: ${first}, ${second}`)
    console.log(`cjs ${label}: two grants, fences ${first} < ${second}`)
  })

const program = Effect.gen(function* () {
  yield* twoGrants("memory").pipe(Effect.provide(MemoryBackend.layer))
  const server = yield* RedisServer.make()
  yield* twoGrants(`redis ${server.url} (ioredis ${ioredisVersion})`).pipe(Effect.provide(RedisBackend.layerFrom(server.url)))
}).pipe(Effect.scoped)

Effect.runPromise(program).catch((error) => {
  console.error(error)
  process.exit(1)
})
