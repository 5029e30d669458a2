/**
 * The ZooKeeper backend: lockstep's locks on a ZooKeeper ensemble, the way ZooKeeper's lock
 * recipes work.
 *
 * Every contender for a key (a holder, or a waiter) is an ephemeral sequential node under
 * `<namespace>/locks/<key>`, named after its holder. A node's standing follows from the nodes
 * before it in sequence order: an exclusive node holds when nothing stands before it; a shared
 * node (read lock, semaphore permits) holds when no writer stands before it and the permits
 * before it and its own fit the limit. A waiter watches the one live node just before it, so a
 * release wakes the one waiter it lets in.
 *
 * - **Liveness**: a node belongs to the backend's session; when the session ends (the process
 *   died, or could not reach the ensemble for the session timeout) ZooKeeper deletes it, and a
 *   renewal or re-entry of its holder reports the hold lost (`LockLost`). A node also carries its
 *   lease: it expires a lease after its last write on the ensemble's clock (the node's `mtime`),
 *   and the next contender deletes it then, only if it was not written meanwhile. So a fixed
 *   `lease` ends when it says even while the holder's process lives, and the watchdog keeps a
 *   lease by rewriting the node.
 * - **Fences**: a grant's fence is the zxid of the first write of the attempt that was granted
 *   (its node's creation, `czxid`, or a waiter's last rewrite of its node), which grows with every
 *   write of the ensemble, across leader elections: every grant's fence is greater than the fence
 *   of every grant answered before its acquisition was sent.
 * - **At-least-once**: a `create` whose answer was lost leaves a node under the holder's name; the
 *   clean-up that follows a failed attempt finds it by that prefix and deletes it. A connection
 *   lost and restored within the session timeout keeps every node.
 *
 * @since 0.1.0
 */
import type { ConfigError, Scope } from "effect"
import { Config, Duration, Effect, Layer, Redacted } from "effect"
import { BackendKit, LockBackend } from "@lockstep/core"
import { BackendError } from "@lockstep/core/LockError"
import type * as Zk from "node-zookeeper-client"
import * as internal from "./internal/zooKeeperBackend.js"
import * as session from "./internal/session.js"

/**
 * How the backend uses ZooKeeper.
 *
 * @example
 * ```ts
 * import type { ZooKeeperBackend } from "@lockstep/zookeeper"
 *
 * const options: ZooKeeperBackend.Options = { namespace: "/app/locks", sessionTimeout: "10 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /** The path under which every node of the backend lives (created if absent). Default `/lockstep`. */
  readonly namespace?: string | undefined
  /**
   * The session timeout asked of the ensemble (it bounds it between 2 and 20 ticks): how long a
   * process that cannot reach the ensemble keeps its holds. Default 10 seconds. Only for a
   * client the backend makes itself.
   */
  readonly sessionTimeout?: Duration.DurationInput | undefined
  /** How long a call may take before it fails with `BackendError`. Default 5 seconds. */
  readonly commandTimeout?: Duration.DurationInput | undefined
  /** How long to wait for the first session. Default 10 seconds. */
  readonly connectTimeout?: Duration.DurationInput | undefined
  /**
   * How often the backend deletes the nodes of keys it has not used since the last time, if no
   * contender is under them. Default 1 minute.
   */
  readonly sweepInterval?: Duration.DurationInput | undefined
}

const millis = (input: Duration.DurationInput | undefined, fallback: Duration.DurationInput) =>
  Duration.toMillis(Duration.decode(input ?? fallback))

const namespaceOf = (options: Options | undefined): string => {
  const namespace = options?.namespace ?? "/lockstep"
  return namespace.length > 1 && namespace.endsWith("/") ? namespace.slice(0, -1) : namespace
}

