import type { Types } from "effect"
import * as Rules from "@lockstep/core/Rules"

/**
 * A row's state: the key's lock state and its latch, as the rules keep them. Stored as JSON in the
 * row's `state` column; an empty column is a key nobody has touched. The key's ended holders are
 * not in it: they are rows of the `_ended` table, read one by one, so that a key released
 * thousands of times a lease does not carry them all in every operation.
 */
export interface Document {
  readonly key: Rules.Key
  readonly latch: Rules.Latch | undefined
}

export const emptyDocument: Document = { key: Rules.emptyKey, latch: undefined }

/** The JSON shape: short names, maps as entry lists, an infinite limit (read locks) as -1. */
interface Encoded {
  readonly f: number
  readonly fu: number
  readonly lim?: number
  readonly h?: ReadonlyArray<readonly [string, number, number, number, number, number]>
  readonly q?: ReadonlyArray<readonly [string, number]>
  readonly lc?: number
  readonly la?: ReadonlyArray<readonly [string, number]>
}

export const encode = (document: Document): string => {
  const { key, latch } = document
  const encoded: Types.Mutable<Encoded> = { f: key.fence, fu: key.fenceUntil }
  if (key.limit !== undefined) encoded.lim = key.limit === Infinity ? -1 : key.limit
  if (key.holders.length > 0) {
    encoded.h = key.holders.map((h) => [h.holder, h.exclusive, h.shared, h.permits, h.fence, h.expiresAt] as const)
  }
  if (key.queue.length > 0) encoded.q = key.queue.map((w) => [w.holder, w.expiresAt] as const)
  if (latch !== undefined) {
    encoded.lc = latch.count
    if (latch.applied.size > 0) encoded.la = [...latch.applied]
  }
  return JSON.stringify(encoded)
}

export const decode = (text: string | null | undefined): Document => {
  if (text === null || text === undefined || text === "") return emptyDocument
  const encoded = JSON.parse(text) as Encoded
  const key: Rules.Key = {
    fence: encoded.f,
    fenceUntil: encoded.fu,
    ended: new Map(),
    limit: encoded.lim === undefined ? undefined : encoded.lim === -1 ? Infinity : encoded.lim,
    holders: (encoded.h ?? []).map(([holder, exclusive, shared, permits, fence, expiresAt]) => ({
      holder,
      exclusive,
      shared,
      permits,
      fence,
      expiresAt
    })),
    queue: (encoded.q ?? []).map(([holder, expiresAt]) => ({ holder, expiresAt }))
  }
  const latch = encoded.lc === undefined ? undefined : { count: encoded.lc, applied: new Map(encoded.la ?? []) }
  return { key, latch }
}

/** A latch with a count never expires (as Redisson's); anything else lasts until its last deadline. */
const forever = Number.MAX_SAFE_INTEGER

/**
 * When the row stops mattering: after this time on the database's clock every hold, queue entry,
 * remembered call and fence it keeps has expired, so deleting it changes nothing an operation could
 * observe (a fence is kept until the clock has passed it, so fences issued after the row is gone
 * still increase). Ended holders are rows of their own, with their own expiry.
 */
export const expiresAt = (document: Document): number => {
  const { key, latch } = document
  if (latch !== undefined && latch.count > 0) return forever
  let until = key.fenceUntil
  for (const hold of key.holders) until = Math.max(until, hold.expiresAt)
  for (const waiter of key.queue) until = Math.max(until, waiter.expiresAt)
  if (latch !== undefined) for (const end of latch.applied.values()) until = Math.max(until, end)
  return until
}
