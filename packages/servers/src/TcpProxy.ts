/**
 * A TCP proxy on a free loopback port in front of a server (typically a `RedisServer`), for tests
 * that break the network at a chosen moment: reset every connection, or lose the reply to one
 * chosen command after the server executed it — the case in which a client library such as
 * ioredis re-sends the command on its new connection, and the server runs it twice.
 *
 * @since 0.1.0
 */
import type { Effect, Scope } from "effect"
import * as internal from "./internal/tcpProxy.js"

/**
 * Why a proxy could not be started.
 *
 * @example
 * ```ts
 * import { TcpProxy } from "@lockstep/servers"
 *
 * const error = new TcpProxy.TcpProxyError({ message: "cannot listen" })
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const TcpProxyError: typeof internal.TcpProxyError = internal.TcpProxyError

/**
 * An instance of `TcpProxyError`.
 *
 * @since 0.1.0
 * @category errors
 */
export type TcpProxyError = internal.TcpProxyError

/**
 * A one-shot fault aimed at the first client data (across connections) for which `match` is true;
 * `match` sees the raw bytes as latin1 text, e.g. a RESP `EVALSHA` with its script hash and
 * arguments. `"replyLost"`: the data is forwarded, and once the server answers, the answer is
 * dropped and the connection reset — the server executed the command, the client never heard.
 * `"beforeSend"`: the connection is reset before the data is forwarded.
 *
 * @example
 * ```ts
 * import type { TcpProxy } from "@lockstep/servers"
 *
 * const fault: TcpProxy.Fault = { kind: "replyLost", match: (data) => data.includes("INCR") }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Fault {
  readonly kind: "replyLost" | "beforeSend"
  readonly match: (command: string) => boolean
}

/**
 * A running proxy.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer, TcpProxy } from "@lockstep/servers"
 *
 * const program = Effect.gen(function* () {
 *   const server = yield* RedisServer.make()
 *   const proxy = yield* TcpProxy.make(server)
 *   const fired = yield* proxy.arm({ kind: "replyLost", match: (data) => data.includes("INCR") })
 *   // ... a client on proxy.url sends INCR ...
 *   yield* fired
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface TcpProxy {
  readonly host: string
  readonly port: number
  /** `redis://127.0.0.1:<port>` */
  readonly url: string
  /** Client connections open through the proxy. */
  readonly connections: Effect.Effect<number>
  /** Resets every open connection; new connections are accepted. */
  readonly resetAll: Effect.Effect<void>
  /** Arms a fault; the returned effect completes when it has fired. */
  readonly arm: (fault: Fault) => Effect.Effect<Effect.Effect<void>>
}

/**
 * Starts a proxy to `target` on a free loopback port; closing the scope stops it and resets every
 * connection.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer, TcpProxy } from "@lockstep/servers"
 *
 * const proxied = Effect.flatMap(RedisServer.make(), (server) => TcpProxy.make(server))
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (
  target: { readonly host: string; readonly port: number }
) => Effect.Effect<TcpProxy, TcpProxyError, Scope.Scope> = internal.make
