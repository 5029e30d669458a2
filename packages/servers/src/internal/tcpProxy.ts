import * as net from "node:net"
import type { Scope } from "effect"
import { Data, Deferred, Effect, Exit } from "effect"
import type { Fault, TcpProxy } from "../TcpProxy.js"

// the public module declares these, so that the proxy cannot miss a field added to them
export type { Fault, TcpProxy }

/** @internal */
export class TcpProxyError extends Data.TaggedError("TcpProxyError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

interface Pair {
  readonly client: net.Socket
  readonly upstream: net.Socket
}

interface Armed {
  readonly fault: Fault
  readonly fired: Deferred.Deferred<void>
}

const HOST = "127.0.0.1"

const reset = (socket: net.Socket): void => {
  // an RST, as a broken network would send; destroy where the platform cannot
  if (typeof socket.resetAndDestroy === "function" && socket.readyState !== "closed") socket.resetAndDestroy()
  else socket.destroy()
}

/** @internal */
export const make = (
  target: { readonly host: string; readonly port: number }
): Effect.Effect<TcpProxy, TcpProxyError, Scope.Scope> =>
  Effect.gen(function*() {
    const pairs = new Set<Pair>()
    const armed: Array<Armed> = []

    const close = (pair: Pair) => {
      pairs.delete(pair)
      reset(pair.client)
      reset(pair.upstream)
    }

    const server = net.createServer((client) => {
      const upstream = net.connect(target.port, target.host)
      const pair: Pair = { client, upstream }
      pairs.add(pair)
      // a reset socket reports ECONNRESET: expected here
      client.on("error", () => close(pair))
      upstream.on("error", () => close(pair))
      client.on("close", () => close(pair))
      upstream.on("close", () => close(pair))
      // once a command was forwarded whose reply must be lost: drop what the server answers
      let losing: Armed | undefined
      upstream.on("data", (chunk: Buffer) => {
        if (losing !== undefined) {
          // the server answered, so it executed the command: lose the reply and the connection
          const fired = losing.fired
          losing = undefined
          close(pair)
          Deferred.unsafeDone(fired, Exit.void)
          return
        }
        client.write(chunk)
      })
      client.on("data", (chunk: Buffer) => {
        const text = chunk.toString("latin1")
        const index = armed.findIndex((a) => a.fault.match(text))
        if (index === -1) {
          upstream.write(chunk)
          return
        }
        const [hit] = armed.splice(index, 1)
        if (hit!.fault.kind === "beforeSend") {
          close(pair)
          Deferred.unsafeDone(hit!.fired, Exit.void)
          return
        }
        losing = hit
        upstream.write(chunk)
      })
    })

    const port = yield* Effect.async<number, TcpProxyError>((resume) => {
      server.once("error", (cause) => resume(Effect.fail(new TcpProxyError({ message: "cannot listen", cause }))))
      server.listen(0, HOST, () => {
        const address = server.address()
        resume(
          typeof address === "object" && address !== null
            ? Effect.succeed(address.port)
            : Effect.fail(new TcpProxyError({ message: "no port" }))
        )
      })
    })
    yield* Effect.addFinalizer(() =>
      Effect.async<void>((resume) => {
        for (const pair of [...pairs]) close(pair)
        server.close(() => resume(Effect.void))
      })
    )

    return {
      host: HOST,
      port,
      url: `redis://${HOST}:${port}`,
      connections: Effect.sync(() => pairs.size),
      resetAll: Effect.sync(() => {
        for (const pair of [...pairs]) close(pair)
      }),
      arm: (fault) =>
        Effect.map(Deferred.make<void>(), (fired) => {
          armed.push({ fault, fired })
          return Deferred.await(fired)
        })
    }
  })
