// A TypeScript consumer, type-checked against the packed packages' declarations only.
import { Effect, Option, Schedule } from "effect"
import { Redis } from "ioredis"
import { FairLock, Lock, LockMetrics, MultiLock, ReadWriteLock, RedLock, Semaphore } from "@lockstep/core"
import type { Lease, LockError } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"
import { RedisBackend } from "@lockstep/redis"
import { History } from "@lockstep/testkit"
import { RedisServer } from "@lockstep/servers"
import * as Conformance from "@lockstep/testkit/Conformance"

export const fenceOf = (lease: Lease.Lease): number => lease.fence

export const program: Effect.Effect<Option.Option<number>, LockError.AcquireError | LockError.LockLost> = Effect.gen(function* () {
  const lock = yield* Lock.make("orders:42", { name: "orders" })
  const fair = yield* FairLock.make("orders:fair")
  const rw = yield* ReadWriteLock.make("orders:rw")
  const sem = yield* Semaphore.make("quota", { limit: 2 })
  const both = yield* MultiLock.make(lock, fair)
  yield* Lock.withLock(Effect.void, rw.read, { retry: Schedule.recurs(3) })
  yield* Semaphore.withPermits(Effect.void, sem)
  yield* MultiLock.withLock((lease) => Effect.log(lease.parts.length), both)
  return yield* Lock.withLockIfAvailable((lease) => Effect.succeed(fenceOf(lease)), lock, { wait: "1 second" })
}).pipe(Effect.provide(MemoryBackend.layer))

export const onRedis = program.pipe(Effect.provide(RedisBackend.layer({ client: new Redis() })))
export const quorum = RedLock.layer
export const metric = LockMetrics.acquisitions
export const server = RedisServer.make
export const checker = History
export const suite = Conformance.suite