/**
 * The backend on a node-zookeeper-client `Client` you own (borrowed: never closed here). It waits
 * until the client is connected. When the client's session expires its holds are lost, and every
 * later call fails until you give the backend a client with a live session. Make the client with
 * `retries` 0 (its default): a client that sends a request again after a connection loss would
 * send a sequential `create` twice, leaving the first node behind. While the backend lives, it
 * gives up the client's connections that died without closing (an attempt not answered within a
 * third of the session timeout, nothing heard for two thirds of it), so that the client resumes
 * its session on another server.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import * as Zk from "node-zookeeper-client"
 * import { ZooKeeperBackend } from "@lockstep/zookeeper"
 *
 * const client = Zk.createClient("127.0.0.1:2181")
 * client.connect()
 * const backend = Effect.scoped(ZooKeeperBackend.make(client))
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make = (
  client: Zk.Client,
  options?: Options
): Effect.Effect<LockBackend.Service, BackendError, Scope.Scope> => {
  // a borrowed client does not say where it connects
  const endpoint = BackendKit.endpointName("ZooKeeper")
  return Effect.flatMap(
    session.borrowed(client, millis(options?.connectTimeout, "10 seconds"), endpoint),
    (live) =>
      internal.make(live, {
        namespace: namespaceOf(options),
        commandTimeoutMs: millis(options?.commandTimeout, "5 seconds"),
        sweepIntervalMs: millis(options?.sweepInterval, "1 minute"),
        endpoint
      })
  )
}

/**
 * The backend as a layer on a client you own.
 *
 * @example
 * ```ts
 * import * as Zk from "node-zookeeper-client"
 * import { ZooKeeperBackend } from "@lockstep/zookeeper"
 *
 * const client = Zk.createClient("127.0.0.1:2181")
 * client.connect()
 * const backend = ZooKeeperBackend.layer({ client })
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer = (options: Options & { readonly client: Zk.Client }): Layer.Layer<LockBackend.LockBackend, BackendError> =>
  Layer.scoped(LockBackend.LockBackend, make(options.client, options))

/**
 * The parts of a connection string: `zk://host1:2181,host2:2181/chroot`, or the same without
 * `zk://`; `user:password@` before the hosts authenticates with ZooKeeper's digest scheme.
 */
const parse = (url: string): {
  readonly hosts: string
  readonly chroot: string
  readonly digest: string | undefined
  readonly endpoint: string
} => {
  const text = url.replace(/^zk:\/\//i, "")
  const at = text.lastIndexOf("@", text.indexOf("/") === -1 ? text.length : text.indexOf("/"))
  const digest = at === -1 ? undefined : decodeURIComponent(text.slice(0, at))
  const connectionString = at === -1 ? text : text.slice(at + 1)
  const slash = connectionString.indexOf("/")
  const hosts = slash === -1 ? connectionString : connectionString.slice(0, slash)
  const chroot = slash === -1 ? "" : connectionString.slice(slash).replace(/\/+$/, "")
  // the hosts and the chroot as the connection string names them, without the credentials
  return { hosts, chroot, digest, endpoint: BackendKit.endpointName("ZooKeeper", connectionString) }
}

/**
 * The backend on a client of its own, for a connection string `zk://host1:2181,host2:2181/chroot`
 * (`zk://` may be left out; `zk://user:password@host:2181` sends digest credentials). The chroot
 * is created if absent: the backend's nodes go under `<chroot><namespace>`.
 * The client is closed with the layer; when its session expires, the backend opens a new session
 * (the holds of the old one are lost, and their holders learn it as `LockLost`). Errors name the
 * hosts, never the password.
 *
 * @example
 * ```ts
 * import { ZooKeeperBackend } from "@lockstep/zookeeper"
 *
 * const backend = ZooKeeperBackend.layerFrom("zk://127.0.0.1:2181/app", { sessionTimeout: "10 seconds" })
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerFrom = (
  url: string | Redacted.Redacted,
  options?: Options
): Layer.Layer<LockBackend.LockBackend, BackendError> =>
  Layer.scoped(
    LockBackend.LockBackend,
    Effect.gen(function*() {
      const parts = parse(Redacted.isRedacted(url) ? Redacted.value(url) : url)
      if (parts.hosts === "") {
        return yield* new BackendError({ operation: "connect", cause: "no hosts", detail: "the connection string names no host" })
      }
      // the chroot is a prefix of the namespace rather than the client's: it need not exist
      const live = yield* session.owned({
        connectionString: parts.hosts,
        sessionTimeoutMs: millis(options?.sessionTimeout, "10 seconds"),
        connectTimeoutMs: millis(options?.connectTimeout, "10 seconds"),
        digest: parts.digest,
        endpoint: parts.endpoint
      })
      return yield* internal.make(live, {
        namespace: `${parts.chroot}${namespaceOf(options) === "/" ? "" : namespaceOf(options)}` || "/",
        commandTimeoutMs: millis(options?.commandTimeout, "5 seconds"),
        sweepIntervalMs: millis(options?.sweepInterval, "1 minute"),
        endpoint: parts.endpoint
      })
    })
  )

/**
 * `layerFrom` with the connection string from config: by default the `ZOOKEEPER_URL` environment
 * variable (a secret: it may carry a password).
 *
 * @example
 * ```ts
 * import { Config } from "effect"
 * import { ZooKeeperBackend } from "@lockstep/zookeeper"
 *
 * const fromEnv = ZooKeeperBackend.layerConfig()
 * const custom = ZooKeeperBackend.layerConfig(Config.redacted("LOCKS_ZOOKEEPER"), { namespace: "/locks" })
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerConfig = (
  url: Config.Config<Redacted.Redacted> = Config.redacted("ZOOKEEPER_URL"),
  options?: Options
): Layer.Layer<LockBackend.LockBackend, BackendError | ConfigError.ConfigError> =>
  Layer.unwrapEffect(Effect.map(url, (value) => layerFrom(value, options)))
