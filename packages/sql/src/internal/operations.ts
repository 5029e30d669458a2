/**
 * The backend's operations: each the rule of `@lockstep/core/Rules` of the same name, applied in
 * one transaction (transact.ts) to the rows of the keys it names, or a subscription to the
 * wake-ups of a key (wakeups.ts). Every call fails with the closed-backend error once the
 * backend closed.
 */
import { Effect } from "effect"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import type * as LockBackend from "@lockstep/core/LockBackend"
import * as Rules from "@lockstep/core/Rules"
import { endedOf } from "./rows.js"
import type { Transact } from "./transact.js"
import { latchPayload, lockPayload, type Wakeups } from "./wakeups.js"

/** What the operations are made of. */
export interface OperationsContext {
  readonly clientId: string
  readonly lifecycle: Lifecycle
  readonly transact: Transact
  readonly wakeups: Wakeups
  /** Most leases renewed in one transaction. */
  readonly renewBatchSize: number
}

type LatchOperations = Pick<LockBackend.Service, "latchSetCount" | "latchCountDown" | "latchCount" | "latchSubscribe">
type LockOperations = Omit<LockBackend.Service, "clientId" | "unsupported" | keyof LatchOperations>

/** The backend's service: its lock operations and its latch operations. */
export const make = (context: OperationsContext): LockBackend.Service => ({
  clientId: context.clientId,
  ...lockOperations(context),
  ...latchOperations(context)
})

const lockOperations = ({ lifecycle: { whileOpen }, renewBatchSize, transact: { read, transact }, wakeups }: OperationsContext): LockOperations => ({
  acquire: (request) =>
    whileOpen(
      "acquire",
      Effect.flatten(
        transact("acquire", [request.key], (state, now) => Rules.acquire(state, request, now), endedOf(request.key, request.holder))
      )
    ),
  release: (request) =>
    whileOpen(
      "release",
      Effect.flatten(
        transact("release", [request.key], (state, now) => Rules.release(state, request, now), endedOf(request.key, request.holder))
      )
    ),
  renew: (requests) =>
    whileOpen(
      "renew",
      Effect.map(
        Effect.forEach(chunks(requests, renewBatchSize), (batch) =>
          transact("renew", batch.map((r) => r.key), (state, now) => Rules.renew(state, batch, now))),
        (results) => results.flat()
      )
    ),
  inspect: (key) => whileOpen("inspect", read("inspect", key, (state, now) => Rules.inspect(state, key, now).result)),
  raiseFence: (request) =>
    whileOpen("raiseFence", transact("raiseFence", [request.key], (state, now) => Rules.raiseFence(state, request, now))),
  forceRelease: (request) =>
    whileOpen(
      "forceRelease",
      transact("forceRelease", [request.key], (state, now) => Rules.forceRelease(state, request, now), {
        key: request.key,
        ids: Rules.forceReleaseIds(request)
      })
    ),
  cancel: (request) =>
    whileOpen(
      "cancel",
      transact("cancel", [request.key], (state, now) => Rules.cancel(state, request, now), { key: request.key, ids: [] })
    ),
  subscribe: (key) => whileOpen("subscribe", wakeups.subscribe(lockPayload(key), key))
})

const latchOperations = ({ lifecycle: { whileOpen }, transact: { read, transact }, wakeups }: OperationsContext): LatchOperations => ({
  latchSetCount: (request) =>
    whileOpen(
      "latchSetCount",
      Effect.flatten(transact("latchSetCount", [request.key], (state, now) => Rules.latchSetCount(state, request, now)))
    ),
  latchCountDown: (request) =>
    whileOpen(
      "latchCountDown",
      Effect.flatten(transact("latchCountDown", [request.key], (state, now) => Rules.latchCountDown(state, request, now)))
    ),
  latchCount: (key) =>
    whileOpen("latchCount", Effect.flatten(read("latchCount", key, (state, now) => Rules.latchCount(state, key, now).result))),
  latchSubscribe: (key) => whileOpen("latchSubscribe", wakeups.subscribe(latchPayload(key), key))
})

const chunks = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> => {
  const out: Array<ReadonlyArray<A>> = []
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size))
  return out
}
