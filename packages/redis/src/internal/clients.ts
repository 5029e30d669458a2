/**
 * The ioredis clients of a Redis backend (`Client`: each one connection to a server, or a
 * cluster's): the opening of the one `layerFrom` owns from a `Connection`, with its URL check, and
 * the backend's own duplicates (the subscriber, the acknowledged connection). `tracker.ts` follows
 * them; `descriptions.ts` names them and their errors.
 */
import type { Scope } from "effect"
import { Duration, Effect, Either } from "effect"
import { Cluster, Redis, SentinelConnector } from "ioredis"
import type { RedisOptions } from "ioredis"
import { BackendError } from "@lockstep/core/LockError"
import type { Client, Connection, Tuning } from "../RedisBackend.js"
import {
  errorDetail,
  nodeAddress,
  sentinelEndpoint,
  firstLine,
  hideCertificate,
  hostPort,
  isCertificateError,
  isCluster,
  redact,
  refusedCommand,
  SENTINEL_PORT,
  SENTINEL_ROUND,
  viaSentinels
} from "./descriptions.js"

/** The command timeout of `tuning` (default 2 seconds). */
export const commandTimeout = (tuning?: Tuning): Duration.Duration => Duration.decode(tuning?.commandTimeout ?? "2 seconds")

/** Which connection of a backend: the one its commands go through, or the one its subscriptions use. */
export type Role = "commands" | "subscriber" | "acknowledged"

// ---------------------------------------------------------------------------------------------
// opening (layerFrom, the subscriber)
// ---------------------------------------------------------------------------------------------

/**
 * `disconnectTimeout` of the connections a backend opens itself. ioredis closes a connection by
 * ending its socket and destroying it after `disconnectTimeout` (2 s by default) on a timer that
 * is not unref'd and that only the socket's 'close' clears. A socket that has already closed (a
 * connection closed between reconnects, or closed during its handshake, which ioredis then closes
 * a second time when its ready check fails) never emits 'close' again, and a half-open one (a
 * paused server) waits for the whole timeout: either way the timer kept the process alive for 2 s
 * after the backend was closed. A connection of ours waits for nothing once we close it.
 */
const disconnectTimeout = 0

/**
 * `disableClientInfo` of the connections a backend opens itself. A server at its `maxclients`
 * answers the first command of a new connection with `ERR max number of clients reached` and
 * closes it. ioredis's first commands are its `CLIENT SETINFO`s, whose errors it drops: what
 * reached the backend was the `write EPIPE` of the next one. Without them the first command is
 * the ready check (or AUTH, or SELECT), whose error is reported, and the backend's error says
 * that the limit was reached. They are worth nothing else to lockstep (a name in `CLIENT LIST`),
 * and a managed Redis may refuse `CLIENT` anyway.
 */
const disableClientInfo = true

const URL_SHAPE =
  "expected redis://[[username]:password@]host[:port][/db], rediss://..., redis+sentinel://... or a socket path"

const SENTINEL_URL_SHAPE =
  "expected redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/<master name>[/<db>][?sentinelUsername=...&sentinelPassword=...]"

/** The Sentinel schemes: plain, or TLS to the data nodes and the sentinels alike. */
const SENTINEL_SCHEME = /^(rediss?)\+sentinel:\/\//i

/** Whether `url` names a master through its sentinels (`redis+sentinel://`, `rediss+sentinel://`). */
export const isSentinelUrl = (url: string): boolean => SENTINEL_SCHEME.test(url)

/** What the query of a Sentinel URL may set: the credentials of the sentinels themselves. */
const SENTINEL_PARAMETERS = ["sentinelUsername", "sentinelPassword"] as const

/** A percent-decoded URL part, or undefined if it is malformed (`%zz`). */
const decode = (part: string): string | undefined => {
  try {
    return decodeURIComponent(part)
  } catch {
    return undefined
  }
}

/**
 * The ioredis options of a Sentinel URL, or why it is none:
 * `redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/<master name>[/<db>]`, as
 * redis-py's Sentinel URL packages and Prefect read it. The sentinels listen on 26379 unless a
 * port is given (IPv6 in brackets); the credentials before `@` and the database are those of the
 * data nodes; the sentinels' own, where they require any, are the query parameters
 * `sentinelUsername` and `sentinelPassword`. `rediss+sentinel://` speaks TLS to both (trusting
 * Node's default CAs: for other certificates, pass ioredis options). Every part is percent-decoded.
 */
