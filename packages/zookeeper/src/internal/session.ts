/**
 * The backend's ZooKeeper session. A session that expires takes its ephemeral nodes (every hold
 * and every waiter of the backend) with it: the epoch counts sessions, so that a holder of an
 * earlier session knows its hold is gone without asking. A client the backend made itself is
 * replaced by a new one (a new session) when its session expires; a borrowed one is not.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import { BackendError } from "@lockstep/core/LockError"
import * as Zk from "node-zookeeper-client"
import { guardConnections } from "./connection.js"

export interface Session {
  readonly client: () => Zk.Client
  /** Incremented when the session expires. */
  readonly epoch: () => number
  /** The session timeout the ensemble granted, in ms. */
  readonly timeoutMs: () => number
}

export interface ConnectOptions {
  readonly connectionString: string
  readonly sessionTimeoutMs: number
  readonly connectTimeoutMs: number
  /** `user:password` for ZooKeeper's digest scheme. */
  readonly digest?: string | undefined
  readonly endpoint: string
}

const connected = (client: Zk.Client, timeoutMs: number, endpoint: string): Effect.Effect<void, BackendError> =>
  Effect.async<void, BackendError>((resume) => {
    const state = client.getState()
    if (state === Zk.State.SYNC_CONNECTED || state === Zk.State.CONNECTED_READ_ONLY) {
      resume(Effect.void)
      return
    }
    const onConnected = () => {
      cleanUp()
      resume(Effect.void)
    }
    const onFailed = () => {
      cleanUp()
      resume(Effect.fail(new BackendError({ operation: "connect", cause: "authentication failed", endpoint, detail: "ZooKeeper refused the credentials" })))
    }
    const timer = setTimeout(() => {
      cleanUp()
      resume(Effect.fail(new BackendError({ operation: "connect", cause: "timeout", endpoint, detail: `no ZooKeeper session within ${timeoutMs} ms` })))
    }, timeoutMs)
    const cleanUp = () => {
      clearTimeout(timer)
      client.removeListener("connected", onConnected)
      client.removeListener("connectedReadOnly", onConnected)
      client.removeListener("authenticationFailed", onFailed)
    }
    client.on("connected", onConnected)
    client.on("connectedReadOnly", onConnected)
    client.on("authenticationFailed", onFailed)
    return Effect.sync(cleanUp)
  })

/** A client of the backend's own, connected; closed with `scope`, replaced when its session expires. */
export const owned = (options: ConnectOptions): Effect.Effect<Session, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    let epoch = 0
    let ended = false
    let current!: Zk.Client
    let unguard!: () => void
    const closeCurrent = () => {
      unguard()
      current.close()
    }
    // a client and its guard, replaced together when the session expires
    const open = (): void => {
      const client = Zk.createClient(options.connectionString, {
        sessionTimeout: options.sessionTimeoutMs,
        spinDelay: 100,
        // never 1 or more: the client would send a request again after a connection loss, and a
        // sequential create sent twice makes two nodes, the first of them orphaned
        retries: 0
      })
      if (options.digest !== undefined) client.addAuthInfo("digest", Buffer.from(options.digest))
      client.on("expired", () => {
        if (ended || current !== client) return
        epoch += 1
        closeCurrent()
        open()
      })
      client.connect()
      current = client
      unguard = guardConnections(client)
    }
    open()
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        ended = true
        closeCurrent()
      })
    )
    yield* connected(current, options.connectTimeoutMs, options.endpoint)
    return { client: () => current, epoch: () => epoch, timeoutMs: () => current.getSessionTimeout() }
  })

/** A client the caller owns and closes; the backend waits until it is connected. */
export const borrowed = (client: Zk.Client, connectTimeoutMs: number, endpoint: string): Effect.Effect<Session, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    let epoch = 0
    const onExpired = () => {
      epoch += 1
    }
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        client.on("expired", onExpired)
        return guardConnections(client)
      }),
      (unguard) =>
        Effect.sync(() => {
          unguard()
          client.removeListener("expired", onExpired)
        })
    )
    yield* connected(client, connectTimeoutMs, endpoint)
    return { client: () => client, epoch: () => epoch, timeoutMs: () => client.getSessionTimeout() }
  })
