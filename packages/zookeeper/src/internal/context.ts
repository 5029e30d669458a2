/**
 * What the backend's operations share, passed to each of them: its session and layout, its
 * lifecycle, its round trips, and the state this process keeps (holders, waiters, key nodes).
 */
import type { Lifecycle } from "@lockstep/core/BackendKit"
import type { Calls } from "./calls.js"
import type { Holders } from "./holders.js"
import type { KeyNodes } from "./keyNodes.js"
import type { LatchWaiters } from "./latches.js"
import type { Paths } from "./layout.js"
import type { ServerClock } from "./serverTime.js"
import type { Session } from "./session.js"
import type { Wakeups } from "./wakeups.js"

export interface Settings {
  readonly namespace: string
  readonly commandTimeoutMs: number
  readonly sweepIntervalMs: number
  /** How errors name the ensemble (`BackendKit.endpointName`). */
  readonly endpoint: string
}

export interface BackendContext extends Calls {
  readonly session: Session
  readonly layout: Paths
  readonly lifecycle: Lifecycle
  /** The prefix of the holders this backend makes (`<clientId>:`), so its own nodes are known. */
  readonly ours: string
  readonly clock: ServerClock
  readonly keyNodes: KeyNodes
  readonly holders: Holders
  readonly wakeups: Wakeups
  readonly latchWaiters: LatchWaiters
  /** The forced releases answered lately, by key and request id, until when and with what. */
  readonly forced: Map<string, { readonly until: number; readonly result: boolean }>
}