export const sentinelOptions = (url: string): Either.Either<RedisOptions, string> => {
  const scheme = SENTINEL_SCHEME.exec(url)
  if (scheme === null) return Either.left(SENTINEL_URL_SHAPE)
  const tls = scheme[1]!.toLowerCase() === "rediss"
  let rest = url.slice(scheme[0].length)
  if (rest.includes("#")) return Either.left("a fragment (#...) means nothing here")
  const queryAt = rest.indexOf("?")
  const query = queryAt < 0 ? "" : rest.slice(queryAt + 1)
  if (queryAt >= 0) rest = rest.slice(0, queryAt)
  const slash = rest.indexOf("/")
  const authority = slash < 0 ? rest : rest.slice(0, slash)
  const path = slash < 0 ? "" : rest.slice(slash)
  const at = authority.lastIndexOf("@")
  const hosts = authority.slice(at + 1)

  if (hosts === "") return Either.left("no sentinel address")
  const sentinels: Array<{ host: string; port: number }> = []
  for (const address of hosts.split(",")) {
    const parts = /^(?:\[([0-9a-f:.]+)\]|([a-z0-9._-]+))(?::(\d+))?$/i.exec(address)
    if (parts === null) {
      return Either.left(
        address === "" ? "an empty sentinel address (two commas?)" : "a sentinel address is no host[:port]"
      )
    }
    const port = parts[3] === undefined ? SENTINEL_PORT : Number(parts[3])
    if (port < 1 || port > 65535) return Either.left(`port ${parts[3]} is out of range`)
    sentinels.push({ host: parts[1] ?? parts[2]!, port })
  }

  // "/<name>", "/<name>/", "/<name>/<db>"
  const segments = path === "" ? [] : path.slice(1).split("/")
  if (segments[segments.length - 1] === "" && segments.length > 1) segments.pop()
  if (segments.length === 0 || segments[0] === "") {
    return Either.left("no master name (the path is /<master name>[/<db>])")
  }
  if (segments.length > 2) return Either.left(`the path must be /<master name>[/<db>], not ${path}`)
  const name = decode(segments[0]!)
  if (name === undefined || name === "") return Either.left("malformed master name")
  const db = segments[1]
  if (db !== undefined && !/^\d+$/.test(db)) return Either.left(`the database must be a number, not ${JSON.stringify(db)}`)

  const options: RedisOptions = { sentinels, name }
  if (db !== undefined) options.db = Number(db)
  if (at >= 0) {
    const userinfo = authority.slice(0, at)
    const colon = userinfo.indexOf(":")
    const username = decode(colon < 0 ? userinfo : userinfo.slice(0, colon))
    const password = colon < 0 ? "" : decode(userinfo.slice(colon + 1))
    if (username === undefined || password === undefined) return Either.left("malformed credentials")
    if (username !== "") options.username = username
    if (password !== "") options.password = password
  }
  // '+' is a plus sign here, not a space: a password that contains one needs no encoding
  for (const parameter of query === "" ? [] : query.split("&")) {
    const equals = parameter.indexOf("=")
    const key = equals < 0 ? parameter : parameter.slice(0, equals)
    const value = decode(equals < 0 ? "" : parameter.slice(equals + 1))
    if (!(SENTINEL_PARAMETERS as ReadonlyArray<string>).includes(key)) {
      return Either.left(`an unknown parameter (known: ${SENTINEL_PARAMETERS.join(", ")})`)
    }
    if (value === undefined) return Either.left(`malformed ${key}`)
    if (value !== "") options[key as (typeof SENTINEL_PARAMETERS)[number]] = value
  }
  if (tls) {
    options.tls = {}
    options.sentinelTLS = {}
    options.enableTLSForSentinelMode = true
  }
  return Either.right(options)
}

