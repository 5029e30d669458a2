/**
 * The connections of a Redis backend as seen from the outside: where they go (the endpoint, named
 * in every BackendError), what they last reported (the last connection error ioredis emitted, kept
 * per connection from its 'error' event until 'ready'), and outages (logged once each, not once
 * per failing call). Also the opening of the connections `layerFrom` owns, with its URL check.
 */
import type { Scope } from "effect"
import { Duration, Effect, Queue } from "effect"
import { Cluster, Redis } from "ioredis"
import type { RedisOptions } from "ioredis"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError, backendClosed } from "@lockstep/core/LockError"
import type { Client, Connection, Tuning } from "../RedisBackend.js"
import { makeDeadlines } from "./deadlines.js"

/** The command timeout of `tuning` (default 2 seconds). */
export const commandTimeout = (tuning?: Tuning): Duration.Duration => Duration.decode(tuning?.commandTimeout ?? "2 seconds")

/** Which connection of a backend: the one its commands go through, or the one its subscriptions use. */
export type Role = "commands" | "subscriber"

// ---------------------------------------------------------------------------------------------
// descriptions
// ---------------------------------------------------------------------------------------------

const firstLine = (text: string): string => {
  const end = text.indexOf("\n")
  return (end < 0 ? text : text.slice(0, end)).trim()
}

/** `user:password@` of a URL, as `user:***@` (or `***@`): a password never reaches a message or a log. */
const redact = (url: string): string =>
  url.replace(
    /^([a-z][a-z0-9+.-]*:\/\/)([^@/]*)@/i,
    (_, scheme: string, userinfo: string) => `${scheme}${userinfo.includes(":") ? `${userinfo.split(":")[0]}:***` : "***"}@`
  )

const hostPort = (host: unknown, port: unknown): string => {
  const name = typeof host === "string" && host !== "" ? host : "localhost"
  return `${name.includes(":") ? `[${name}]` : name}:${typeof port === "number" || typeof port === "string" ? port : 6379}`
}

