/**
 * A persistent set of hold records, indexed by key: what a fiber holds (fiberHolds.ts). A fiber
 * may hold thousands of leases (one that acquires many keys, or joins many children that did), so
 * adding, finding and removing one costs O(log n) rather than a copy of the whole set: with arrays,
 * a burst of n acquisitions joined into one fiber cost O(n²).
 */
import { HashMap, Option } from "effect"
import type { Held } from "./holdRecord.js"
import { isLive } from "./holdRecord.js"

/** Records by key (few per key: one per backend instance and kind), each array never empty. */
export type HeldSet = HashMap.HashMap<string, ReadonlyArray<Held>>

export const empty: HeldSet = HashMap.empty()

const none: ReadonlyArray<Held> = []

/** The records on `key`, live or not. */
export const on = (set: HeldSet, key: string): ReadonlyArray<Held> => {
  if (HashMap.size(set) === 0) return none
  const found = HashMap.get(set, key)
  return Option.isSome(found) ? found.value : none
}

/** Whether `held` is in the set. */
export const has = (set: HeldSet, held: Held): boolean => on(set, held.key).includes(held)

/** `set` with `held` (the key's records that ended are dropped on the way). */
export const add = (set: HeldSet, held: Held): HeldSet => {
  const current = on(set, held.key)
  if (current.length === 0) return HashMap.set(set, held.key, [held])
  const next = current.filter((h) => h !== held && isLive(h))
  next.push(held)
  return HashMap.set(set, held.key, next)
}

/** `set` without `held` (and without the key's records that ended). */
export const remove = (set: HeldSet, held: Held): HeldSet => {
  const current = on(set, held.key)
  if (current.length === 0) return set
  const next = current.filter((h) => h !== held && isLive(h))
  return next.length === 0 ? HashMap.remove(set, held.key) : HashMap.set(set, held.key, next)
}

/** Every record in the set. */
export const forEach = (set: HeldSet, f: (held: Held) => void): void => {
  HashMap.forEach(set, (records) => {
    for (const held of records) f(held)
  })
}