/**
 * How long a connection through sentinels waits for a sentinel's answer to which master to
 * connect to before it asks the next one, unless its `sentinelCommandTimeout` says otherwise.
 * ioredis waits as long as it takes: a sentinel that accepts connections but does not
 * answer (paused, overloaded) held every reconnection until it answered again, whatever the
 * other sentinels knew. A sentinel answers `SENTINEL GET-MASTER-ADDR-BY-NAME` from memory. Only
 * those questions: the failover detector's subscriptions wait as long as ioredis lets them (a
 * timer on a SUBSCRIBE to a sentinel that is down would outlive the connection's closing).
 */
const SENTINEL_COMMAND_TIMEOUT_MS = 1_000

/**
 * Per connector of ours, the certificate of a sentinel that its last question for the master
 * refused (the sentinels speak TLS, and theirs cannot be trusted).
 */
const refusedBySentinel = new WeakMap<object, Error>()

/**
 * Whether `error`, a sentinel round that failed, failed on a sentinel's certificate: ioredis
 * reports the round in words only ("... Last error: <message>"), its connector knows more.
 */
export const refusedSentinelCertificate = (client: Client, error: unknown): boolean => {
  if (!(error instanceof Error) || SENTINEL_ROUND.exec(firstLine(error.message)) === null) return false
  const connector: unknown = (client as unknown as { readonly connector?: unknown }).connector
  return typeof connector === "object" && connector !== null && refusedBySentinel.has(connector)
}

/**
 * ioredis's `SentinelConnector`, whose own connections to the sentinels (one per sentinel asked
 * for the master, and the failover detector's) wait for nothing once closed, like the rest of
 * ours (see `disconnectTimeout`), whose questions for the master are answered within
 * `SENTINEL_COMMAND_TIMEOUT_MS`, and which reports a sentinel whose certificate it refused as
 * that refusal (ioredis says "Connection is closed."). ioredis gives them its default 2 s, whatever the connection's
 * own setting: each one to a sentinel that was down (its socket closed already, so no 'close'
 * clears the timer) or that did not answer kept the process alive for 2 s. Without the method it
 * overrides (private in ioredis), it is ioredis's connector as it is.
 */
class ClosingAtOnce extends SentinelConnector {}
{
  type ConnectToSentinel = (this: unknown, endpoint: unknown, options?: object) => unknown
  type Resolve = (this: unknown, endpoint: unknown) => Promise<unknown>
  const prototype = SentinelConnector.prototype as unknown as {
    readonly connectToSentinel?: ConnectToSentinel
    readonly resolve?: Resolve
  }
  const connectToSentinel = prototype.connectToSentinel
  const resolve = prototype.resolve
  if (typeof connectToSentinel === "function") {
    Object.defineProperty(ClosingAtOnce.prototype, "connectToSentinel", {
      value: function(this: { readonly options?: RedisOptions }, endpoint: unknown, options?: object) {
        // no options: a connection that asks for the master (the failover detector's have some)
        const asking = options === undefined && this.options?.sentinelCommandTimeout === undefined
        const sentinel = connectToSentinel.call(this, endpoint, {
          disconnectTimeout,
          ...(asking ? { commandTimeout: SENTINEL_COMMAND_TIMEOUT_MS } : {}),
          ...options
        })
        if (asking && sentinel instanceof Redis) {
          sentinel.on("error", (error: unknown) => {
            if (isCertificateError(error)) {
              hideCertificate(error)
              refusedBySentinel.set(this, error as Error)
            }
          })
        }
        return sentinel
      }
    })
  }
  if (typeof resolve === "function") {
    Object.defineProperty(ClosingAtOnce.prototype, "resolve", {
      value: async function(this: object, endpoint: unknown) {
        refusedBySentinel.delete(this)
        try {
          return await resolve.call(this, endpoint)
        } catch (error) {
          // the sentinel's connection ends on the refusal, and ioredis reports what that did to the
          // question asked on it ("Connection is closed."): the refusal says why
          throw refusedBySentinel.get(this) ?? error
        }
      }
    })
  }
}
// ioredis types a connector's options as `unknown`, its own as `SentinelConnectionOptions`
const SentinelConnectorClosingAtOnce = ClosingAtOnce as unknown as NonNullable<RedisOptions["Connector"]>

