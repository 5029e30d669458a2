/**
 * A key's node stays between its uses (creating and deleting it for every grant would be two more
 * writes through the leader each time); the keys this backend used are swept: once unused for a
 * sweep interval, their node is deleted if no contender is under it (ZooKeeper refuses to delete
 * a node with children, so a key in use elsewhere keeps its node).
 */
import type { Scope } from "effect"
import { Duration, Effect, Schedule } from "effect"
import type { Calls } from "./calls.js"
import type { Request } from "./zk.js"

/** The key nodes this backend has seen lately, with when it last used each (local ms). */
export interface KeyNodes {
  readonly has: (path: string) => boolean
  /** The node is there and was used now. */
  readonly used: (path: string) => void
  /** The node was used now, if it is one this backend knows. */
  readonly usedIfKnown: (path: string) => void
  /** The node is gone (or may be): the next attempt creates it again. */
  readonly delete: (path: string) => void
  /** Takes the nodes unused for `intervalMs` out of the list and answers them. */
  readonly takeIdle: (intervalMs: number) => ReadonlyArray<string>
}

export const makeKeyNodes = (): KeyNodes => {
  const lastUsed = new Map<string, number>()
  return {
    has: (path) => lastUsed.has(path),
    used: (path) => void lastUsed.set(path, Date.now()),
    usedIfKnown: (path) => {
      if (lastUsed.has(path)) lastUsed.set(path, Date.now())
    },
    delete: (path) => void lastUsed.delete(path),
    takeIdle: (intervalMs) => {
      const now = Date.now()
      const idle = [...lastUsed].filter(([, at]) => now - at >= intervalMs).map(([path]) => path)
      for (const path of idle) lastUsed.delete(path)
      return idle
    }
  }
}

/** Sweeps the idle key nodes every `intervalMs` while the scope lasts; a failed sweep is let go. */
export const sweepIdle = (keyNodes: KeyNodes, calls: Calls, intervalMs: number): Effect.Effect<void, never, Scope.Scope> => {
  const sweep = Effect.suspend(() => {
    const idle = keyNodes.takeIdle(intervalMs)
    return idle.length === 0
      ? Effect.void
      : Effect.ignore(calls.send("sweep", idle.map((path): Request => ({ _tag: "remove", path, version: -1 }))))
  })
  return Effect.asVoid(Effect.forkScoped(Effect.interruptible(Effect.repeat(sweep, Schedule.spaced(Duration.millis(intervalMs))))))
}
