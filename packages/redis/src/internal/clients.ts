/**
 * The ioredis clients of a Redis backend (`Client`: each one connection to a server, or a
 * cluster's): the opening of the one `layerFrom` owns from a `Connection`, with its URL check; the
 * backend's own duplicates (the subscriber, the acknowledged connection); and the `ClientTracker`,
 * which follows them as seen from the outside: where they go (the endpoint, named in every
 * BackendError), what they last reported (the last connection error ioredis emitted, kept per
 * client from its 'error' event until 'ready'), and outages (logged once each, not once per
 * failing call).
 */
import type { Scope } from "effect"
import { Duration, Effect, Either, Queue } from "effect"
import { Cluster, Redis, SentinelConnector } from "ioredis"
import type { RedisOptions } from "ioredis"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError, backendClosed } from "@lockstep/core/LockError"
import type { Client, Connection, Tuning } from "../RedisBackend.js"
import { makeDeadlines } from "./deadlines.js"

/** The command timeout of `tuning` (default 2 seconds). */
export const commandTimeout = (tuning?: Tuning): Duration.Duration => Duration.decode(tuning?.commandTimeout ?? "2 seconds")

/** Which connection of a backend: the one its commands go through, or the one its subscriptions use. */
export type Role = "commands" | "subscriber" | "acknowledged"

// ---------------------------------------------------------------------------------------------
// descriptions
// ---------------------------------------------------------------------------------------------

const firstLine = (text: string): string => {
  const end = text.indexOf("\n")
  return (end < 0 ? text : text.slice(0, end)).trim()
}

/**
 * `user:password@` of a URL, as `user:***@` (or `***@`), and the value of a `sentinelPassword`
 * parameter as `***`: a password never reaches a message or a log.
 */
const redact = (url: string): string => {
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(url)?.[0]
  // a password may hold '/', '@' or '?': the userinfo ends at the last '@'
  const at = url.lastIndexOf("@")
  let out = url
  if (scheme !== undefined && at > scheme.length) {
    const userinfo = url.slice(scheme.length, at)
    const colon = userinfo.indexOf(":")
    out = `${scheme}${colon < 0 ? "***" : `${userinfo.slice(0, colon)}:***`}${url.slice(at)}`
  }
  // every password-like parameter, whatever follows it
  return out.replace(/([?&](?:sentinel)?password=).*$/i, "$1***")
}

const hostPort = (host: unknown, port: unknown, defaultPort = 6379): string => {
  const name = typeof host === "string" && host !== "" ? host : "localhost"
  return `${name.includes(":") ? `[${name}]` : name}:${
    typeof port === "number" || (typeof port === "string" && port !== "") ? port : defaultPort
  }`
}

/** Where a sentinel listens unless told otherwise (ioredis's default too). */
const SENTINEL_PORT = 26379

/**
 * A cluster startup node as ioredis takes it (a port, a URL or `host:port`, or `{ host, port }`),
 * or a sentinel (`{ host, port }`, port 26379 unless given).
 */
const describeNode = (node: unknown, defaultPort = 6379): string => {
  if (typeof node === "number") return hostPort(undefined, node)
  if (typeof node === "string") return /^\d+$/.test(node) ? hostPort(undefined, node) : redact(node).replace(/^rediss?:\/\//i, "")
  if (typeof node === "object" && node !== null) {
    const { host, port } = node as { readonly host?: unknown; readonly port?: unknown }
    return hostPort(host, port, defaultPort)
  }
  return String(node)
}

/** Whether `options` reach a master through sentinels, as ioredis decides: any list, even an empty one (which it rejects). */
const viaSentinels = (options: RedisOptions): boolean =>
  options.sentinels !== undefined && options.sentinels !== null

/** `Redis master "<name>" via sentinels <host:port>, ...`, as the errors of such a connection name it. */
const describeSentinels = (options: RedisOptions): string => {
  const name = typeof options.name === "string" && options.name !== "" ? JSON.stringify(options.name) : "(no name)"
  const sentinels = options.sentinels ?? []
  const tls = options.enableTLSForSentinelMode === true && options.tls !== undefined ? " (TLS)" : ""
  return `Redis master ${name} via ${
    sentinels.length === 0
      ? "no sentinels"
      : `sentinels ${sentinels.map((node) => describeNode(node, SENTINEL_PORT)).join(", ")}`
  }${tls}`
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
    return `Redis cluster ${nodes.map((node) => describeNode(node)).join(", ")}`
  }
  const options: RedisOptions = (client as { readonly options?: RedisOptions }).options ?? {}
  // ioredis prefers the sentinels to a path when it is given both
  if (viaSentinels(options)) return describeSentinels(options)
  if (typeof options.path === "string" && options.path !== "") return `Redis ${options.path}`
  return `Redis ${hostPort(options.host, options.port)}${options.tls === undefined ? "" : " (TLS)"}`
}