/**
 * ioredis's `Cluster`, which reports a node whose certificate it refused while it asked the node
 * for the slots as a 'node error' with that refusal. ioredis asks on a copy of the node's
 * connection that ignores its own errors, and reports what that did to the question ("Connection
 * is closed."). Without the method it wraps (private in ioredis), it is ioredis's `Cluster`.
 */
class ClusterReportingRefusals extends Cluster {}
{
  type GetInfoFromNode = (this: Cluster, redis: unknown, callback: unknown) => unknown
  const getInfoFromNode = (Cluster.prototype as unknown as { readonly getInfoFromNode?: GetInfoFromNode }).getInfoFromNode
  if (typeof getInfoFromNode === "function") {
    Object.defineProperty(ClusterReportingRefusals.prototype, "getInfoFromNode", {
      value: function(this: Cluster, redis: unknown, callback: unknown) {
        if (!(redis instanceof Redis)) return getInfoFromNode.call(this, redis, callback)
        const node = hostPort(redis.options.host, redis.options.port)
        const duplicate = redis.duplicate
        const own = Object.prototype.hasOwnProperty.call(redis, "duplicate")
        // the copy is made at once, in the call: the node's own `duplicate` is back right after
        redis.duplicate = (...args: Parameters<Redis["duplicate"]>) => {
          const copy = duplicate.apply(redis, args)
          copy.on("error", (error: unknown) => {
            if (isCertificateError(error)) this.emit("node error", error, node)
          })
          return copy
        }
        try {
          return getInfoFromNode.call(this, redis, callback)
        } finally {
          if (own) redis.duplicate = duplicate
          else delete (redis as { duplicate?: unknown }).duplicate
        }
      }
    })
  }
}

/**
 * Defaults of a connection through sentinels that `layerFrom` opens. `failoverDetector`: the
 * connection also subscribes to `+switch-master` on the sentinels and reconnects (through them,
 * to the new master) as soon as they announce a failover. Without it, a connection stays on the
 * old master until the sentinels convert it into a replica (they close its clients then), several
 * `INFO` / hello periods later (seconds; more than 8 with Redis's defaults): meanwhile the old
 * master keeps granting and renewing locks that the promoted master, which other clients already
 * use, knows nothing of. The cost: each connection keeps one more to every sentinel (at most 10).
 * Every sentinel announces the switch, so a connection may reconnect once more to the same new
 * master; what it had in flight is sent again, which every operation tolerates.
 */
const sentinelDefaults: RedisOptions = {
  maxRetriesPerRequest: 2,
  disconnectTimeout,
  disableClientInfo,
  failoverDetector: true,
  Connector: SentinelConnectorClosingAtOnce
}

/** Why `url` is no Redis URL ioredis would read as meant, if it is not one. */
const urlProblem = (url: string): string | undefined => {
  if (url.startsWith("/") && !url.startsWith("//")) return undefined
  // the Sentinel scheme as other clients spell it
  if (/^[a-z]*[-+]?sentinel[-+]?[a-z]*:\/\//i.test(url)) return SENTINEL_URL_SHAPE
  if (!/^rediss?:\/\//i.test(url)) return URL_SHAPE
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    const port = /^[^/]*\/\/(?:[^@/]*@)?(?:\[[^\]]*\]|[^:/?]*):(\d+)/.exec(url)?.[1]
    return port !== undefined && Number(port) > 65535 ? `port ${port} is out of range` : "malformed URL"
  }
  if (parsed.hostname === "") return "no host"
  if (!/^\/?(\d+)?$/.test(parsed.pathname)) return `the path must be a database number, not ${parsed.pathname}`
  return undefined
}

type UrlWithOptions = { readonly url: string; readonly options?: RedisOptions | undefined }

const isUrlWithOptions = (connection: Connection): connection is UrlWithOptions =>
  typeof connection === "object" && "url" in connection && typeof connection.url === "string"

/**
 * Opens the connection `layerFrom` owns (closed with the scope), or fails with BackendError
 * (operation "connect") on a URL or node list it cannot mean.
 */
