/**
 * A `MultiLock` over two backends composed from layers: an order's lock lives on Redis (the
 * orders service's locks), its invoice's lock on PostgreSQL (the billing database's). Settling an
 * order takes both, or waits holding neither for long.
 *
 *   npx tsx examples/multi-lock/main.ts
 *   (REDIS_URL, default redis://127.0.0.1:6379; LOCKSTEP_PG_URL, default postgres://postgres@127.0.0.1:5432)
 *
 * Exits 0 when no two holders of a part overlapped and everything finished; 1 otherwise.
 */
import { Console, Effect, Exit, Layer } from "effect"
import { Lock, LockBackend, MultiLock } from "@lockstep/core"
import { SqlBackend } from "@lockstep/sql"
import { temporaryDatabase } from "../shared/postgres.js"
import { redisLocks, runNamespace } from "../shared/redis.js"

// each backend under a name of its own
const OrderLocks = LockBackend.tag("app/OrderLocks")
const BillingLocks = LockBackend.tag("app/BillingLocks")

const Backends = Layer.merge(
  redisLocks(runNamespace("multi-lock")).pipe(LockBackend.layerAs(OrderLocks)),
  SqlBackend.layer().pipe(Layer.provide(temporaryDatabase("multi-lock")), LockBackend.layerAs(BillingLocks))
)

const orderLock = (id: string) => Lock.make(`order:${id}`).pipe(LockBackend.using(OrderLocks))
const invoiceLock = (id: string) => Lock.make(`invoice:${id}`).pipe(LockBackend.using(BillingLocks))

/** Since the program started (set then), for the printed timeline. */
let started = Date.now()
const elapsed = () => `${String(Date.now() - started).padStart(5)} ms`

/** Who holds each part now: every holder checks that it is alone on its parts. */
const holding = new Map<string, string>()
const violations: Array<string> = []
const enter = (who: string, keys: ReadonlyArray<string>) =>
  Effect.sync(() => {
    for (const key of keys) {
      const other = holding.get(key)
      if (other !== undefined) violations.push(`${who} and ${other} both held ${key}`)
      holding.set(key, who)
    }
  })
const leave = (keys: ReadonlyArray<string>) => Effect.sync(() => keys.forEach((key) => holding.delete(key)))

/** Settles order `id`: the order and its invoice together, each part on its own backend. */
const settle = (who: string, id: string, parts: "order, invoice" | "invoice, order" = "order, invoice") =>
  Effect.gen(function*() {
    const order = yield* orderLock(id)
    const invoice = yield* invoiceLock(id)
    // named in either order: taken in one canonical order, so two settlements never deadlock
    const both = yield* (parts === "order, invoice" ? MultiLock.make(order, invoice) : MultiLock.make(invoice, order))
    yield* MultiLock.withLock(
      (lease) =>
        Effect.gen(function*() {
          const keys = lease.parts.map((part) => part.key)
          yield* enter(who, keys)
          yield* Console.log(`  ${elapsed()}  ${who}: holds ${lease.parts.map((p) => `${p.key} (fence ${p.fence})`).join(" and ")}`)
          yield* Effect.sleep("100 millis")
          yield* leave(keys)
        }),
      both,
      { timeout: "10 seconds" }
    )
  })

/** A billing run that holds one invoice alone, on the billing backend only. */
const billingRun = (id: string) =>
  Effect.gen(function*() {
    const invoice = yield* invoiceLock(id)
    yield* Lock.withLock(
      Effect.gen(function*() {
        yield* enter("billing run", [`invoice:${id}`])
        yield* Console.log(`  ${elapsed()}  billing run: holds invoice:${id} alone for 300 ms`)
        yield* Effect.sleep("300 millis")
        yield* leave([`invoice:${id}`])
      }),
      invoice
    )
  })

const program = Effect.gen(function*() {
  started = Date.now()
  yield* Console.log("1. two settlements of order 7 at once: one after the other")
  yield* Effect.all([settle("settlement A", "7"), settle("settlement B", "7")], { concurrency: "unbounded" })

  yield* Console.log("2. a billing run holds invoice 8; settling order 8 waits for it")
  yield* Effect.all([billingRun("8"), Effect.delay(settle("settlement C", "8"), "50 millis")], { concurrency: "unbounded" })

  yield* Console.log("3. 3 settlements naming the parts order-first and 3 invoice-first, on order 9 at once: no deadlock")
  yield* Effect.all(
    [1, 2, 3].flatMap((n) => [settle(`order-first ${n}`, "9"), settle(`invoice-first ${n}`, "9", "invoice, order")]),
    { concurrency: "unbounded" }
  )

  if (violations.length > 0) return yield* Effect.fail(violations.join("; "))
  yield* Console.log(`ok: no part was ever held twice at once (${elapsed().trim()} in all)`)
})

void Effect.runPromiseExit(Effect.provide(program, Backends)).then((exit) => {
  if (Exit.isFailure(exit)) console.error(String(exit.cause))
  process.exitCode = Exit.isSuccess(exit) ? 0 : 1
})
