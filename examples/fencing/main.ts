/**
 * Fencing a write to PostgreSQL with the lease's fence. A lock alone cannot stop a holder that was
 * paused past its lease (a long GC pause, a stalled VM) from writing once it wakes, after the next
 * holder wrote: the database must refuse it. Each row keeps the fence of its last writer, and every
 * write is one UPDATE that applies only if the writer's fence is not older:
 *
 *   UPDATE accounts SET balance = $balance, fence = $fence WHERE id = $id AND fence <= $fence
 *
 * Holder A takes the lock (Redis) with a 1-second lease, writes, and pauses past its lease; holder
 * B gets the lock, with a higher fence, and writes; A wakes and writes: refused.
 *
 *   npx tsx examples/fencing/main.ts
 *   (REDIS_URL, default redis://127.0.0.1:6379; LOCKSTEP_PG_URL, default postgres://postgres@127.0.0.1:5432)
 *
 * Exits 0 when B's write stands and A's late write was refused; 1 otherwise.
 */
import { SqlClient } from "@effect/sql"
import { Console, Deferred, Effect, Exit, Layer } from "effect"
import { Lock } from "@lockstep/core"
import type { Lease } from "@lockstep/core"
import { temporaryDatabase } from "../shared/postgres.js"
import { redisLocks, runNamespace } from "../shared/redis.js"

/**
 * Writes the account's balance for the holder of `lease`, unless the row has already seen a newer
 * holder: the fence is compared in the statement that writes (`<=`: a holder may write again
 * under the same lease). `true` if the write was applied.
 */
const fencedWrite = (lease: Lease.Lease, balance: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const written = yield* sql`
      UPDATE accounts SET balance = ${balance}, fence = ${lease.fence}
      WHERE id = 'acct-1' AND fence <= ${lease.fence}
      RETURNING id`
    return written.length === 1
  })

const program = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE accounts (id text PRIMARY KEY, balance integer NOT NULL, fence bigint NOT NULL DEFAULT 0)`
  yield* sql`INSERT INTO accounts (id, balance) VALUES ('acct-1', 0)`

  const lock = yield* Lock.make("accounts:acct-1", { lease: "1 second" })
  const aWrote = yield* Deferred.make<void>()
  const bWrote = yield* Deferred.make<void>()

  // Lock.acquire rather than withLock: withLock would interrupt A once its lease is lost; a paused
  // process notices nothing of the kind, and it is the database that must stop it
  const holderA = Effect.scoped(Effect.gen(function*() {
    const lease = yield* Lock.acquire(lock)
    const first = yield* fencedWrite(lease, 100)
    yield* Console.log(`A: holds the lock with fence ${lease.fence}; writes balance 100: ${first ? "applied" : "REFUSED"}`)
    yield* Console.log("A: pauses (a stop-the-world GC, a stalled VM) past its 1-second lease")
    yield* Deferred.succeed(aWrote, undefined)
    yield* Deferred.await(bWrote)
    const late = yield* fencedWrite(lease, 90)
    yield* Console.log(
      `A: wakes (its lease: ${yield* lease.state}); writes balance 90 with fence ${lease.fence}: ${late ? "APPLIED" : "refused"}`
    )
    return { first, late }
  }))

  const holderB = Effect.zipRight(
    Deferred.await(aWrote),
    Lock.withLock(
      (lease) =>
        Effect.gen(function*() {
          const applied = yield* fencedWrite(lease, 250)
          yield* Console.log(`B: granted the lock once A's lease ran out, fence ${lease.fence}; writes balance 250: ${applied ? "applied" : "REFUSED"}`)
          yield* Deferred.succeed(bWrote, undefined)
          return applied
        }),
      lock
    )
  )

  const [a, b] = yield* Effect.all([holderA, holderB], { concurrency: "unbounded" })
  const [row] = yield* sql<{ balance: number; fence: string }>`SELECT balance, fence FROM accounts WHERE id = 'acct-1'`
  yield* Console.log(`the row: balance ${row?.balance}, fence ${row?.fence} (B's)`)
  if (!a.first || !b) return yield* Effect.fail("a write under a valid lease was refused")
  if (a.late || row?.balance !== 250) return yield* Effect.fail("A's late write overwrote B's")
  yield* Console.log("ok: the stale holder's write was refused (without the fence check it would have overwritten 250 with 90)")
})

const main = program.pipe(
  Effect.provide(Layer.merge(redisLocks(runNamespace("fencing")), temporaryDatabase("fencing")))
)

void Effect.runPromiseExit(main).then((exit) => {
  if (Exit.isFailure(exit)) console.error(String(exit.cause))
  process.exitCode = Exit.isSuccess(exit) ? 0 : 1
})
