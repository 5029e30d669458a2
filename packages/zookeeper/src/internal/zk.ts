/**
 * ZooKeeper requests as Effects, on node-zookeeper-client. Requests go out in batches: every
 * request of a batch is written to the session's connection in order before the first answer is
 * read, so a batch costs one round trip, and ZooKeeper answers a session's requests in the order
 * they were sent (a read after a write in the same batch sees the write).
 */
import { Effect } from "effect"
import type * as Zk from "node-zookeeper-client"

/** ZooKeeper's error codes the backend tells apart (`KeeperException.Code`). */
export const Code = {
  connectionLoss: -4,
  noNode: -101,
  badVersion: -103,
  nodeExists: -110,
  notEmpty: -111,
  sessionExpired: -112,
  noAuth: -102
} as const

/** A request that ZooKeeper (or the client) refused, with ZooKeeper's code and name. */
export class ZkFailure extends Error {
  constructor(readonly code: number, readonly codeName: string, readonly path: string | undefined) {
    super(path === undefined ? codeName : `${codeName} at ${path}`)
    this.name = "ZkFailure"
  }
}

/** No answer within the command timeout: the request may or may not have been applied. */
export class ZkTimeout extends Error {
  constructor(readonly timeoutMs: number) {
    super(`no answer from ZooKeeper within ${timeoutMs} ms`)
    this.name = "ZkTimeout"
  }
}

/** The node metadata the backend reads, as numbers (ZooKeeper's longs fit in 53 bits here). */
export interface Stat {
  readonly czxid: number
  readonly mzxid: number
  /** Server time (ms) of the node's last write, as the leader's clock read it. */
  readonly mtime: number
  readonly ctime: number
  readonly version: number
  readonly numChildren: number
  readonly ephemeralOwner: number
}

const long = (buffer: Buffer): number => Number(buffer.readBigInt64BE(0))

const statOf = (stat: Zk.Stat): Stat => ({
  czxid: long(stat.czxid),
  mzxid: long(stat.mzxid),
  mtime: long(stat.mtime),
  ctime: long(stat.ctime),
  version: stat.version,
  numChildren: stat.numChildren,
  ephemeralOwner: long(stat.ephemeralOwner)
})

/** One request of a batch. `watch`: called once when the node changes or goes. */
export type Request =
  | { readonly _tag: "create"; readonly path: string; readonly data: Buffer; readonly mode: number }
  | { readonly _tag: "setData"; readonly path: string; readonly data: Buffer; readonly version: number }
  | { readonly _tag: "getData"; readonly path: string; readonly watch?: ((event: Zk.Event) => void) | undefined }
  | { readonly _tag: "getChildren"; readonly path: string }
  | { readonly _tag: "exists"; readonly path: string; readonly watch?: ((event: Zk.Event) => void) | undefined }
  | { readonly _tag: "remove"; readonly path: string; readonly version: number }

/** What each kind of request answers. */
export type Reply =
  | { readonly _tag: "created"; readonly path: string }
  | { readonly _tag: "stat"; readonly stat: Stat }
  | { readonly _tag: "data"; readonly data: Buffer; readonly stat: Stat }
  | { readonly _tag: "children"; readonly children: ReadonlyArray<string> }
  | { readonly _tag: "exists"; readonly stat: Stat | undefined }
  | { readonly _tag: "removed" }

/** A request's outcome: its reply, or ZooKeeper's refusal of this request alone. */
export type Outcome = Reply | ZkFailure

const failureOf = (error: unknown, path: string): ZkFailure | Error => {
  if (typeof error === "object" && error !== null && "code" in error && typeof error.code === "number") {
    const name = "name" in error && typeof error.name === "string" ? error.name : `code ${error.code}`
    return new ZkFailure(error.code, name, path)
  }
  return error instanceof Error ? error : new Error(String(error))
}

