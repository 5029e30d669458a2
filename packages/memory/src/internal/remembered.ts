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

/**
 * The number an id ends with after its last `:` (lockstep's holders are `<clientId>:<n>`, `n`
 * counting up in each process), or `NaN`. The same id always gives the same number.
 */
const numberOf = (id: string): number => {
  const colon = id.lastIndexOf(":")
  if (colon === -1 || colon === id.length - 1) return NaN
  const code = id.charCodeAt(colon + 1)
  // digits only (Number() would also read "", " 1", "0x1f" and "1e3")
  for (let i = colon + 1; i < id.length; i++) {
    const c = id.charCodeAt(i)
    if (c < 48 || c > 57) return NaN
  }
  return code === 48 && id.length - colon > 2 ? NaN : Number(id.slice(colon + 1))
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
  /**
   * The greatest number of an id ever set: an id numbered above it was never set, and is answered
   * without looking it up. (A new holder's first request asks after an id nobody has seen, and
   * the table may hold a lease's worth of ended holders: a miss there costs more than the rest of
   * the request.)
   */
  let greatest = -1
  // A run of numbered ids, each set once, in arrival order and numbered upwards, from `runHead`
  // on: holders of one process end mostly in the order they began, and a lease's worth of them
  // costs two array slots each here rather than a hash table's entry. An id that would not extend
  // the run (numbered at or below `runLast`, or set again) goes to `until`, which then has its
  // latest time (a later set of it goes there too: `runLast` never goes down).
  let runNumbers: Array<number> = []
  let runIds: Array<string> = []
  let runTimes: Array<number> = []
  let runHead = 0
  let runLast = -1
  /** Entries of the run not yet forgotten nor set again. */
  let runLive = 0
  /** Where `id` (numbered `n`) is in the run, or -1. */
  const inRun = (id: string, n: number): number => {
    let low = runHead
    let high = runNumbers.length - 1
    while (low <= high) {
      const middle = (low + high) >>> 1
      const at = runNumbers[middle]!
      if (at === n) return runIds[middle] === id ? middle : -1
      if (at < n) low = middle + 1
      else high = middle - 1
    }
    return -1
  }
  return {
    has: (id, now) => {
      const n = numberOf(id)
      if (n > greatest) return false
      const time = until.get(id)
      if (time !== undefined) return time > now
      if (!(n <= runLast)) return false
      const at = inRun(id, n)
      return at !== -1 && runTimes[at]! > now
    },
    set: (id, time) => {
      const n = numberOf(id)
      if (n > greatest) greatest = n
      if (n > runLast) {
        runLast = n
        runNumbers.push(n)
        runIds.push(id)
        runTimes.push(time)
        runLive++
        return
      }
      if (n <= runLast && !until.has(id)) {
        // set again: from now on its time is kept in `until`
        const at = inRun(id, n)
        if (at !== -1 && runTimes[at] !== -Infinity) {
          runTimes[at] = -Infinity
          runLive--
        }
      }
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
      while (runHead < runTimes.length && runTimes[runHead]! <= now) {
        if (runTimes[runHead] !== -Infinity) runLive--
        runHead++
      }
      if (runHead === runTimes.length) {
        runNumbers = []
        runIds = []
        runTimes = []
        runHead = 0
      } else if (runHead > compactAfter && runHead * 2 > runTimes.length) {
        runNumbers = runNumbers.slice(runHead)
        runIds = runIds.slice(runHead)
        runTimes = runTimes.slice(runHead)
        runHead = 0
      }
    },
    size: () => until.size + runLive
  }
}
