/**
 * Ids remembered until a time each (ended holders, applied latch calls): looked up by hash, and
 * forgotten oldest first from a queue of their arrivals.
 *
 * A `Map` alone cannot be forgotten from the front cheaply: V8 leaves a deleted entry as a hole
 * until the table is rebuilt, and every new iteration walks over all the holes before it, so a
 * busy key that forgot from the front of its map on each operation paid for every release of the
 * last lease period, on every operation.
 */
export interface Remembered {
  /** Whether `id` is remembered past `now`. */
  readonly has: (id: string, now: number) => boolean
  /** Remembers `id` until `until` (a later call for the same id replaces the time). */
  readonly set: (id: string, until: number) => void
  /**
   * Forgets, oldest first, the ids whose time is up at `now`, stopping at the first one still
   * remembered: one remembered longer may hold a few shorter ones back a little, never forever.
   */
  readonly forget: (now: number) => void
  /** Ids remembered (some may be past their time and not yet forgotten). */
  readonly size: () => number
}

/** Past this many forgotten arrivals at its head, the queue is compacted (when it is half dead). */
const compactAfter = 1024

export const makeRemembered = (): Remembered => {
  const until = new Map<string, number>()
  // arrivals, oldest first, from `head` on: an id set again arrives again, and its earlier
  // arrival is skipped when it comes up (its time no longer matches)
  let ids: Array<string> = []
  let times: Array<number> = []
  let head = 0
  return {
    has: (id, now) => (until.get(id) ?? 0) > now,
    set: (id, time) => {
      until.set(id, time)
      ids.push(id)
      times.push(time)
    },
    forget: (now) => {
      while (head < ids.length && times[head]! <= now) {
        const id = ids[head]!
        if (until.get(id) === times[head]) until.delete(id)
        head++
      }
      if (head === ids.length) {
        ids = []
        times = []
        head = 0
      } else if (head > compactAfter && head * 2 > ids.length) {
        ids = ids.slice(head)
        times = times.slice(head)
        head = 0
      }
    },
    size: () => until.size
  }
}
