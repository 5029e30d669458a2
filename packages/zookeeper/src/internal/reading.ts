/**
 * Reading a key's contenders: their names from the key's children, their data in one more round
 * trip, and the expired ones deleted.
 */
import { Effect } from "effect"
import type { LockBackend } from "@lockstep/core"
import type { BackendError } from "@lockstep/core/LockError"
import type { BackendContext } from "./context.js"
import type { Contender } from "./layout.js"
import { decodeData, decodeFloor, parseContender } from "./layout.js"
import type { Judged, Seen } from "./queue.js"
import { isHolder } from "./queue.js"
import type { Outcome, Request } from "./zk.js"
import { Code, codeOf, replyOf } from "./zk.js"

/** The contenders of a key from its children, in sequence order. */
export const contendersOf = (outcome: Outcome | undefined): Array<Contender> => {
  const children = replyOf(outcome, "children")?.children ?? []
  const list: Array<Contender> = []
  for (const child of children) {
    const contender = parseContender(child)
    if (contender !== undefined) list.push(contender)
  }
  return list.sort((a, b) => a.sequence - b.sequence)
}

/** The key's fence floor from its floor node's data (0: none raised). */
export const floorOf = (outcome: Outcome | undefined): number => {
  const data = replyOf(outcome, "data")
  return data === undefined ? 0 : decodeFloor(data.data)
}

/** A shared holder of the key whose limit is not the request's: the key's stored limit, as the rules keep it. */
export const limitConflict = (live: ReadonlyArray<Judged>, request: LockBackend.AcquireRequest): Judged | undefined =>
  live.find((n) => isHolder(n) && n.data!.s > 0 && n.data!.m !== request.limit)

/**
 * Reads the data of `contenders` (one round trip, after the `extra` requests, whose outcomes come
 * back as they are); a node that is gone is left out.
 */
export const readNodes = (
  ctx: BackendContext,
  operation: string,
  lockPath: string,
  contenders: ReadonlyArray<Contender>,
  extra: ReadonlyArray<Request> = []
): Effect.Effect<{ readonly seen: Array<Seen>; readonly extra: ReadonlyArray<Outcome> }, BackendError> =>
  Effect.flatMap(
    ctx.send(operation, [
      ...extra,
      ...contenders.map((c): Request => ({ _tag: "getData", path: `${lockPath}/${c.name}` }))
    ]),
    (outcomes) =>
      Effect.gen(function*() {
        const seen: Array<Seen> = []
        for (let i = 0; i < contenders.length; i++) {
          const outcome = outcomes[extra.length + i]
          yield* ctx.expect(operation, outcome, Code.noNode)
          const data = replyOf(outcome, "data")
          if (data === undefined) continue
          seen.push({
            contender: contenders[i]!,
            data: decodeData(data.data),
            mtime: data.stat.mtime,
            version: data.stat.version,
            czxid: data.stat.czxid
          })
        }
        return { seen, extra: outcomes.slice(0, extra.length) }
      })
  )

/** A key's contenders as they are now (two round trips), and its fence floor. */
export const readKey = (ctx: BackendContext, operation: string, key: string) =>
  Effect.gen(function*() {
    const lockPath = ctx.layout.lock(key)
    const first = yield* ctx.send(operation, [
      { _tag: "getChildren", path: lockPath },
      { _tag: "getData", path: ctx.layout.fence(key) }
    ])
    yield* ctx.expect(operation, first[0], Code.noNode)
    const read = yield* readNodes(ctx, operation, lockPath, contendersOf(first[0]))
    return { lockPath, seen: read.seen, floor: floorOf(first[1]) }
  })

/**
 * Deletes expired nodes, each only if unchanged since it was judged expired: whether all went (a
 * node renewed meanwhile is live after all, and the caller judges again).
 */
export const dropExpired = (
  ctx: BackendContext,
  operation: string,
  lockPath: string,
  expired: ReadonlyArray<Seen>
): Effect.Effect<boolean, BackendError> =>
  expired.length === 0
    ? Effect.succeed(true)
    : Effect.map(
      ctx.send(operation, expired.map((node): Request => ({ _tag: "remove", path: `${lockPath}/${node.contender.name}`, version: node.version }))),
      (outcomes) => outcomes.every((o) => codeOf(o) !== Code.badVersion)
    )
