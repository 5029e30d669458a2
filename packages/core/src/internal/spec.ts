/** What a lock handle is made of, fixed at `make`, and the shapes its operations share. */
import { Effect } from "effect"
import type { Lease } from "../Lease.js"
import type { AcquireOptions } from "../Lock.js"
import type { HoldMode, Service } from "../LockBackend.js"
import type { HandleLabels } from "./metrics.js"

/** The kinds of handle; read and write locks are views of one key. */
export type LockKind = "Lock" | "FairLock" | "ReadLock" | "WriteLock" | "Semaphore"

/** Everything an acquisition needs to know about a lock handle, fixed at `make`. */
export interface LockSpec {
  readonly kind: LockKind
  readonly backend: Service
  readonly key: string
  readonly mode: HoldMode
  /** Shared capacity (Infinity for read locks); 1 for exclusive locks. */
  readonly limit: number
  readonly fair: boolean
  /** Re-entrant kinds share one holder identity per fiber; semaphores take a fresh one per acquisition. */
  readonly reentrant: boolean
  /** A fixed lease in ms, or `undefined` for a watchdog-renewed lease. */
  readonly leaseMs: number | undefined
  readonly watchdogMs: number
  readonly waiterTtlMs: number
  /** The handle's name for metrics, if it was given one. */
  readonly name: string | undefined
  readonly labels: HandleLabels
}

/** What an acquisition may do on a `BackendError`: try again on this schedule (none: fail). */
export type Retry = AcquireOptions["retry"]

/** A critical section: an effect, or a function of the lease that makes one. */
export type Body<A, E, R> = Effect.Effect<A, E, R> | ((lease: Lease) => Effect.Effect<A, E, R>)

/** Whether a dual's first argument is a body (then the call is data-first). */
export const isBody = (u: unknown): boolean => Effect.isEffect(u) || typeof u === "function"

/** What `Effect.uninterruptibleMask` hands its body: where it may be interrupted. */
export type Restore = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

export const defaultWatchdogMs = 30_000
export const defaultWaiterTtlMs = 5_000
