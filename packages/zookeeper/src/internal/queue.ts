/**
 * The contenders of a key, in ZooKeeper's sequence order, judged the way every client judges
 * them: a node's standing follows from the nodes before it alone, so every client that sees the
 * same nodes reaches the same verdict, and a node whose creation a client saw comes after every
 * node created before it (ZooKeeper applies a session's writes in order, and a read after a
 * write sees everything before the write).
 *
 * - an exclusive node holds iff no live node stands before it;
 * - a shared node holds iff no live node before it is exclusive (a waiting writer included:
 *   it may hold as soon as those before it leave) and the permits of the live shared nodes
 *   before it, waiting ones included, plus its own fit its limit.
 *
 * Waiting nodes count as if they held: a client that has not yet seen that a waiting node now
 * holds must not let anybody in behind it.
 */
import type { Contender, NodeData } from "./layout.js"

export interface Seen {
  readonly contender: Contender
  /** `undefined`: unreadable, judged as a writer that never expires. */
  readonly data: NodeData | undefined
  /** Server time of the node's last write. */
  readonly mtime: number
  readonly version: number
  readonly czxid: number
}

export interface Judged extends Seen {
  /** Its standing lets it in (its holder may not know yet). */
  readonly holds: boolean
  /** When the node expires on the server's clock. */
  readonly expiresAt: number
}

/** A node whose holder has been told it holds. */
export const isHolder = (node: Judged): boolean => node.holds && node.data !== undefined && node.data.g === 1

/**
 * Whether the node keeps shared nodes behind it out: a writer, or a waiting writer (by its data:
 * a node made for a read may be asked for the write lock by its holder while it waits).
 */
export const excludesReaders = (node: Seen): boolean =>
  node.data === undefined || node.data.x > 0 ||
  (node.contender.mode === "exclusive" && !(node.data.x === 0 && node.data.s > 0))

/** What a node asks for: its mode, and for a shared one its permits and the key's limit. */
export interface Ask {
  readonly mode: "exclusive" | "shared"
  readonly permits: number
  readonly limit: number
}

/** Whether a node standing after `ahead` may hold now, as `ahead` stands. */
export const mayHold = (ahead: ReadonlyArray<Seen>, ask: Ask): boolean => {
  if (ask.mode === "exclusive") return ahead.length === 0
  let permits = 0
  for (const node of ahead) {
    if (excludesReaders(node)) return false
    permits += node.data!.p
  }
  return permits + ask.permits <= ask.limit
}

const askOf = (node: Seen): Ask =>
  node.data === undefined || excludesReaders(node)
    ? { mode: "exclusive", permits: 1, limit: 1 }
    : { mode: "shared", permits: node.data.p, limit: node.data.m }

/**
 * Judges the nodes in sequence order at server time `now`: which hold, and which have expired
 * (an expired node is left out of the standing of the nodes after it).
 */
export const judge = (
  nodes: ReadonlyArray<Seen>,
  now: number
): { readonly live: ReadonlyArray<Judged>; readonly expired: ReadonlyArray<Seen> } => {
  const live: Array<Judged> = []
  const expired: Array<Seen> = []
  for (const node of nodes) {
    const holds = mayHold(live, askOf(node))
    const data = node.data
    // a node without readable data is one being written: it does not expire here
    const ttl = data === undefined ? Infinity : data.g === 1 ? data.l : data.w
    const expiresAt = node.mtime + ttl
    if (now > expiresAt) expired.push(node)
    else live.push({ ...node, holds, expiresAt })
  }
  return { live, expired }
}