/**
 * What ioredis reports after asking every sentinel in turn (and again after it connected to each
 * master they named, one per attempt, and each refused): "All sentinels are unreachable. Retrying
 * from scratch after 10ms. Last error: ..." (the last error only if a sentinel itself failed).
 */
const SENTINEL_ROUND = /^All sentinels are unreachable(?: and retry is disabled)?\.(?: Retrying from scratch after \d+ms\.)?(?: Last error: (.*))?$/

/**
 * A sentinel round that failed, by the last error of a sentinel: ioredis asks them on connections
 * that never reconnect, whose error is "Connection is closed." whatever kept them from answering.
 */
const describeSentinelRound = (last: string | undefined): string =>
  last === undefined
    ? "All sentinels are unreachable"
    : last === "Connection is closed."
    ? "no sentinel answered"
    : /No such master with that name/i.test(last)
    ? `the sentinels know no master of that name (${last})`
    : /^(NOAUTH|WRONGPASS)\b/.test(last)
    ? `the sentinels refused the credentials (${last})`
    : `All sentinels are unreachable (last error: ${last})`

/**
 * The codes of a TLS handshake that failed on the server's certificate (Node's and OpenSSL's):
 * no retry can fix those, so a connection that reports one while the layer checks it fails the
 * layer at once.
 */
const CERTIFICATE_ERRORS: ReadonlySet<string> = new Set([
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY",
  "CERT_SIGNATURE_FAILURE",
  "CERT_NOT_YET_VALID",
  "CERT_HAS_EXPIRED",
  "CERT_REVOKED",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "INVALID_CA",
  "INVALID_PURPOSE",
  "PATH_LENGTH_EXCEEDED",
  "HOSTNAME_MISMATCH"
])

/** Whether `error` (or, for a cluster, the last error of a node) is a certificate the client refused. */
export const isCertificateError = (error: unknown): boolean => {
  if (!(error instanceof Error)) return false
  if ("code" in error && typeof error.code === "string" && CERTIFICATE_ERRORS.has(error.code)) return true
  return "lastNodeError" in error && isCertificateError(error.lastNodeError)
}

/**
 * Node's message for a certificate issued for other names ends with the names that match the host
 * ("... is not in the cert's list: "), empty when none is of its kind (no IP address for an IP):
 * the names the certificate is for say what went wrong.
 */
const withCertificateNames = (own: string, error: Error, code: string | undefined): string => {
  if (code !== "ERR_TLS_CERT_ALTNAME_INVALID") return own
  const cert: unknown = "cert" in error ? error.cert : undefined
  const names = typeof cert === "object" && cert !== null && "subjectaltname" in cert &&
      typeof cert.subjectaltname === "string"
    ? cert.subjectaltname
    : undefined
  return names === undefined || names === "" ? own : `${own.replace(/:$/, "")} (the certificate is for ${names})`
}

/**
 * Hides the certificate Node attaches to a refused one (`cert`: the whole chain, which refers to
 * itself) from `JSON.stringify` and Effect's rendering of a Cause, which would throw on it: it
 * stays on the error, not enumerable. Message, code, reason and host are as they were.
 */
const hideCertificate = (error: unknown): void => {
  if (error instanceof Error && "cert" in error && isCertificateError(error)) {
    Object.defineProperty(error, "cert", { enumerable: false })
  }
}

/**
 * The arguments of a command that carry a password, with the password as `***`: AUTH's last
 * (`AUTH password`, `AUTH username password`), and HELLO's after `AUTH username`.
 */
const redactArguments = (name: string, args: ReadonlyArray<unknown>): ReadonlyArray<unknown> | undefined => {
  switch (name.toLowerCase()) {
    case "auth":
      return args.length === 0 ? undefined : [...args.slice(0, -1), "***"]
    case "hello": {
      const at = args.findIndex((arg) => typeof arg === "string" && arg.toLowerCase() === "auth")
      return at < 0 || at + 2 >= args.length ? undefined : args.map((arg, i) => (i === at + 2 ? "***" : arg))
    }
    default:
      return undefined
  }
}

/**
 * Takes the password out of `error` and every error it refers to (`cause`, `errors`,
 * `lastNodeError`): ioredis attaches to an error reply the command it answered (`command`: name
 * and arguments), and the reply to an AUTH (or HELLO ... AUTH) that the server refused carries
 * the password, which `JSON.stringify`, `util.inspect` or Effect's rendering of the error would
 * then show. The command stays, with `***` for the password.
 */
