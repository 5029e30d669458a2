/**
 * Starts the orders service (server.ts) on a free port with the Redis backend, then pays 7 orders
 * at once over HTTP: 3 payments of order 1001, 3 of order 1002, 1 of order 1003. The payments of
 * one order run one after another; those of different orders side by side.
 *
 *   npx tsx examples/http-orders/main.ts        (REDIS_URL, default redis://127.0.0.1:6379)
 *
 * Exits 0 when every payment answered and the payments of each order never overlapped; 1 otherwise.
 */
import { HttpClient, HttpClientResponse, HttpServer } from "@effect/platform"
import { NodeHttpClient } from "@effect/platform-node"
import { Console, Effect, Exit, Layer } from "effect"
import { redisLocks, runNamespace } from "../shared/redis.js"
import { OrdersServer, Payment } from "./server.js"

const orders = ["1001", "1002", "1001", "1003", "1002", "1001", "1002"]

const program = Effect.gen(function*() {
  const base = yield* HttpServer.addressWith((address) =>
    Effect.succeed(address._tag === "TcpAddress" ? `http://127.0.0.1:${address.port}` : "http://localhost")
  )
  yield* Console.log(`orders service on ${base}; paying ${orders.length} orders at once:`)
  const client = (yield* HttpClient.HttpClient).pipe(HttpClient.filterStatusOk)
  const started = Date.now()
  const payments = yield* Effect.forEach(
    orders,
    (order) => client.post(`${base}/orders/${order}/pay`).pipe(Effect.flatMap(HttpClientResponse.schemaBodyJson(Payment))),
    { concurrency: "unbounded" }
  )

  const at = (ms: number) => `${String(ms - started).padStart(4)} ms`
  for (const p of [...payments].sort((a, b) => a.order.localeCompare(b.order) || a.heldFrom - b.heldFrom)) {
    yield* Console.log(`  order ${p.order}: held the lock from ${at(p.heldFrom)} to ${at(p.heldUntil)}, fence ${p.fence}`)
  }
  yield* Console.log(`all answered in ${Date.now() - started} ms (${orders.length} payments of 150 ms each)`)

  const overlapping = (a: Payment, b: Payment) => a.heldFrom < b.heldUntil && b.heldFrom < a.heldUntil
  const pairs = payments.flatMap((a, i) => payments.slice(i + 1).map((b) => [a, b] as const))
  const sameOrder = pairs.filter(([a, b]) => a.order === b.order && overlapping(a, b))
  if (sameOrder.length > 0) return yield* Effect.fail(`${sameOrder.length} pairs of payments of one order overlapped`)
  const sideBySide = pairs.some(([a, b]) => a.order !== b.order && overlapping(a, b))
  yield* Console.log(
    `ok: the payments of each order ran one at a time${sideBySide ? ", different orders side by side" : ""}`
  )
})

const main = program.pipe(
  Effect.provide(Layer.merge(OrdersServer(0), NodeHttpClient.layerUndici)),
  Effect.provide(redisLocks(runNamespace("http-orders")))
)

void Effect.runPromiseExit(main).then((exit) => {
  if (Exit.isFailure(exit)) console.error(String(exit.cause))
  process.exitCode = Exit.isSuccess(exit) ? 0 : 1
})
