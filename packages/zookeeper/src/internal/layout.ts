/**
 * Where the backend keeps things in ZooKeeper, and how a contender's node is named and read.
 *
 * Under the namespace (default `/lockstep`):
 * - `locks/<key>`: a persistent node per key while anyone holds or waits; its children are the
 *   contenders, ephemeral sequential nodes named `<holder>~<mode>~<fair>~` followed by
 *   ZooKeeper's ten-digit sequence number. The holder comes first so that a
 *   contender whose `create` answer was lost finds its node again by that prefix.
 * - `latches/<key>`: a persistent node per latch, its count and remembered calls as JSON.
 * - `fences/<key>`: a key's fence floor (only for keys whose floor was raised).
 */
import type { LockBackend } from "@lockstep/core"

/** A key or holder as one path segment: percent-encoded, dots too (`.` and `..` are not names). */
export const segment = (text: string): string => encodeURIComponent(text).replace(/\./g, "%2E").replace(/\*/g, "%2A")

export interface Paths {
  readonly root: string
  readonly locks: string
  readonly latches: string
  readonly fences: string
  readonly lock: (key: string) => string
  readonly latch: (key: string) => string
  readonly fence: (key: string) => string
}

export const paths = (namespace: string): Paths => {
  const root = namespace === "/" ? "" : namespace
  const locks = `${root}/locks`
  const latches = `${root}/latches`
  const fences = `${root}/fences`
  return {
    root: root === "" ? "/" : root,
    locks,
    latches,
    fences,
    lock: (key) => `${locks}/${segment(key)}`,
    latch: (key) => `${latches}/${segment(key)}`,
    fence: (key) => `${fences}/${segment(key)}`
  }
}

/** A contender's node, as its name tells. */
export interface Contender {
  readonly name: string
  readonly holder: string
  /** The mode it was made for (a writer may take the read lock as well later). */
  readonly mode: LockBackend.HoldMode
  readonly fair: boolean
  readonly sequence: number
}

/** The prefix of a holder's node names: what it searches for when a `create` answer was lost. */
export const prefixOf = (holder: string): string => `${segment(holder)}~`

export const nodeName = (request: LockBackend.AcquireRequest): string =>
  `${prefixOf(request.holder)}${request.mode === "exclusive" ? "x" : "s"}~${request.fair ? 1 : 0}~`

/** A child name read back; `undefined` for a name this backend did not make. */
export const parseContender = (name: string): Contender | undefined => {
  const parts = name.split("~")
  if (parts.length !== 4) return undefined
  const [holder, mode, fair, sequence] = parts as [string, string, string, string]
  const seq = Number(sequence)
  if ((mode !== "x" && mode !== "s") || !Number.isInteger(seq)) return undefined
  return {
    name,
    holder: decodeURIComponent(holder),
    mode: mode === "x" ? "exclusive" : "shared",
    fair: fair === "1",
    sequence: seq
  }
}

/**
 * A contender node's data: its hold counts, its lease and its waiter timeout. A node expires
 * `lease` (held) or `waiterTtl` (waiting) after its last write, on the ensemble's clock (`mtime`).
 */
export interface NodeData {
  /** Exclusive hold count. */
  readonly x: number
  /** Shared hold count. */
  readonly s: number
  /** Permits of the shared hold (or asked for). */
  readonly p: number
  /** The shared limit (-1: none, a read lock's). */
  readonly m: number
  /** Lease in ms, from the last write. */
  readonly l: number
  /** Waiter timeout in ms, from the last write, while the node waits. */
  readonly w: number
  /**
   * 1 once its holder has been told it holds (or is about to be, with this write): the node
   * lasts its lease, and `inspect` reports it as a holder. 0 while it waits: the node lasts its
   * waiter timeout, also once its standing lets it in (its holder may never come back for it).
   */
  readonly g: 0 | 1
  /**
   * The fence of a waiter let in: the zxid of the write its last attempt began with (its node's
   * own `czxid` is older than grants made while it waited). Absent: the node's `czxid` is it.
   */
  readonly f?: number | undefined
}

export const encodeData = (data: NodeData): Buffer =>
  Buffer.from(JSON.stringify({ ...data, m: data.m === Infinity ? -1 : data.m }))

export const decodeData = (buffer: Buffer): NodeData | undefined => {
  try {
    const value = JSON.parse(buffer.toString("utf8")) as Partial<NodeData>
    if (typeof value.x !== "number" || typeof value.s !== "number" || typeof value.l !== "number") return undefined
    const limit = value.m ?? 1
    return {
      x: value.x,
      s: value.s,
      p: value.p ?? 0,
      m: limit === -1 ? Infinity : limit,
      l: value.l,
      w: value.w ?? value.l,
      g: value.g === 0 ? 0 : 1,
      f: typeof value.f === "number" ? value.f : undefined
    }
  } catch {
    return undefined
  }
}

/** A key's fence floor: fences are the contender node's `czxid` plus `base`. */
export const decodeFloor = (buffer: Buffer): number => {
  try {
    const value = JSON.parse(buffer.toString("utf8")) as { readonly b?: unknown }
    return typeof value.b === "number" ? value.b : 0
  } catch {
    return 0
  }
}

export const encodeFloor = (base: number): Buffer => Buffer.from(JSON.stringify({ b: base }))