export const hideCredentials = (error: unknown, seen: Set<unknown> = new Set()): void => {
  if (typeof error !== "object" || error === null || seen.has(error)) return
  seen.add(error)
  if (error instanceof Error && "command" in error) {
    const command: unknown = error.command
    if (typeof command === "object" && command !== null && "name" in command && "args" in command) {
      const { args, name } = command
      const redacted = typeof name === "string" && Array.isArray(args) ? redactArguments(name, args) : undefined
      if (redacted !== undefined) error.command = { ...command, args: redacted }
    }
  }
  for (const key of ["cause", "lastNodeError"] as const) if (key in error) hideCredentials(error[key as keyof typeof error], seen)
  if ("errors" in error && Array.isArray(error.errors)) for (const inner of error.errors) hideCredentials(inner, seen)
}

/**
 * One line about `error`: its message (first line), or what Node says inside an AggregateError
 * (a connection to a name with several addresses), with the last node error of a cluster failure.
 */
export const describeError = (error: unknown): string => {
  if (!(error instanceof Error)) return firstLine(String(error))
  // ioredis's MaxRetriesPerRequestError ends with a pointer to its docs, and its sentinel round
  // says when it starts the next one: neither is news in a log line
  const own = firstLine(error.message)
    .replace(/\s*Refer to "maxRetriesPerRequest" option for details\.$/, "")
    .replace(SENTINEL_ROUND, (_, last: string | undefined) => describeSentinelRound(last))
  const inner = "errors" in error && Array.isArray(error.errors) ? error.errors.map(describeError) : []
  const code = "code" in error && typeof error.code === "string" ? error.code : undefined
  const text = own !== "" ? withCertificateNames(own, error, code) : inner.length > 0 ? inner.join("; ") : code ?? error.name
  const node: unknown = "lastNodeError" in error ? error.lastNodeError : undefined
  return node === undefined || node === null ? text : `${text} (last node error: ${describeError(node)})`
}

/**
 * A sentinel round in which no sentinel failed: every sentinel answered, yet the connection is
 * not up. Either each named a master that then refused the connection (whose own error says
 * more), or none of them knows the master's name (a 'sentinelError' says so).
 */
const isQuietSentinelRound = (error: unknown): boolean => {
  const round = error instanceof Error ? SENTINEL_ROUND.exec(firstLine(error.message)) : null
  return round !== null && round[1] === undefined
}

/**
 * A sentinel's answer that named no master, in words ("sentinel 10.0.0.5:26379 knows no master
 * named "orders""), or undefined for the other 'sentinelError's (a sentinel that failed, which
 * the round's own error reports).
 */