export const open = (given: Connection): Effect.Effect<Client, BackendError, Scope.Scope> =>
  Effect.map(Effect.acquireRelease(
    Effect.suspend(() => {
      // a URL with options: the URL, and options over what it says
      const withUrl = isUrlWithOptions(given)
      const connection = withUrl ? given.url : given as Exclude<Connection, UrlWithOptions>
      const extra: RedisOptions = withUrl ? given.options ?? {} : {}
      const sentinelUrl = typeof connection === "string" && isSentinelUrl(connection)
        ? sentinelOptions(connection)
        : undefined
      const endpoint = sentinelUrl !== undefined && Either.isRight(sentinelUrl)
        ? sentinelEndpoint(sentinelUrl.right)
        : typeof connection === "string"
        ? `Redis ${JSON.stringify(redact(connection))}`
        : "cluster" in connection
        ? `Redis cluster ${connection.cluster.map((node) => nodeAddress(node)).join(", ")}`
        : viaSentinels(connection)
        ? sentinelEndpoint(connection)
        : typeof connection.path === "string"
        ? `Redis ${connection.path}`
        : `Redis ${hostPort(connection.host, connection.port)}`
      const invalid = (what: string, problem: string) =>
        Effect.fail(
          new BackendError({
            operation: "connect",
            cause: new Error(`${what}: ${problem}`),
            endpoint,
            detail: `${what} (${problem})`
          })
        )
      if (sentinelUrl !== undefined) {
        if (Either.isLeft(sentinelUrl)) return invalid("invalid Redis Sentinel URL", sentinelUrl.left)
      } else if (typeof connection === "string") {
        const problem = urlProblem(connection)
        if (problem !== undefined) return invalid("invalid Redis URL", problem)
      } else if ("cluster" in connection) {
        if (connection.cluster.length === 0) return invalid("invalid cluster", "no startup nodes")
      } else if (viaSentinels(connection)) {
        if (connection.sentinels!.length === 0) return invalid("invalid Sentinel options", "no sentinels")
        if (typeof connection.name !== "string" || connection.name === "") {
          return invalid("invalid Sentinel options", "no master name: set `name`")
        }
      }
      return Effect.try({
        try: () => {
          const client: Client = sentinelUrl !== undefined && Either.isRight(sentinelUrl)
            ? new Redis({ ...sentinelDefaults, ...sentinelUrl.right, ...extra })
            : typeof connection === "string"
            ? new Redis(connection, { maxRetriesPerRequest: 2, disconnectTimeout, disableClientInfo, ...extra })
            : "cluster" in connection
            ? new ClusterReportingRefusals([...connection.cluster], {
              ...connection.options,
              redisOptions: { disconnectTimeout, disableClientInfo, ...connection.options?.redisOptions }
            })
            : viaSentinels(connection)
            // a copy of the list: ioredis adds the sentinels it discovers to the one it is given
            ? new Redis({ ...sentinelDefaults, ...connection, sentinels: connection.sentinels!.map((s) => ({ ...s })) })
            : new Redis({ maxRetriesPerRequest: 2, disconnectTimeout, disableClientInfo, ...connection })
          // a connection of our own that nobody else sees: it never prints "Unhandled error event",
          // even after the backend's tracker stops listening
          client.on("error", () => undefined)
          return { client, close: keepOpen(client) }
        },
        catch: (cause) => new BackendError({ operation: "connect", cause, endpoint, detail: errorDetail(cause) })
      })
    }),
    ({ close }) => Effect.sync(close)
  ), ({ client }) => client)

/**
 * Keeps a connection of ours through sentinels open until the returned function closes it.
 * ioredis ends such a connection for good (status 'end', every later command refused) when
 * its failover detector hears `+switch-master` while a reconnection is still asking a sentinel
 * for the master: the detector closes the connector, and the attempt in flight then fails with
 * "Connection is closed." as if we had closed it. Each failover may do it to any of a backend's
 * connections (the commands, the subscriber and the acknowledged one). A connection of ours ends
 * only when we close it: until then, an 'end' is followed by a new connection (after 50 ms more
 * per attempt that did not get ready, at most 1 s), whose ready check and re-subscriptions are
 * ioredis's own. Other connections (direct, cluster) reconnect by themselves: closing them is
 * all the function does.
 */
