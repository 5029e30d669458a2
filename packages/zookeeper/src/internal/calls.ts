/**
 * The backend's round trips to ZooKeeper: a batch of requests sent on the session's current
 * client while the backend is open, and a request's refusal turned into the operation's error.
 */
import { Effect } from "effect"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import type { BackendError } from "@lockstep/core/LockError"
import type { Session } from "./session.js"
import type { Outcome, Request } from "./zk.js"
import { batch, Code, ZkFailure } from "./zk.js"

/** What a failure's cause says in a `BackendError`'s `detail`: ZooKeeper's codes in words. */
export const describeCause = (cause: unknown): string =>
  cause instanceof ZkFailure && cause.code === Code.sessionExpired
    ? "the ZooKeeper session expired: its holds are gone"
    : cause instanceof ZkFailure && cause.code === Code.connectionLoss
    ? "the connection to ZooKeeper was lost (the request may or may not have been applied)"
    : cause instanceof ZkFailure && cause.code === Code.noAuth
    ? `not allowed by ZooKeeper's ACL (${cause.message})`
    : cause instanceof Error
    ? cause.message
    : String(cause)

export interface Calls {
  /** One round trip: the requests in order, each with its own outcome. */
  readonly send: (operation: string, requests: ReadonlyArray<Request>) => Effect.Effect<ReadonlyArray<Outcome>, BackendError>
  /** A request whose refusal is an error of the operation, unless its code is `allowed`. */
  readonly expect: (operation: string, outcome: Outcome | undefined, ...allowed: ReadonlyArray<number>) => Effect.Effect<void, BackendError>
}

export const makeCalls = (session: Session, lifecycle: Lifecycle, commandTimeoutMs: number): Calls => ({
  send: (operation, requests) =>
    lifecycle.whileOpen(operation, Effect.mapError(batch(session.client(), requests, commandTimeoutMs), lifecycle.failure(operation))),
  expect: (operation, outcome, ...allowed) =>
    outcome instanceof ZkFailure && !allowed.includes(outcome.code) ? Effect.fail(lifecycle.failure(operation)(outcome)) : Effect.void
})