/** A cluster startup node as ioredis takes it: a port, a URL or `host:port`, or `{ host, port }`. */
const describeNode = (node: unknown): string => {
  if (typeof node === "number") return hostPort(undefined, node)
  if (typeof node === "string") return /^\d+$/.test(node) ? hostPort(undefined, node) : redact(node).replace(/^rediss?:\/\//i, "")
  if (typeof node === "object" && node !== null) {
    const { host, port } = node as { readonly host?: unknown; readonly port?: unknown }
    return hostPort(host, port)
  }
  return String(node)
}

/** Whether `client` is a cluster (also a cluster of a mock library, which says so in `isCluster`). */
export const isCluster = (client: Client): client is Cluster =>
  client instanceof Cluster || ("isCluster" in client && client.isCluster === true)

/**
 * Where `client` connects: `Redis host:port`, `Redis <socket path>`, the sentinels of a named
 * master, or `Redis cluster <startup nodes>`. Never a password.
 */
export const describeEndpoint = (client: Client): string => {
  if (isCluster(client)) {
    // ioredis keeps the startup nodes in a field its types mark private
    const nodes = (client as unknown as { readonly startupNodes?: ReadonlyArray<unknown> }).startupNodes ?? []
    return `Redis cluster ${nodes.map(describeNode).join(", ")}`
  }
  const options: RedisOptions = (client as { readonly options?: RedisOptions }).options ?? {}
  if (typeof options.path === "string" && options.path !== "") return `Redis ${options.path}`
  if (options.sentinels !== undefined && options.sentinels !== null && options.sentinels.length > 0) {
    return `Redis master "${options.name ?? "mymaster"}" via sentinels ${options.sentinels.map(describeNode).join(", ")}`
  }
  return `Redis ${hostPort(options.host, options.port)}${options.tls === undefined ? "" : " (TLS)"}`
}

/**
 * One line about `error`: its message (first line), or what Node says inside an AggregateError
 * (a connection to a name with several addresses), with the last node error of a cluster failure.
 */
export const describeError = (error: unknown): string => {
  if (!(error instanceof Error)) return firstLine(String(error))
  // ioredis's MaxRetriesPerRequestError ends with a pointer to its docs: not news in a log line
  const own = firstLine(error.message).replace(/\s*Refer to "maxRetriesPerRequest" option for details\.$/, "")
  const inner = "errors" in error && Array.isArray(error.errors) ? error.errors.map(describeError) : []
  const code = "code" in error && typeof error.code === "string" ? error.code : undefined
  const text = own !== "" ? own : inner.length > 0 ? inner.join("; ") : code ?? error.name
  const node: unknown = "lastNodeError" in error ? error.lastNodeError : undefined
  return node === undefined || node === null ? text : `${text} (last node error: ${describeError(node)})`
}

/** An error reply of the server (WRONGTYPE, NOSCRIPT, a script's error, ...): it answered. */
const isReplyError = (error: unknown): boolean => error instanceof Error && error.name === "ReplyError"

/**
 * ioredis giving up on a command because the connection is down (it retried as often as
 * `maxRetriesPerRequest` allows, or will not reconnect): next to the connection's own error, it
 * says nothing more.
 */
const isGivingUp = (error: unknown): boolean =>
  error instanceof Error && (error.name === "MaxRetriesPerRequestError" || error.message === "Connection is closed.")

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

const URL_SHAPE = "expected redis://[[username]:password@]host[:port][/db], rediss://... or a socket path"

/** Why `url` is no Redis URL ioredis would read as meant, if it is not one. */
const urlProblem = (url: string): string | undefined => {
  if (url.startsWith("/") && !url.startsWith("//")) return undefined
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

/**
 * Opens the connection `layerFrom` owns (closed with the scope), or fails with BackendError
 * (operation "connect") on a URL or node list it cannot mean.
 */
export const open = (connection: Connection): Effect.Effect<Client, BackendError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.suspend(() => {
      const endpoint = typeof connection === "string"
        ? `Redis ${JSON.stringify(redact(connection))}`
        : "cluster" in connection
        ? `Redis cluster ${connection.cluster.map(describeNode).join(", ")}`
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
      if (typeof connection === "string") {
        const problem = urlProblem(connection)
        if (problem !== undefined) return invalid("invalid Redis URL", problem)
      } else if ("cluster" in connection && connection.cluster.length === 0) {
        return invalid("invalid cluster", "no startup nodes")
      }
      return Effect.try({
        try: (): Client => {
          const client: Client = typeof connection === "string"
            ? new Redis(connection, { maxRetriesPerRequest: 2, disconnectTimeout })
            : "cluster" in connection
            ? new Cluster([...connection.cluster], {
              ...connection.options,
              redisOptions: { disconnectTimeout, ...connection.options?.redisOptions }
            })
            : new Redis({ maxRetriesPerRequest: 2, disconnectTimeout, ...connection })
          // a connection of our own that nobody else sees: it never prints "Unhandled error event",
          // even after the backend's tracking listener is gone
          client.on("error", () => undefined)
          return client
        },
        catch: (cause) => new BackendError({ operation: "connect", cause, endpoint, detail: describeError(cause) })
      })
    }),
    (client) => Effect.sync(() => client.disconnect())
  )

/**
 * The connection that carries a backend's subscriptions: a duplicate of `client`, with its ready
 * check (after a restart it waits until the server has loaded its data, like any connection). It
 * connects on the first subscription: a program that never waits opens no connection for it, and
 * does not close one that is still in its handshake.
 */
export const subscriberFor = (client: Client): Client =>
  isCluster(client)
    ? client.duplicate([], {
      lazyConnect: true,
      redisOptions: { ...client.options.redisOptions, disconnectTimeout }
    })
    : client.duplicate({ lazyConnect: true, disconnectTimeout })

/**
 * Runs a (UN)SUBSCRIBE on `subscriber` once it is not handshaking. ioredis writes commands a
 * loading server accepts, SUBSCRIBE among them, while a connection is still handshaking; the INFO
 * of its ready check is then refused in subscriber mode, which ioredis takes for a fatal error: it
 * fails the SUBSCRIBE and reconnects. Ready, or between connections (the command is queued until
 * the next ready), the command goes out at once.
 */
export const whenNotHandshaking = <A>(subscriber: Client, command: () => Promise<A>): Promise<A> =>
  subscriber.status !== "connect"
    ? command()
    : new Promise<A>((resolve, reject) => {
      const go = () => {
        subscriber.off("ready", go)
        subscriber.off("close", go)
        command().then(resolve, reject)
      }
      subscriber.on("ready", go)
      subscriber.on("close", go)
    })

// ---------------------------------------------------------------------------------------------
// tracking
// ---------------------------------------------------------------------------------------------

type Event =
  | { readonly _tag: "Lost"; readonly detail: string }
  | { readonly _tag: "Reconnected" }

/** The connections of one backend, as `track` sees them. */
export interface Tracker {
  /** Where the backend connects, as named in its errors and logs. */
  readonly endpoint: string
  /**
   * Follows `client`'s 'error' and 'ready' events until the scope closes, which removes the
   * listeners again. The 'error' listener also keeps ioredis from printing "Unhandled error event".
   */
  readonly watch: (client: Client, role: Role) => Effect.Effect<void, never, Scope.Scope>
  /**
   * Settles with the promise, or fails with BackendError once the command timeout passes. The
   * deadline settles the effect itself rather than interrupting it: callers run grants and the
   * registration of their release uninterruptibly (so an interruption never leaks a grant), and
   * a silent server must still not stall them. One timer keeps the deadlines of all calls in
   * flight (see deadlines.ts). Once a call has waited the whole timeout on a connection that is
   * down (it reported a connection error and has not been ready since), later calls on it (on a
   * cluster: to the same `slot`) fail at once until it answers again: the timeout bounds how long
   * an outage stalls a caller, not each call it makes.
   */
  readonly call: <A>(
    operation: string,
    promise: () => Promise<A>,
    role?: Role,
    slot?: number | undefined
  ) => Effect.Effect<A, BackendError>
  /** A BackendError naming the endpoint and, while `role`'s connection is down, its last error. */
  readonly fail: (operation: string, cause: unknown, role?: Role) => BackendError
  /**
   * The backend's scope is closing: from now on every call fails with the closed-backend error,
   * and so does a call still in flight that fails (its connection closed under it). Whether the
   * client is open (a borrowed one may well be) does not matter.
   */
  readonly close: () => void
  /** Whether `close` was called. */
  readonly isClosed: () => boolean
  /** The error every operation of a closed backend fails with. */
  readonly closedError: (operation: string) => BackendError
  /** `error` naming the endpoint (unchanged if it already does). */
  readonly locate: (error: BackendError) => BackendError
  /** `service` whose every BackendError names the endpoint. */
  readonly locateAll: (service: Service) => Service
  /** One PING within the command timeout (or until ioredis gives up): BackendError "connect" if it fails. */
  readonly ping: Effect.Effect<void, BackendError>
  /**
   * Logs each outage once: a warning on the first connection error after being connected (or
   * built), with the endpoint and the error, and "reconnected" once every connection that failed
   * is ready again. Runs until interrupted; fork it in the backend's scope.
   */
  readonly report: Effect.Effect<never>
}

/**
 * Tracks `client` (as the commands connection) in the scope; further connections of the same
 * backend (the subscriber) join with `watch`.
 */
export const track = (client: Client, tuning?: Tuning): Effect.Effect<Tracker, never, Scope.Scope> =>
  Effect.gen(function*() {
    const endpoint = describeEndpoint(client)
    const timeout = commandTimeout(tuning)
    const events = yield* Queue.unbounded<Event>()
    yield* Effect.addFinalizer(() => Queue.shutdown(events))

    /** The last connection error of each connection since it was last ready. */
    const lastError = new Map<Role, { readonly error: unknown; readonly text: string }>()
    /**
     * Per connection (and cluster slot: one node down leaves the others alone), since when it has
     * left a call unanswered for the whole command timeout (performance.now()): set when a call
     * reaches its deadline, cleared by the next answer, or when the connection is ready again.
     */
    const silentSince = new Map<string, number>()
    let outage = false

    const onError = (role: Role, error: unknown) => {
      const text = describeError(error)
      lastError.set(role, { error, text })
      if (!outage) {
        outage = true
        Queue.unsafeOffer(events, { _tag: "Lost", detail: text })
      }
    }
    const onReady = (role: Role) => {
      lastError.delete(role)
      for (const route of silentSince.keys()) if (route.startsWith(role)) silentSince.delete(route)
      if (outage && lastError.size === 0) {
        outage = false
        Queue.unsafeOffer(events, { _tag: "Reconnected" })
      }
    }

    const watch = (watched: Client, role: Role) =>
      Effect.asVoid(Effect.acquireRelease(
        Effect.sync(() => {
          // a cluster reports a failed node as 'node error' (it goes on with the others); its own
          // 'error' is the cluster failing as a whole (no startup node answered)
          const error = (e: unknown) => onError(role, e)
          const ready = () => onReady(role)
          watched.on("error", error)
          watched.on("ready", ready)
          return () => {
            watched.off("error", error)
            watched.off("ready", ready)
          }
        }),
        (remove) => Effect.sync(remove)
      ))

    const detailOf = (cause: unknown, role: Role): string => {
      const own = describeError(cause)
      const connection = lastError.get(role)?.text
      if (connection === undefined) return own
      return connection === own || isGivingUp(cause) ? connection : `${connection} (${own})`
    }

    const fail = (operation: string, cause: unknown, role: Role = "commands") =>
      new BackendError({ operation, cause, endpoint, detail: detailOf(cause, role) })

    let closed = false
    const closedError = (operation: string) => backendClosed({ operation, backend: "Redis backend", endpoint })
    /** `fail`, unless the backend closed meanwhile: then that is what the call ran into. */
    const failOpen = (operation: string, cause: unknown, role: Role) =>
      closed ? closedError(operation) : fail(operation, cause, role)

    const locate = (error: BackendError) =>
      error.endpoint !== undefined
        ? error
        : new BackendError({ operation: error.operation, cause: error.cause, endpoint, detail: error.detail ?? detailOf(error.cause, "commands") })

    const locateAny = <E>(error: E): E | BackendError => error instanceof BackendError ? locate(error) : error

    const deadlines = makeDeadlines(Duration.toMillis(timeout))
    /** A reply, or an error reply: the server answers again. */
    const heard = (route: string, cause?: unknown) => {
      if (cause === undefined || isReplyError(cause)) silentSince.delete(route)
    }
    const call = <A>(operation: string, promise: () => Promise<A>, role: Role = "commands", slot?: number) =>
      Effect.async<A, BackendError>((resume) => {
        if (closed) return resume(Effect.fail(closedError(operation)))
        const route = slot === undefined ? role : `${role}:${slot}`
        const since = silentSince.get(route)
        if (since !== undefined && lastError.has(role)) {
          // a connection that is down and left a call unanswered for the whole timeout: the call
          // still goes out when it is back (after those, in order: the release of an attempt
          // follows the attempt), but its caller does not wait a second timeout for it (an
          // acquisition cleaning up after its attempt timed out would take twice the timeout). A
          // connection that is up but silent (a paused server) may answer any moment: its calls
          // wait as usual
          promise().then(() => heard(route), (cause: unknown) => heard(route, cause))
          const silentFor = Duration.format(Duration.millis(Math.round(performance.now() - since)))
          return resume(Effect.fail(failOpen(
            operation,
            new Error(`no answer from Redis for ${silentFor}`, { cause: lastError.get(role)?.error }),
            role
          )))
        }
        const pending = deadlines.start(() => {
          if (!silentSince.has(route)) silentSince.set(route, pending.startedAt)
          resume(Effect.fail(failOpen(
            operation,
            new Error(`no answer from Redis within ${Duration.format(timeout)}`, { cause: lastError.get(role)?.error }),
            role
          )))
        })
        promise().then(
          (value) => {
            deadlines.end(pending)
            heard(route)
            resume(Effect.succeed(value))
          },
          (cause: unknown) => {
            deadlines.end(pending)
            heard(route, cause)
            resume(Effect.fail(failOpen(operation, cause, role)))
          }
        )
        // no canceler: an interrupted call's entry simply expires (its late resume is ignored),
        // whereas a canceler wraps every call in an interruption handler, which costs more
        // than the rest of the call
      })

    const report: Effect.Effect<never> = Effect.forever(
      Effect.flatMap(Queue.take(events), (event) =>
        event._tag === "Lost"
          ? Effect.logWarning(
            `lockstep: connection to ${endpoint} failed: ${event.detail}; calls fail with BackendError until it is back`
          )
          : Effect.logInfo(`lockstep: reconnected to ${endpoint}`)).pipe(Effect.annotateLogs("endpoint", endpoint))
    )

    yield* watch(client, "commands")

    return {
      endpoint,
      watch,
      call,
      fail,
      close: () => {
        closed = true
      },
      isClosed: () => closed,
      closedError,
      locate,
      locateAll: (service) => ({
        ...service,
        acquire: (request) => Effect.mapError(service.acquire(request), locateAny),
        release: (request) => Effect.mapError(service.release(request), locateAny),
        renew: (requests) => Effect.mapError(service.renew(requests), locate),
        inspect: (key) => Effect.mapError(service.inspect(key), locate),
        forceRelease: (request) => Effect.mapError(service.forceRelease(request), locate),
        cancel: (request) => Effect.mapError(service.cancel(request), locate),
        subscribe: (key, holder, mode) => Effect.mapError(service.subscribe(key, holder, mode), locate)
      }),
      ping: Effect.asVoid(call("connect", () => client.ping())),
      report
    } satisfies Tracker
  })
