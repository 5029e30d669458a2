/**
 * An HTTP service whose handler takes a lock per order id: `POST /orders/:id/pay` charges an
 * order while it holds the lock `orders:<id>`, so that two payments of one order never run at
 * once (in this process or any other on the same Redis), while payments of different orders run
 * side by side. A payment that waits longer than 5 seconds for its order answers 409, an order id
 * that cannot be a lock key 400.
 */
import { createServer } from "node:http"
import { HttpRouter, HttpServer, HttpServerResponse } from "@effect/platform"
import type { ServeError } from "@effect/platform/HttpServerError"
import { NodeHttpServer } from "@effect/platform-node"
import { Clock, Effect, Layer, Schema } from "effect"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core"

/** What a payment answers: the order, its lease's fence, and when it held the lock (epoch ms). */
export const Payment = Schema.Struct({
  order: Schema.String,
  fence: Schema.Number,
  heldFrom: Schema.Number,
  heldUntil: Schema.Number
})
export type Payment = typeof Payment.Type

/** Charging the card: 150 ms of a payment provider's time. */
const charge = (_order: string) => Effect.sleep("150 millis")

const pay = Effect.gen(function*() {
  const { id } = yield* HttpRouter.schemaPathParams(Schema.Struct({ id: Schema.String }))
  // one lock per order id; `name` labels the lock's metrics, which never carry the key itself
  const lock = yield* Lock.make(`orders:${id}`, { name: "orders" })
  const payment = yield* Lock.withLock(
    (lease) =>
      Effect.gen(function*() {
        const heldFrom = yield* Clock.currentTimeMillis
        yield* charge(id)
        return { order: id, fence: lease.fence, heldFrom, heldUntil: yield* Clock.currentTimeMillis }
      }),
    lock,
    { timeout: "5 seconds" }
  )
  return yield* HttpServerResponse.schemaJson(Payment)(payment)
}).pipe(
  Effect.catchTags({
    LockTimeout: () => Effect.succeed(HttpServerResponse.text("the order is busy: try again", { status: 409 })),
    // an id a lock key cannot hold (empty, or with `{` or `}`)
    InvalidLockOptions: (error) => Effect.succeed(HttpServerResponse.text(`bad order id: ${error.reason}`, { status: 400 })),
    ParseError: () => Effect.succeed(HttpServerResponse.text("bad order id", { status: 400 }))
  })
)

export const OrdersApi = HttpRouter.empty.pipe(HttpRouter.post("/orders/:id/pay", pay))

/**
 * The service on `port` (0: a free one), given a `LockBackend`; `HttpServer` stays in the output
 * so that a caller can read the address it listens on.
 */
export const OrdersServer = (port: number): Layer.Layer<HttpServer.HttpServer, ServeError, LockBackend.LockBackend> =>
  HttpServer.serve(OrdersApi).pipe(Layer.provideMerge(NodeHttpServer.layer(createServer, { port, host: "127.0.0.1" })))
