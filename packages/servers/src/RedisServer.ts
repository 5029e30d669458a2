/**
 * Real `redis-server` processes for tests, tied to a `Scope`: each server gets a free loopback
 * port (never the shared 6379) and a fresh temp dir, runs without persistence, and is killed (and
 * its dir removed) when the scope closes. Tests can kill, restart (on the same port), pause and
 * resume it to inject crashes and stalls; `makeCluster` builds a 3-master Redis Cluster the same
 * way.
 *
 * The binary is `REDIS_SERVER_BIN` if set, else `redis-server` on `PATH`; cluster creation uses
 * `REDIS_CLI_BIN`, else the `redis-cli` next to `REDIS_SERVER_BIN`, else `redis-cli` on `PATH`.
 * Check `available` first so that a suite can say plainly that it was not run.
 *
 * @since 0.1.0
 */
import type { Duration, Effect, Option, Scope } from "effect"
import * as internal from "./internal/redisServer.js"

/**
 * Every failure of the launcher: the binary cannot be run, the server did not answer PING in
 * time (the message ends with its last log lines), a control was used on a stopped server, the
 * cluster did not become healthy, ...
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(RedisServer.make()).pipe(
 *   Effect.catchTag("RedisServerError", (e) => Effect.logError(e.message))
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const RedisServerError: typeof internal.RedisServerError = internal.RedisServerError

/**
 * An instance of `RedisServerError`.
 *
 * @since 0.1.0
 * @category errors
 */
export type RedisServerError = internal.RedisServerError

/**
 * A host and port, as cluster clients take their startup nodes.
 *
 * @example
 * ```ts
 * import type { RedisServer } from "@lockstep/servers"
 *
 * const node: RedisServer.Address = { host: "127.0.0.1", port: 7000 }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Address {
  readonly host: string
  readonly port: number
}

/**
 * A running (or deliberately stopped) `redis-server` owned by a scope.
 *
 * The controls are serialized: one runs at a time. `kill` and `restart` work in any state;
 * `pause` and `resume` fail with `RedisServerError` when no process is running.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const crashAndRecover = (server: RedisServer.RedisServer) =>
 *   Effect.zipRight(server.kill, server.restart)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RedisServer extends Address {
  /** `redis://127.0.0.1:<port>`, or `rediss://127.0.0.1:<port>` for a server started with `tls`. */
  readonly url: string
  /**
   * For a server started with `tls`: the certificate (PEM) of the CA that signed the server's
   * certificate, which a client must trust (ioredis: `tls: { ca }`). Otherwise undefined.
   *
   * @since 0.1.0
   */
  readonly ca: string | undefined
  /** The server's working dir (a fresh temp dir, removed when the scope closes). */
  readonly dir: string
  /** The pid of the current process, if one is alive (paused or not). */
  readonly pid: Effect.Effect<Option.Option<number>>
  /** Whether a process is alive (paused or not). */
  readonly isRunning: Effect.Effect<boolean>
  /** The last few KB the current process wrote to stdout / stderr (its log). */
  readonly logs: Effect.Effect<string>
  /** SIGKILL and wait for the exit; nothing if not running. Clients see connection refused. */
  readonly kill: Effect.Effect<void, RedisServerError>
  /**
   * Stops the process if it runs (SIGTERM, SIGKILL after 2 s), starts a new one on the same port
   * and dir, and waits until it answers PING. Data is not kept (no persistence).
   */
  readonly restart: Effect.Effect<void, RedisServerError>
  /** SIGSTOP: connections are still accepted by the kernel but nothing answers. */
  readonly pause: Effect.Effect<void, RedisServerError>
  /** SIGCONT after `pause`. */
  readonly resume: Effect.Effect<void, RedisServerError>
}

/**
 * A Redis Cluster of masters (no replicas), each a `RedisServer`.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const failover = (cluster: RedisServer.RedisCluster) =>
 *   Effect.gen(function*() {
 *     const node = cluster.nodes[0]
 *     if (node === undefined) return
 *     yield* node.kill
 *     yield* node.restart
 *     yield* cluster.awaitHealthy()
 *   })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface RedisCluster {
  readonly nodes: ReadonlyArray<RedisServer>
  /** Host and port of every node, for a cluster client's startup nodes. */
  readonly startupNodes: ReadonlyArray<Address>
  /**
   * Waits until every running node reports `cluster_state:ok` and knows every node (default
   * timeout: the cluster's `clusterTimeout`), e.g. after restarting a node.
   */
  readonly awaitHealthy: (timeout?: Duration.DurationInput) => Effect.Effect<void, RedisServerError>
}

/**
 * Options of `make`.
 *
 * @example
 * ```ts
 * import type { RedisServer } from "@lockstep/servers"
 *
 * const options: RedisServer.Options = { args: ["--maxmemory", "64mb"], startTimeout: "5 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options {
  /**
   * Extra `redis-server` arguments, after the launcher's own (so they win). A password
   * (`["--requirepass", "secret"]`) is fine: the readiness PING takes NOAUTH as "up". So are
   * renamed or disabled commands, as managed Redis services configure them
   * (`["--rename-command", "CONFIG", ""]`, PING included: the readiness PING takes
   * `ERR unknown command` as "up") and a connection limit (`["--maxclients", "2"]`: the readiness
   * PING's connection is closed, though the server may count it for a moment after the start). The launcher sends nothing
   * but that PING (and `CLUSTER INFO` to a cluster).
   */
  readonly args?: ReadonlyArray<string>
  /** The binary; default `REDIS_SERVER_BIN`, else `redis-server` on `PATH`. */
  readonly bin?: string
  /** How long to wait for the first PONG of each start (default 10 s). */
  readonly startTimeout?: Duration.DurationInput
  /**
   * Speak TLS only: the port is a TLS port (`--port 0 --tls-port <port>`), the URL `rediss://`,
   * and clients need no certificate of their own (`--tls-auth-clients no`); in a cluster the bus
   * speaks TLS too. `true` makes a throwaway CA and a certificate for 127.0.0.1 and localhost
   * (see `makeCertificates`), `TlsOptions` one for other names, and `Certificates` uses those
   * (e.g. one CA for several servers). The CA is the server's `ca`. Default: no TLS.
   *
   * @since 0.1.0
   */
  readonly tls?: boolean | TlsOptions | Certificates
}

