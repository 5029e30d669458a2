// An ES module program, run with plain node against the packed packages: a lock on the memory
// backend and on a real redis-server (started by @lockstep/testkit's root, outside any test runner).
import { Effect, Metric } from "effect"
import { Lock, LockMetrics } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/testkit"
import { createRequire } from "node:module"

const ioredisPackage = createRequire(import.meta.url)("ioredis/package.json")

const twoGrants = (label) =>
  Effect.gen(function* () {
    const lock = yield* Lock.make("consumer:orders:42", { name: "consumer" })
    const first = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
    const second = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
    if (!(second > first)) return yield* Effect.dieMessage(`${label}: fences out of order: ${first}, ${second}`)
    const mine = yield* Lock.withLock(Lock.isHeldByCurrentFiber(lock), lock)
    console.log(`esm ${label}: two grants, fences ${first} < ${second}, held by me inside: ${mine}`)
  })

const program = Effect.gen(function* () {
  yield* twoGrants("memory").pipe(Effect.provide(MemoryBackend.layer))
  const server = yield* RedisServer.make()
  yield* twoGrants(`redis ${server.url} (ioredis ${ioredisPackage.version})`).pipe(
    Effect.provide(RedisBackend.layerFrom(server.url))
  )
  const granted = yield* Metric.value(LockMetrics.acquisitions.pipe(Metric.tagged("kind", "Lock"), Metric.tagged("name", "consumer"), Metric.tagged("outcome", "granted")))
  console.log(`esm lockstep_acquisitions_total{kind="Lock",name="consumer",outcome="granted"} ${granted.count}`)
}).pipe(Effect.scoped)

await Effect.runPromise(program)
