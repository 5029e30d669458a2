/**
 * The orders service on its own, until Ctrl-C: `PORT` (default 3000), Redis at `REDIS_URL`
 * (default redis://127.0.0.1:6379).
 *
 *   npx tsx examples/http-orders/serve.ts
 *   curl -X POST http://127.0.0.1:3000/orders/42/pay     (in another terminal, several at once)
 */
import { NodeRuntime } from "@effect/platform-node"
import { Layer } from "effect"
import { RedisBackend } from "@lockstep/redis"
import { redisUrl } from "../shared/redis.js"
import { OrdersServer } from "./server.js"

const port = Number(process.env["PORT"] ?? 3000)

NodeRuntime.runMain(Layer.launch(OrdersServer(port).pipe(Layer.provide(RedisBackend.layerFrom(redisUrl)))))
