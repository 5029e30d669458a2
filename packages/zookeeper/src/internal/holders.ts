/**
 * A holder's own bookkeeping (its counts, its node, whether it ended) lives in this process: only
 * this backend acts as its holders, so every copy of a request of theirs passes here, one at a
 * time per holder. What others must see (the node, its counts, its lease) is in ZooKeeper.
 */
import { Effect } from "effect"
import type { LockBackend } from "@lockstep/core"
import { encodeData } from "./layout.js"

/** One holder of one key, as this backend keeps it. */
export interface Holder {
  readonly key: string
  readonly holder: string
  /** Its node's full path once known. */
  path: string | undefined
  /** A `create` was sent whose answer never came: the node may exist under the holder's prefix. */
  unsure: boolean
  exclusive: number
  shared: number
  permits: number
  limit: number
  /** Its node is a fair queue entry, which only `cancel` gives up. */
  fair: boolean
  /** What its waiting node last said. */
  waiting: Buffer | undefined
  /** Set once granted. */
  fence: number | undefined
  /** The session its node belongs to: gone with it. */
  epoch: number
  /** Server time of the node's last write, and the lease and waiter timeout it wrote. */
  mtime: number
  leaseMs: number
  waiterTtlMs: number
}

/** A holder's id: its key and its name, which no key contains the separator of. */
export const idOf = (key: string, holder: string): string => `${key}\u0000${holder}`

/** A holder first seen in `request`, its node not yet made, in session `epoch`. */
export const newHolder = (request: LockBackend.AcquireRequest, epoch: number): Holder => ({
  key: request.key,
  holder: request.holder,
  path: undefined,
  unsure: false,
  exclusive: 0,
  shared: 0,
  permits: 0,
  limit: request.limit,
  fair: request.fair,
  waiting: undefined,
  fence: undefined,
  epoch,
  mtime: 0,
  leaseMs: request.leaseMs,
  waiterTtlMs: request.waiterTtlMs
})

/** A holder's node data once it holds. */
export const heldData = (holder: Holder): Buffer =>
  encodeData({
    x: holder.exclusive,
    s: holder.shared,
    p: holder.permits,
    m: holder.limit,
    l: holder.leaseMs,
    w: holder.waiterTtlMs,
    g: 1,
    f: holder.fence
  })

/** This backend's holders, the ones that ended, and the turns of their requests. */
export interface Holders {
  readonly get: (id: string) => Holder | undefined
  readonly set: (id: string, holder: Holder) => void
  readonly delete: (id: string) => void
  /** Whether the holder ended (or was refused) less than its lease ago. */
  readonly hasEnded: (id: string) => boolean
  /** The holder ended: its record goes, and it counts as ended for `leaseMs`. */
  readonly markEnded: (id: string, leaseMs: number) => void
  /** A holder refused a release (it held nothing): a late copy of its acquisition grants nothing. */
  readonly markUnheld: (id: string, leaseMs: number) => void
  /** Whether a release of the holder was refused less than its lease ago (see `markUnheld`). */
  readonly wasUnheld: (id: string) => boolean
  /**
   * `effect` in its turn among the requests of `id`: copies of a request, a renewal and a release
   * of the same holder see each other's effects.
   */
  readonly serialized: <A, Err>(id: string, effect: Effect.Effect<A, Err>) => Effect.Effect<A, Err>
  /**
   * `serialized` for a request of `holder` on `key`: `body` runs in its turn, with the holder's
   * id and its record as the turn finds it (none: a holder this backend does not know).
   */
  readonly inTurn: <A, Err>(
    key: string,
    holder: string,
    body: (id: string, state: Holder | undefined) => Effect.Effect<A, Err>
  ) => Effect.Effect<A, Err>
  /** Whether a request of `id` is under way (or waiting for its turn). */
  readonly isBusy: (id: string) => boolean
}

export const makeHolders = (): Holders => {
  const holders = new Map<string, Holder>()
  /** Holders that ended (or that this backend refused), until when they are remembered (local ms). */
  const ended = new Map<string, number>()
  /** The requests waiting for their turn, per holder id with one under way. */
  const busy = new Map<string, Array<() => void>>()

  const hasEnded = (id: string): boolean => {
    const until = ended.get(id)
    if (until === undefined) return false
    if (until > Date.now()) return true
    ended.delete(id)
    return false
  }

  const markEnded = (id: string, leaseMs: number) => {
    holders.delete(id)
    ended.delete(id)
    ended.set(id, Date.now() + leaseMs)
    // the oldest entries come first: drop those that have passed
    const now = Date.now()
    for (const [old, until] of ended) {
      if (until > now) break
      ended.delete(old)
    }
  }

  const serialized = <A, Err>(id: string, effect: Effect.Effect<A, Err>): Effect.Effect<A, Err> =>
    Effect.uninterruptibleMask((restore) =>
      Effect.zipRight(
        Effect.async<void>((resume) => {
          const queue = busy.get(id)
          if (queue === undefined) {
            busy.set(id, [])
            resume(Effect.void)
            return
          }
          const turn = () => resume(Effect.void)
          queue.push(turn)
          // interrupted while waiting: its turn is not taken
          return Effect.sync(() => {
            const index = queue.indexOf(turn)
            if (index >= 0) queue.splice(index, 1)
          })
        }),
        Effect.ensuring(restore(effect), Effect.sync(() => {
          const queue = busy.get(id)
          const next = queue?.shift()
          if (next === undefined) busy.delete(id)
          else next()
        }))
      )
    )

  return {
    get: (id) => holders.get(id),
    set: (id, holder) => void holders.set(id, holder),
    delete: (id) => void holders.delete(id),
    hasEnded,
    markEnded,
    markUnheld: (id, leaseMs) => {
      ended.delete(`!${id}`)
      ended.set(`!${id}`, Date.now() + leaseMs)
    },
    wasUnheld: (id) => hasEnded(`!${id}`),
    serialized,
    inTurn: (key, holder, body) => {
      const id = idOf(key, holder)
      return serialized(id, Effect.suspend(() => body(id, holders.get(id))))
    },
    isBusy: (id) => busy.has(id)
  }
}
