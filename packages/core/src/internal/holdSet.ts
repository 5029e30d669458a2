/**
 * A persistent set of holds, indexed by key: what a fiber holds (fiberHolds.ts). A fiber may hold
 * thousands of leases (one that acquires many keys, or joins many children that did), so adding,
 * finding and removing one costs O(log n) rather than a copy of the whole set: with arrays, a
 * burst of n acquisitions joined into one fiber cost O(n²).
 */
import { HashMap, Option } from "effect"
import type { Hold } from "./hold.js"
import { isLive } from "./hold.js"

/** Holds by key (few per key: one per backend instance and kind), each array never empty. */
export type HoldSet = HashMap.HashMap<string, ReadonlyArray<Hold>>

export const empty: HoldSet = HashMap.empty()

const none: ReadonlyArray<Hold> = []

/** The holds on `key`, live or not. */
export const on = (set: HoldSet, key: string): ReadonlyArray<Hold> => {
  if (HashMap.size(set) === 0) return none
  const found = HashMap.get(set, key)
  return Option.isSome(found) ? found.value : none
}

/** Whether `hold` is in the set. */
export const has = (set: HoldSet, hold: Hold): boolean => on(set, hold.key).includes(hold)

/** `set` with `hold` (the key's holds that ended are dropped on the way). */
export const add = (set: HoldSet, hold: Hold): HoldSet => {
  const current = on(set, hold.key)
  if (current.length === 0) return HashMap.set(set, hold.key, [hold])
  const next = current.filter((h) => h !== hold && isLive(h))
  next.push(hold)
  return HashMap.set(set, hold.key, next)
}

/** `set` without `hold` (and without the key's holds that ended). */
export const remove = (set: HoldSet, hold: Hold): HoldSet => {
  const current = on(set, hold.key)
  if (current.length === 0) return set
  const next = current.filter((h) => h !== hold && isLive(h))
  return next.length === 0 ? HashMap.remove(set, hold.key) : HashMap.set(set, hold.key, next)
}

/** Every hold in the set. */
export const forEach = (set: HoldSet, f: (hold: Hold) => void): void => {
  HashMap.forEach(set, (holds) => {
    for (const hold of holds) f(hold)
  })
}