/**
 * The certificate a TLS server is started with.
 *
 * @example
 * ```ts
 * import type { RedisServer } from "@lockstep/servers"
 *
 * // a certificate for another host: clients connecting to 127.0.0.1 must refuse it
 * const wrongHost: RedisServer.TlsOptions = { altNames: ["other.example"] }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface TlsOptions {
  /**
   * The names the server certificate is for (its subjectAltName: IP addresses and DNS names).
   * Default 127.0.0.1 and localhost.
   */
  readonly altNames?: ReadonlyArray<string>
}

/**
 * A throwaway CA and a server certificate it signed, as files in a temp dir (removed when the
 * scope closes).
 *
 * @example
 * ```ts
 * import { Redis } from "ioredis"
 * import type { RedisServer } from "@lockstep/servers"
 *
 * const client = (server: RedisServer.RedisServer, certificates: RedisServer.Certificates) =>
 *   new Redis(server.url, { tls: { ca: certificates.ca } })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Certificates {
  /** The dir that holds the files. */
  readonly dir: string
  /** The CA's certificate (PEM): what a client trusts. */
  readonly ca: string
  /** The CA's certificate, as a file. */
  readonly caFile: string
  /** The server certificate (PEM file). */
  readonly certFile: string
  /** The server certificate's private key (PEM file). */
  readonly keyFile: string
  /** The names the server certificate is for. */
  readonly altNames: ReadonlyArray<string>
}

/**
 * Options of `makeCluster`.
 *
 * @example
 * ```ts
 * import type { RedisServer } from "@lockstep/servers"
 *
 * const options: RedisServer.ClusterOptions = { masters: 3, clusterTimeout: "15 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ClusterOptions extends Options {
  /** How many masters (at least 3, default 3). */
  readonly masters?: number
  /** The `redis-cli` binary; default `REDIS_CLI_BIN`, else next to `REDIS_SERVER_BIN`, else on `PATH`. */
  readonly cliBin?: string
  /** Bound on `redis-cli --cluster create` and on reaching `cluster_state:ok` (default 20 s). */
  readonly clusterTimeout?: Duration.DurationInput
}

/**
 * Whether `redis-server` (from `REDIS_SERVER_BIN`, else `PATH`) can be executed: `--version`
 * runs and exits 0.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const program = Effect.flatMap(RedisServer.available, (ok) =>
 *   ok ? Effect.log("real Redis suites will run") : Effect.log("redis-server not found: real Redis suites not run")
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const available: Effect.Effect<boolean> = internal.available

/**
 * Starts a `redis-server` on a free loopback port with a fresh temp dir and no persistence
 * (`--save "" --appendonly no`), and waits until it answers PING. Closing the scope stops it
 * (SIGTERM, SIGKILL after 2 s) and removes the dir. With `tls`, the server speaks TLS only (the
 * second example).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const server = yield* RedisServer.make()
 *     yield* Effect.log(`Redis at ${server.url}`)
 *     yield* server.kill
 *     yield* server.restart
 *   })
 * )
 * ```
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Redis } from "ioredis"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const server = yield* RedisServer.make({ tls: true })
 *     const client = new Redis(server.url, { tls: { ca: server.ca } }) // rediss://127.0.0.1:<port>
 *     yield* Effect.promise(() => client.ping())
 *     client.disconnect()
 *   })
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (options?: Options) => Effect.Effect<RedisServer, RedisServerError, Scope.Scope> = internal.make

/**
 * Makes a throwaway CA and a server certificate it signed (P-256 keys, valid two days) with
 * `openssl` (on `PATH`) in a temp dir that the scope removes. The server certificate is for
 * `altNames` (default 127.0.0.1 and localhost). Pass it as `tls` to several servers to have them
 * share one CA.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const certificates = yield* RedisServer.makeCertificates()
 *     const a = yield* RedisServer.make({ tls: certificates })
 *     const b = yield* RedisServer.make({ tls: certificates })
 *     yield* Effect.log(`${a.url} and ${b.url}, both trusting the same CA`)
 *   })
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeCertificates: (
  options?: TlsOptions
) => Effect.Effect<Certificates, RedisServerError, Scope.Scope> = internal.makeCertificates

/**
 * Starts a Redis Cluster: `masters` (default 3) servers with `--cluster-enabled yes` (node
 * timeout 2 s), joined with `redis-cli --cluster create ... --cluster-replicas 0`, and waits until
 * every node reports `cluster_state:ok`. Closing the scope stops every node.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { RedisServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const cluster = yield* RedisServer.makeCluster()
 *     yield* Effect.log(cluster.startupNodes)
 *   })
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeCluster: (
  options?: ClusterOptions
) => Effect.Effect<RedisCluster, RedisServerError, Scope.Scope> = internal.makeCluster
