/** Where an item sits in a `Heap`: when it is due, and its index (-1: not in the heap). */
export interface HeapItem {
  at: number
  index: number
}

/** A binary min-heap of items by `at`; each item knows its index, so it can be moved or removed. */
export class Heap<A extends HeapItem = HeapItem> {
  private readonly entries: Array<A> = []
  get size() {
    return this.entries.length
  }
  peek(): A | undefined {
    return this.entries[0]
  }
  /** Puts `entry` at time `at`, or moves it there if it is in already. */
  set(entry: A, at: number) {
    if (entry.index < 0) {
      entry.at = at
      entry.index = this.entries.length
      this.entries.push(entry)
      this.up(entry.index)
    } else {
      const earlier = at < entry.at
      entry.at = at
      if (earlier) this.up(entry.index)
      else this.down(entry.index)
    }
  }
  remove(entry: A) {
    const i = entry.index
    if (i < 0) return
    entry.index = -1
    const last = this.entries.pop()!
    if (last === entry) return
    this.entries[i] = last
    last.index = i
    this.up(i)
    this.down(last.index)
  }
  private up(i: number) {
    const entries = this.entries
    const entry = entries[i]!
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (entries[parent]!.at <= entry.at) break
      const moved = entries[parent]!
      entries[i] = moved
      moved.index = i
      i = parent
    }
    entries[i] = entry
    entry.index = i
  }
  private down(i: number) {
    const entries = this.entries
    const entry = entries[i]!
    while (true) {
      const left = 2 * i + 1
      if (left >= entries.length) break
      const right = left + 1
      const child = right < entries.length && entries[right]!.at < entries[left]!.at ? right : left
      if (entries[child]!.at >= entry.at) break
      const moved = entries[child]!
      entries[i] = moved
      moved.index = i
      i = child
    }
    entries[i] = entry
    entry.index = i
  }
}