const send = (client: Zk.Client, request: Request, answer: (outcome: Outcome | Error) => void): void => {
  const fail = (error: unknown) => answer(failureOf(error, request.path))
  switch (request._tag) {
    case "create":
      return client.create(request.path, request.data, request.mode, (error, path) =>
        error ? fail(error) : answer({ _tag: "created", path }))
    case "setData":
      return client.setData(request.path, request.data, request.version, (error, stat) =>
        error ? fail(error) : answer({ _tag: "stat", stat: statOf(stat) }))
    case "getData": {
      const reply = (error: unknown, data: Buffer, stat: Zk.Stat) =>
        error ? fail(error) : answer({ _tag: "data", data: data ?? Buffer.alloc(0), stat: statOf(stat) })
      return request.watch === undefined
        ? client.getData(request.path, reply)
        : client.getData(request.path, request.watch, reply)
    }
    case "getChildren":
      return client.getChildren(request.path, (error, children) =>
        error ? fail(error) : answer({ _tag: "children", children }))
    case "exists": {
      const reply = (error: unknown, stat: Zk.Stat | null) =>
        error ? fail(error) : answer({ _tag: "exists", stat: stat ? statOf(stat) : undefined })
      return request.watch === undefined
        ? client.exists(request.path, reply)
        : client.exists(request.path, request.watch, reply)
    }
    case "remove":
      return client.remove(request.path, request.version, (error) => error ? fail(error) : answer({ _tag: "removed" }))
  }
}

/**
 * Sends `requests` in order and succeeds with one outcome per request, once all have answered. A
 * request ZooKeeper refused is that request's outcome; the batch fails when the session cannot
 * answer at all (connection loss, session expiry: with every request's own code the same) or
 * when not every answer arrived within `timeoutMs`. Interrupting the wait abandons the answers,
 * not the requests.
 */
export const batch = (
  client: Zk.Client,
  requests: ReadonlyArray<Request>,
  timeoutMs: number
): Effect.Effect<ReadonlyArray<Outcome>, ZkFailure | ZkTimeout | Error> =>
  Effect.async<ReadonlyArray<Outcome>, ZkFailure | ZkTimeout | Error>((resume) => {
    const outcomes: Array<Outcome> = new Array(requests.length)
    let left = requests.length
    let done = false
    const finish = (effect: Effect.Effect<ReadonlyArray<Outcome>, ZkFailure | ZkTimeout | Error>) => {
      if (done) return
      done = true
      clearTimeout(timer)
      resume(effect)
    }
    const timer = setTimeout(() => finish(Effect.fail(new ZkTimeout(timeoutMs))), timeoutMs)
    requests.forEach((request, index) => {
      try {
        send(client, request, (outcome) => {
          if (done) return
          if (!(outcome instanceof ZkFailure) && outcome instanceof Error) return finish(Effect.fail(outcome))
          if (outcome instanceof ZkFailure && isSessionFailure(outcome)) return finish(Effect.fail(outcome))
          outcomes[index] = outcome
          left -= 1
          if (left === 0) finish(Effect.succeed(outcomes))
        })
      } catch (error) {
        // the client throws for a request it cannot send (a closed client, a bad path)
        finish(Effect.fail(failureOf(error, request.path)))
      }
    })
    if (requests.length === 0) finish(Effect.succeed(outcomes))
    return Effect.sync(() => {
      done = true
      clearTimeout(timer)
    })
  })

/** A failure of the session rather than of one request: nothing in the batch can be trusted. */
export const isSessionFailure = (failure: ZkFailure): boolean =>
  failure.code === Code.connectionLoss || failure.code === Code.sessionExpired || failure.code === -5 /* marshalling */ ||
  failure.code === -6 /* unimplemented */ || failure.code === -7 /* operation timeout */ || failure.code === -1 /* system */

/** The outcome's reply if it is of kind `tag`; `undefined` for a refusal (or another kind). */
export const replyOf = <T extends Reply["_tag"]>(outcome: Outcome | undefined, tag: T): Extract<Reply, { _tag: T }> | undefined =>
  outcome !== undefined && !(outcome instanceof ZkFailure) && outcome._tag === tag ? (outcome as Extract<Reply, { _tag: T }>) : undefined

/** The refusal's code, 0 for a reply (-1 for no outcome at all). */
export const codeOf = (outcome: Outcome | undefined): number => (outcome instanceof ZkFailure ? outcome.code : outcome === undefined ? -1 : 0)