export const keepOpen = (client: Client): (() => void) => {
  if (isCluster(client) || !viaSentinels(client.options ?? {})) return () => client.disconnect()
  let closed = false
  let attempts = 0
  let timer: ReturnType<typeof setTimeout> | undefined
  const reconnect = () => {
    timer = undefined
    if (!closed && client.status === "end") client.connect().catch(() => undefined)
  }
  const onEnd = () => {
if (!closed && timer === undefined) timer = setTimeout(reconnect, Math.min(++attempts * 50, 1_000))
  }
  const onReady = () => {
    attempts = 0
  }
  client.on("end", onEnd)
  client.on("ready", onReady)
  return () => {
    closed = true
    if (timer !== undefined) clearTimeout(timer)
    client.off("end", onEnd)
    client.off("ready", onReady)
    client.disconnect()
  }
}

/**
 * A connection of a backend's own beside `client`, to the same server or cluster (through the
 * same sentinels), connected on its first command, with `overrides`. Through sentinels it uses
 * our connector (`SentinelConnectorClosingAtOnce`), unless the client brings its own.
 */
export const duplicateOf = (client: Client, overrides: RedisOptions = {}): Client => {
  if (isCluster(client)) {
    return client.duplicate([], {
      lazyConnect: true,
      redisOptions: { ...client.options.redisOptions, disconnectTimeout, disableClientInfo, ...overrides }
    })
  }
  const options: RedisOptions = client.options ?? {}
  return client.duplicate({
    lazyConnect: true,
    disconnectTimeout,
    disableClientInfo,
    ...(viaSentinels(options) && options.Connector === undefined ? { Connector: SentinelConnectorClosingAtOnce } : {}),
    ...overrides
  })
}

/**
 * The connection that carries a backend's subscriptions: a duplicate of `client`, with its ready
 * check (after a restart it waits until the server has loaded its data, like any connection). It
 * connects on the first subscription: a program that never waits opens no connection for it, and
 * does not close one that is still in its handshake.
 */
export const subscriberFor = (client: Client): Client => duplicateOf(client)

/** Per connection in its handshake, the commands waiting for it to end (one pair of listeners for all). */
const afterHandshake = new WeakMap<Client, Array<() => void>>()

/**
 * Runs a (UN)SUBSCRIBE on `subscriber` once it is not handshaking. ioredis writes commands a
 * loading server accepts, SUBSCRIBE among them, while a connection is still handshaking; the INFO
 * of its ready check is then refused in subscriber mode, which ioredis takes for a fatal error: it
 * fails the SUBSCRIBE and reconnects. Ready, or between connections (the command is queued until
 * the next ready), the command goes out at once. The commands that wait go out in the order they
 * came, on the first 'ready' or 'close', all behind one pair of listeners: a burst of waiters
 * must not add a listener each (Node warns past 10).
 */
export const whenNotHandshaking = <A>(subscriber: Client, command: () => Promise<A>): Promise<A> => {
  if (subscriber.status !== "connect") return command()
  return new Promise<A>((resolve, reject) => {
    const run = () => {
      command().then(resolve, reject)
    }
    const waiting = afterHandshake.get(subscriber)
    if (waiting !== undefined) return void waiting.push(run)
    const queue = [run]
    afterHandshake.set(subscriber, queue)
    const go = () => {
      subscriber.off("ready", go)
      subscriber.off("close", go)
      afterHandshake.delete(subscriber)
      for (const next of queue) next()
    }
    subscriber.on("ready", go)
    subscriber.on("close", go)
  })
}

/**
 * `effect`, or `undefined` as soon as `client` reports a connection error: the checks a borrowed
 * client's backend makes at build go on without a server that is not there yet (they are made
 * again, or show in the calls, once it answers), rather than hold the build for the command
 * timeout.
 */
export const unlessConnectionFails = <A, E>(client: Client, effect: Effect.Effect<A, E>): Effect.Effect<A | undefined, E> =>
  Effect.raceFirst(
    effect,
    Effect.async<undefined>((resume) => {
      // a server that answers and refuses a command (ioredis's ready check: INFO) is there: the
      // checks go on and say so
      const onError = (error: unknown) => {
        if (refusedCommand(error) === undefined) resume(Effect.succeed(undefined))
      }
      client.on("error", onError)
      return Effect.sync(() => client.off("error", onError))
    })
  )