const describeSentinelAnswer = (error: unknown, name: unknown): string | undefined => {
  const sentinel = error instanceof Error
    ? /^connected to sentinel (\S+) successfully, but got an invalid reply: null$/.exec(firstLine(error.message))?.[1]
    : undefined
  return sentinel === undefined ? undefined : `sentinel ${sentinel} knows no master named ${JSON.stringify(name ?? "")}`
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
const refusedSentinelCertificate = (client: Client, error: unknown): boolean => {
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
        ? describeSentinels(sentinelUrl.right)
        : typeof connection === "string"
        ? `Redis ${JSON.stringify(redact(connection))}`
        : "cluster" in connection
        ? `Redis cluster ${connection.cluster.map((node) => describeNode(node)).join(", ")}`
        : viaSentinels(connection)
        ? describeSentinels(connection)
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
            ? new Redis(connection, { maxRetriesPerRequest: 2, disconnectTimeout, ...extra })
            : "cluster" in connection
            ? new ClusterReportingRefusals([...connection.cluster], {
              ...connection.options,
              redisOptions: { disconnectTimeout, ...connection.options?.redisOptions }
            })
            : viaSentinels(connection)
            // a copy of the list: ioredis adds the sentinels it discovers to the one it is given
            ? new Redis({ ...sentinelDefaults, ...connection, sentinels: connection.sentinels!.map((s) => ({ ...s })) })
            : new Redis({ maxRetriesPerRequest: 2, disconnectTimeout, ...connection })
          // a connection of our own that nobody else sees: it never prints "Unhandled error event",
          // even after the backend's tracker stops listening
          client.on("error", () => undefined)
          return { client, close: keepOpen(client) }
        },
        catch: (cause) => new BackendError({ operation: "connect", cause, endpoint, detail: describeError(cause) })
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
      redisOptions: { ...client.options.redisOptions, disconnectTimeout, ...overrides }
    })
  }
  const options: RedisOptions = client.options ?? {}
  return client.duplicate({
    lazyConnect: true,
    disconnectTimeout,
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

// ---------------------------------------------------------------------------------------------
// the client tracker
// ---------------------------------------------------------------------------------------------

type Event =
  | { readonly _tag: "Lost"; readonly detail: string }
  | { readonly _tag: "Reconnected" }

/** The clients of one backend, as `track` follows them. */
export interface ClientTracker {
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
   * an outage stalls a caller, not each call it makes. When the promise fails, `fallback` may
   * answer its failure with another promise (EVAL after NOSCRIPT), which the call then settles
   * with, within the same deadline.
   */
  readonly call: <A>(
    operation: string,
    promise: () => Promise<A>,
    role?: Role,
    slot?: number | undefined,
    fallback?: ((cause: unknown) => Promise<A> | undefined) | undefined
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
  /**
   * `service` whose every BackendError names the endpoint. Its acquire and release are taken as
   * they are: every BackendError they fail with must come from `call` or `fail`.
   */
  readonly locateAll: (service: Service) => Service
  /**
   * One PING within the command timeout (or until ioredis gives up): BackendError "connect" if it
   * fails, at once if the connection refuses the server's certificate.
   */
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
export const track = (client: Client, tuning?: Tuning): Effect.Effect<ClientTracker, never, Scope.Scope> =>
  Effect.gen(function*() {
    const endpoint = describeEndpoint(client)
    const timeout = commandTimeout(tuning)
    const events = yield* Queue.unbounded<Event>()
    yield* Effect.addFinalizer(() => Queue.shutdown(events))

    /**
     * The last connection error of each connection since it was last ready, and whether it was a
     * refused certificate (the server's, or a sentinel's).
     */
    const lastError = new Map<Role, { readonly error: unknown; readonly text: string; readonly certificate: boolean }>()
    /**
     * Per connection (and cluster slot: one node down leaves the others alone), since when it has
     * left a call unanswered for the whole command timeout (performance.now()): set when a call
     * reaches its deadline, cleared by the next answer, or when the connection is ready again.
     */
    const silentSince = new Map<string, number>()
    let outage = false

    /** Per connection through sentinels: what the sentinels last said about its master, since it was last ready. */
    const sentinelAnswer = new Map<Role, string>()

    /** Who waits for the commands connection to refuse the server's certificate (the layer's first PING). */
    const refusedCertificate = new Set<(error: unknown) => void>()

    const onError = (role: Role, error: unknown, sentinelCertificate = false) => {
      hideCertificate(error)
      hideCredentials(error)
      const certificate = sentinelCertificate || isCertificateError(error)
      let text = describeError(error)
      if (isQuietSentinelRound(error)) {
        // the sentinels answered: what they said, or else the master's own error, says more
        const answer = sentinelAnswer.get(role)
        if (answer !== undefined) text = answer
        else if (lastError.has(role)) return
      }
      lastError.set(role, { error, text, certificate })
      if (role === "commands" && refusedCertificate.size > 0 && certificate) {
        for (const waiting of refusedCertificate) waiting(error)
      }
      if (!outage) {
        outage = true
        Queue.unsafeOffer(events, { _tag: "Lost", detail: text })
      }
    }
    const onReady = (role: Role) => {
      lastError.delete(role)
      sentinelAnswer.delete(role)
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
          let refusedByNode: Error | undefined
          const error = (e: unknown) => {
            // a node whose certificate was refused closes, and the cluster's own error names
            // that closing ("Connection is closed.") as its last node error: the refusal says why
            if (refusedByNode !== undefined && e instanceof Error && "lastNodeError" in e && isGivingUp(e.lastNodeError)) {
              e.lastNodeError = refusedByNode
            }
            onError(role, e, refusedSentinelCertificate(watched, e))
          }
          const nodeError = (e: unknown) => {
            if (isCertificateError(e)) {
              hideCertificate(e)
              refusedByNode = e as Error
            }
          }
          const ready = () => {
            refusedByNode = undefined
            onReady(role)
          }
          const name = (watched as { readonly options?: RedisOptions }).options?.name
          const sentinelError = (e: unknown) => {
            const answer = describeSentinelAnswer(e, name)
            if (answer !== undefined) sentinelAnswer.set(role, answer)
          }
          watched.on("error", error)
          watched.on("node error", nodeError)
          watched.on("ready", ready)
          watched.on("sentinelError", sentinelError)
          return () => {
            watched.off("error", error)
            watched.off("node error", nodeError)
            watched.off("ready", ready)
            watched.off("sentinelError", sentinelError)
          }
        }),
        (remove) => Effect.sync(remove)
      ))

    const detailOf = (cause: unknown, role: Role): string => {
      const own = describeError(cause)
      const reported = lastError.get(role)?.text
      if (reported === undefined) return own
      return reported === own || isGivingUp(cause) ? reported : `${reported} (${own})`
    }

    const fail = (operation: string, cause: unknown, role: Role = "commands") => {
      hideCredentials(cause)
      return new BackendError({ operation, cause, endpoint, detail: detailOf(cause, role) })
    }

    let closed = false
    const closedError = (operation: string) => backendClosed({ operation, backend: "Redis backend", endpoint })
    /** `fail`, unless the backend closed meanwhile: then that is what the call ran into. */
    const failOpen = (operation: string, cause: unknown, role: Role) =>
      closed ? closedError(operation) : fail(operation, cause, role)

    const locate = (error: BackendError) =>
      error.endpoint !== undefined
        ? error
        : new BackendError({ operation: error.operation, cause: error.cause, endpoint, detail: error.detail ?? detailOf(error.cause, "commands") })

    const deadlines = makeDeadlines(Duration.toMillis(timeout))
    /** A reply, or an error reply: the server answers again. */
    const heard = (route: string, cause?: unknown) => {
      if (cause === undefined || isReplyError(cause)) silentSince.delete(route)
    }
    const call = <A>(
      operation: string,
      promise: () => Promise<A>,
      role: Role = "commands",
      slot?: number,
      fallback?: (cause: unknown) => Promise<A> | undefined
    ) =>
      Effect.async<A, BackendError>((resume) => {
        if (closed) return resume(Effect.fail(closedError(operation)))
        const route = slot === undefined ? role : `${role}:${slot}`
        const since = silentSince.size === 0 ? undefined : silentSince.get(route)
        if (since !== undefined && lastError.has(role)) {
          // a connection that is down and left a call unanswered for the whole timeout: the call
          // still goes out when it is back (after those, in order: the release of an attempt
          // follows the attempt), but its caller does not wait a second timeout for it (an
          // acquisition cleaning up after its attempt timed out would take twice the timeout). A
          // connection that is up but silent (a paused server) may answer any moment: its calls
          // wait as usual
          const onFailure = (cause: unknown) => {
            const next = fallback?.(cause)
            if (next === undefined) return heard(route, cause)
            next.then(() => heard(route), (cause: unknown) => heard(route, cause))
          }
          promise().then(() => heard(route), onFailure)
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
        const onSuccess = (value: A) => {
          deadlines.end(pending)
          if (silentSince.size > 0) heard(route)
          resume(Effect.succeed(value))
        }
        const onFailure = (cause: unknown) => {
          deadlines.end(pending)
          heard(route, cause)
          resume(Effect.fail(failOpen(operation, cause, role)))
        }
        promise().then(
          onSuccess,
          fallback === undefined ? onFailure : (cause: unknown) => {
            const next = fallback(cause)
            if (next === undefined) onFailure(cause)
            else next.then(onSuccess, onFailure)
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

    /**
     * Fails as soon as the commands connection refuses the server's certificate, or a sentinel's
     * (or has done so since it was last ready): ioredis retries such a connection like any other (with
     * `maxRetriesPerRequest: null`, until the command timeout), though no retry can succeed.
     */
    const certificateRefused: Effect.Effect<never, BackendError> = Effect.async<never, BackendError>((resume) => {
      const last = lastError.get("commands")
      if (last !== undefined && last.certificate) return resume(Effect.fail(fail("connect", last.error)))
      const waiting = (error: unknown) => resume(Effect.fail(fail("connect", error)))
      refusedCertificate.add(waiting)
      return Effect.sync(() => {
        refusedCertificate.delete(waiting)
      })
    })

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
        // acquire and release fail only with errors made by `call` and `fail`, which name the
        // endpoint already: they go as they are, without an error handler around every call
        renew: (requests) => Effect.mapError(service.renew(requests), locate),
        inspect: (key) => Effect.mapError(service.inspect(key), locate),
        forceRelease: (request) => Effect.mapError(service.forceRelease(request), locate),
        cancel: (request) => Effect.mapError(service.cancel(request), locate),
        subscribe: (key, holder, mode) => Effect.mapError(service.subscribe(key, holder, mode), locate)
      }),
      ping: Effect.raceFirst(Effect.asVoid(call("connect", () => client.ping())), certificateRefused),
      report
    } satisfies ClientTracker
  })
