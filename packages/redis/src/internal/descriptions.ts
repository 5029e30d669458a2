/**
 * How a Redis backend names what it talks to and what went wrong, in one line and without a
 * secret: endpoints (a URL without its password, a cluster's nodes, the sentinels), ioredis's
 * errors (sentinel rounds, refused certificates, AggregateErrors), and the credentials ioredis
 * attaches to a refused AUTH, taken out.
 */
import { Cluster } from "ioredis"
import type { RedisOptions } from "ioredis"
import type { Client } from "../RedisBackend.js"

// ---------------------------------------------------------------------------------------------
// descriptions
// ---------------------------------------------------------------------------------------------

export const firstLine = (text: string): string => {
  const end = text.indexOf("\n")
  return (end < 0 ? text : text.slice(0, end)).trim()
}

/**
 * `user:password@` of a URL, as `user:***@` (or `***@`), and the value of a `sentinelPassword`
 * parameter as `***`: a password never reaches a message or a log.
 */
export const redact = (url: string): string => {
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

export const hostPort = (host: unknown, port: unknown, defaultPort = 6379): string => {
  const name = typeof host === "string" && host !== "" ? host : "localhost"
  return `${name.includes(":") ? `[${name}]` : name}:${
    typeof port === "number" || (typeof port === "string" && port !== "") ? port : defaultPort
  }`
}

/** Where a sentinel listens unless told otherwise (ioredis's default too). */
export const SENTINEL_PORT = 26379

/**
 * A cluster startup node as ioredis takes it (a port, a URL or `host:port`, or `{ host, port }`),
 * or a sentinel (`{ host, port }`, port 26379 unless given).
 */
export const nodeAddress = (node: unknown, defaultPort = 6379): string => {
  if (typeof node === "number") return hostPort(undefined, node)
  if (typeof node === "string") return /^\d+$/.test(node) ? hostPort(undefined, node) : redact(node).replace(/^rediss?:\/\//i, "")
  if (typeof node === "object" && node !== null) {
    const { host, port } = node as { readonly host?: unknown; readonly port?: unknown }
    return hostPort(host, port, defaultPort)
  }
  return String(node)
}

/** Whether `options` reach a master through sentinels, as ioredis decides: any list, even an empty one (which it rejects). */
export const viaSentinels = (options: RedisOptions): boolean =>
  options.sentinels !== undefined && options.sentinels !== null

/** `Redis master "<name>" via sentinels <host:port>, ...`, as the errors of such a connection name it. */
export const sentinelEndpoint = (options: RedisOptions): string => {
  const name = typeof options.name === "string" && options.name !== "" ? JSON.stringify(options.name) : "(no name)"
  const sentinels = options.sentinels ?? []
  const tls = options.enableTLSForSentinelMode === true && options.tls !== undefined ? " (TLS)" : ""
  return `Redis master ${name} via ${
    sentinels.length === 0
      ? "no sentinels"
      : `sentinels ${sentinels.map((node) => nodeAddress(node, SENTINEL_PORT)).join(", ")}`
  }${tls}`
}

/** Whether `client` is a cluster (also a cluster of a mock library, which says so in `isCluster`). */
export const isCluster = (client: Client): client is Cluster =>
  client instanceof Cluster || ("isCluster" in client && client.isCluster === true)

/**
 * Where `client` connects: `Redis host:port`, `Redis <socket path>`, the sentinels of a named
 * master, or `Redis cluster <startup nodes>`. Never a password.
 */
export const endpointOf = (client: Client): string => {
  if (isCluster(client)) {
    // ioredis keeps the startup nodes in a field its types mark private
    const nodes = (client as unknown as { readonly startupNodes?: ReadonlyArray<unknown> }).startupNodes ?? []
    return `Redis cluster ${nodes.map((node) => nodeAddress(node)).join(", ")}`
  }
  const options: RedisOptions = (client as { readonly options?: RedisOptions }).options ?? {}
  // ioredis prefers the sentinels to a path when it is given both
  if (viaSentinels(options)) return sentinelEndpoint(options)
  if (typeof options.path === "string" && options.path !== "") return `Redis ${options.path}`
  return `Redis ${hostPort(options.host, options.port)}${options.tls === undefined ? "" : " (TLS)"}`
}

/**
 * What ioredis reports after asking every sentinel in turn (and again after it connected to each
 * master they named, one per attempt, and each refused): "All sentinels are unreachable. Retrying
 * from scratch after 10ms. Last error: ..." (the last error only if a sentinel itself failed).
 */
export const SENTINEL_ROUND = /^All sentinels are unreachable(?: and retry is disabled)?\.(?: Retrying from scratch after \d+ms\.)?(?: Last error: (.*))?$/

/**
 * A sentinel round that failed, by the last error of a sentinel: ioredis asks them on connections
 * that never reconnect, whose error is "Connection is closed." whatever kept them from answering.
 */
const sentinelRoundDetail = (last: string | undefined): string =>
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
export const hideCertificate = (error: unknown): void => {
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

// ---------------------------------------------------------------------------------------------
// refused commands and connections (managed Redis)
// ---------------------------------------------------------------------------------------------

/**
 * What lockstep needs each command for that a managed Redis may rename or disable, as the errors
 * that name a refused one say it. Every other command is either never sent (CONFIG, DEBUG,
 * SCRIPT, FUNCTION, KEYS, PING, ...) or sent by ioredis with its refusal ignored (CLIENT SETNAME,
 * CLIENT SETINFO).
 */
export const NEEDED_COMMANDS: ReadonlyMap<string, string> = new Map([
  ["EVALSHA", "to run its scripts"],
  ["EVAL", "to load its scripts (after a restart, or on a new server)"],
  ["SUBSCRIBE", "to wake waiters when a lock is released"],
  ["UNSUBSCRIBE", "to end the subscriptions of waiters"],
  ["INFO", "for the connection's ready check (ioredis), the eviction check and the failover quarantine"],
  ["SELECT", "to use the database the connection names"],
  ["WAIT", "for replica acknowledgement (replication)"],
  ["WAITAOF", "for replica acknowledgement (replication.aof)"],
  ["COMMAND", "to check that the server has WAITAOF (replication.aof)"],
  ["AUTH", "to log in with the connection's credentials"],
  ["HELLO", "to log in with the connection's credentials"],
  ["CLUSTER", "to find the slots of a Redis Cluster"]
])

/**
 * Redis's reply to a command it does not know, which is what a renamed or disabled
 * (`rename-command X ""`) one is: `ERR unknown command 'x', with args beginning with: ...`
 * (Redis 7; 6 quotes with backticks, older ones say no more), also as ioredis reports the ready
 * check that got it.
 */
const UNKNOWN_COMMAND = /^(?:Ready check failed: )?ERR unknown command [`']([^`']*)[`']/

/** The command (upper case) that `error` says the server does not know, if it says so. */
export const refusedCommand = (error: unknown): string | undefined => {
  const name = error instanceof Error ? UNKNOWN_COMMAND.exec(firstLine(error.message))?.[1] : undefined
  return name === undefined || name === "" ? undefined : name.toUpperCase()
}

/**
 * One line for commands the server refuses: `the server refuses EVALSHA (renamed or disabled),
 * which lockstep needs to run its scripts`.
 */
export const refusalDetail = (commands: ReadonlyArray<string>): string => {
  const needs = [...new Set(commands.flatMap((command) => NEEDED_COMMANDS.get(command) ?? []))]
  return `the server refuses ${commands.join(", ")} (renamed or disabled)${
    needs.length === 0 ? "" : `, which lockstep needs ${needs.join(", and ")}`
  }`
}

/**
 * Redis's reply to a connection beyond its `maxclients`, sent before it closes the connection.
 * ioredis sees it only as the reply to the first command of the connection.
 */
const MAX_CLIENTS = /ERR max number of clients reached/

/** Whether `error` is (or, as ioredis reports a failed ready check, contains) Redis's `maxclients` refusal. */
export const isClientLimit = (error: unknown): boolean => error instanceof Error && MAX_CLIENTS.test(firstLine(error.message))

/** The line for a connection refused at the server's `maxclients`. */
const CLIENT_LIMIT =
  "the server refused the connection: it has reached its client limit (maxclients; ERR max number of clients reached). " +
  "A backend opens one connection, one more for waiters once one waits, and one more with replication"

/**
 * One line about `error`: its message (first line), or what Node says inside an AggregateError
 * (a connection to a name with several addresses), with the last node error of a cluster failure.
 * A command the server refuses (renamed or disabled) is named with what lockstep needs it for,
 * and a connection refused at the server's client limit says so.
 */
export const errorDetail = (error: unknown): string => {
  if (!(error instanceof Error)) return firstLine(String(error))
  const refused = refusedCommand(error)
  if (refused !== undefined) return refusalDetail([refused])
  if (isClientLimit(error)) return CLIENT_LIMIT
  // ioredis's MaxRetriesPerRequestError ends with a pointer to its docs, and its sentinel round
  // says when it starts the next one: neither is news in a log line
  const own = firstLine(error.message)
    .replace(/\s*Refer to "maxRetriesPerRequest" option for details\.$/, "")
    .replace(SENTINEL_ROUND, (_, last: string | undefined) => sentinelRoundDetail(last))
  const inner = "errors" in error && Array.isArray(error.errors) ? error.errors.map(errorDetail) : []
  const code = "code" in error && typeof error.code === "string" ? error.code : undefined
  const text = own !== "" ? withCertificateNames(own, error, code) : inner.length > 0 ? inner.join("; ") : code ?? error.name
  const node: unknown = "lastNodeError" in error ? error.lastNodeError : undefined
  return node === undefined || node === null ? text : `${text} (last node error: ${errorDetail(node)})`
}

/**
 * A sentinel round in which no sentinel failed: every sentinel answered, yet the connection is
 * not up. Either each named a master that then refused the connection (whose own error says
 * more), or none of them knows the master's name (a 'sentinelError' says so).
 */
export const isQuietSentinelRound = (error: unknown): boolean => {
  const round = error instanceof Error ? SENTINEL_ROUND.exec(firstLine(error.message)) : null
  return round !== null && round[1] === undefined
}

/**
 * A sentinel's answer that named no master, in words ("sentinel 10.0.0.5:26379 knows no master
 * named "orders""), or undefined for the other 'sentinelError's (a sentinel that failed, which
 * the round's own error reports).
 */
export const sentinelAnswerDetail = (error: unknown, name: unknown): string | undefined => {
  const sentinel = error instanceof Error
    ? /^connected to sentinel (\S+) successfully, but got an invalid reply: null$/.exec(firstLine(error.message))?.[1]
    : undefined
  return sentinel === undefined ? undefined : `sentinel ${sentinel} knows no master named ${JSON.stringify(name ?? "")}`
}

/** An error reply of the server (WRONGTYPE, NOSCRIPT, a script's error, ...): it answered. */
export const isReplyError = (error: unknown): boolean => error instanceof Error && error.name === "ReplyError"

/**
 * ioredis giving up on a command because the connection is down (it retried as often as
 * `maxRetriesPerRequest` allows, or will not reconnect): next to the connection's own error, it
 * says nothing more.
 */
export const isGivingUp = (error: unknown): boolean =>
  error instanceof Error && (error.name === "MaxRetriesPerRequestError" || error.message === "Connection is closed.")

