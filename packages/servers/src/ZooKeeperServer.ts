/**
 * Real ZooKeeper servers for tests, tied to a `Scope`: each server gets free loopback ports (never
 * the shared 2181) and a fresh temp dir, and is killed (and its dir removed) when the scope
 * closes. Tests can kill, restart (on the same port, keeping the data), pause and resume it to
 * inject crashes and stalls; `makeEnsemble` builds a replicated ensemble (3 members by default)
 * the same way, to test leader failover.
 *
 * `java` runs `QuorumPeerMain` directly, without `zkServer.sh`, from the classpath of a ZooKeeper
 * installation (3.5 or later), found by configuration: the `classpath` option, else
 * `ZOOKEEPER_CLASSPATH`, else `ZOOKEEPER_HOME` (an unpacked Apache binary release: its
 * `lib/*.jar`), else Debian's `zookeeper` package (`/usr/share/java/zookeeper.jar`); `java` is the
 * `java` option, else `JAVA`, else `$JAVA_HOME/bin/java`, else `java` on `PATH` (see
 * `installation`). Readiness and modes are read with the four-letter words `ruok` and `srvr` over
 * plain TCP. Check `available` first so that a suite can say plainly that it was not run.
 *
 * @since 0.1.0
 */
import type { Duration, Effect, Option, Scope } from "effect"
import * as internal from "./internal/zooKeeperServer.js"

/**
 * Every failure of the launcher: no ZooKeeper installation is found (the message says what was
 * looked for), `java` cannot be run, the server did not serve in time (the message ends with its
 * last log lines), a control was used on a stopped server, no leader was elected in time, ...
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(ZooKeeperServer.make()).pipe(
 *   Effect.catchTag("ZooKeeperServerError", (e) => Effect.logError(e.message))
 * )
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export const ZooKeeperServerError: typeof internal.ZooKeeperServerError = internal.ZooKeeperServerError

/**
 * An instance of `ZooKeeperServerError`.
 *
 * @since 0.1.0
 * @category errors
 */
export type ZooKeeperServerError = internal.ZooKeeperServerError

/**
 * What `srvr` reports of a server: `standalone`, `leader` or `follower` while it serves;
 * `unknown` when it does not answer (stopped, paused) or does not serve (e.g. an ensemble member
 * during an election).
 *
 * @example
 * ```ts
 * import type { ZooKeeperServer } from "@lockstep/servers"
 *
 * const serving = (mode: ZooKeeperServer.Mode): boolean => mode !== "unknown"
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type Mode = "standalone" | "leader" | "follower" | "unknown"

/**
 * A running (or deliberately stopped) ZooKeeper server owned by a scope.
 *
 * The controls are serialized: one runs at a time. `kill` and `restart` work in any state;
 * `pause` and `resume` fail with `ZooKeeperServerError` when no process is running.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const crashAndRecover = (server: ZooKeeperServer.ZooKeeperServer) =>
 *   Effect.zipRight(server.kill, server.restart)
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface ZooKeeperServer {
  /** Always `127.0.0.1`. */
  readonly host: string
  /** The client port. */
  readonly port: number
  /** `127.0.0.1:<port>`, as ZooKeeper clients take it. */
  readonly connectionString: string
  /** The server's dir (a fresh temp dir, removed when the scope closes): `zoo.cfg` and `data/`. */
  readonly dir: string
  /** The pid of the current process, if one is alive (paused or not). */
  readonly pid: Effect.Effect<Option.Option<number>>
  /** Whether a process is alive (paused or not). */
  readonly isRunning: Effect.Effect<boolean>
  /** The last few KB the current process wrote to stdout / stderr (its log). */
  readonly logs: Effect.Effect<string>
  /** SIGKILL and wait for the exit; nothing if not running. Clients see connection refused. */
  readonly kill: Effect.Effect<void, ZooKeeperServerError>
  /**
   * Stops the process if it runs (SIGTERM, SIGKILL after 2 s), starts a new one on the same ports
   * and dir, and waits until `ruok` answers `imok` and `srvr` reports it serving: `standalone`,
   * or in an ensemble `leader` or `follower` (which needs a quorum of members running). The data
   * is kept: ZooKeeper persists every write to its data dir.
   */
  readonly restart: Effect.Effect<void, ZooKeeperServerError>
  /** SIGSTOP: connections are still accepted by the kernel but nothing answers. */
  readonly pause: Effect.Effect<void, ZooKeeperServerError>
  /** SIGCONT after `pause`. */
  readonly resume: Effect.Effect<void, ZooKeeperServerError>
  /** The mode `srvr` reports now (one attempt, 500 ms); `unknown` if it does not answer. */
  readonly mode: Effect.Effect<Mode>
}

/**
 * A member of an ensemble: a `ZooKeeperServer` and its `server.<id>` number (its `myid`).
 *
 * @example
 * ```ts
 * import type { ZooKeeperServer } from "@lockstep/servers"
 *
 * const describe = (member: ZooKeeperServer.EnsembleMember) => `server.${member.id} at ${member.connectionString}`
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface EnsembleMember extends ZooKeeperServer {
  /** 1, 2, 3, ...: the member's `myid`. */
  readonly id: number
}

/**
 * A replicated ZooKeeper ensemble.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const failover = (ensemble: ZooKeeperServer.Ensemble) =>
 *   Effect.gen(function*() {
 *     const old = yield* ensemble.leader
 *     yield* old.kill
 *     const next = yield* ensemble.leader // another member, once re-elected
 *     yield* old.restart // rejoins as a follower
 *     return next.id
 *   })
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Ensemble {
  /** The members, by id (`members[0].id === 1`). */
  readonly members: ReadonlyArray<EnsembleMember>
  /** `127.0.0.1:<port1>,127.0.0.1:<port2>,...`, as ZooKeeper clients take it. */
  readonly connectionString: string
  /**
   * Polls `srvr` on every member until exactly one reports `leader` and returns it; fails with
   * `ZooKeeperServerError` (listing every member's mode) after the ensemble's `electionTimeout`.
   */
  readonly leader: Effect.Effect<EnsembleMember, ZooKeeperServerError>
}

/**
 * Which ZooKeeper installation runs the servers. Each field left out is looked up (see
 * `installation`).
 *
 * @example
 * ```ts
 * import type { ZooKeeperServer } from "@lockstep/servers"
 *
 * const release: ZooKeeperServer.InstallationOptions = {
 *   java: "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
 *   classpath: ["/opt/zookeeper/lib/*", "/opt/zookeeper/conf"]
 * }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface InstallationOptions {
  /** The `java` binary (default: `JAVA`, else `$JAVA_HOME/bin/java`, else `java` on `PATH`). */
  readonly java?: string
  /**
   * The classpath that runs `org.apache.zookeeper.server.quorum.QuorumPeerMain`: jars,
   * directories, or `dir/*` for every jar of a directory, as `java -cp` takes them (default:
   * `ZOOKEEPER_CLASSPATH`, else `ZOOKEEPER_HOME`'s jars, else Debian's package).
   */
  readonly classpath?: ReadonlyArray<string>
}

/**
 * A ZooKeeper installation as `installation` found it.
 *
 * @example
 * ```ts
 * import type { ZooKeeperServer } from "@lockstep/servers"
 *
 * const describe = (found: ZooKeeperServer.Installation) => `${found.java}, classpath from ${found.source}`
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Installation {
  /** The `java` binary that runs the servers. */
  readonly java: string
  /** The classpath it runs them from. */
  readonly classpath: ReadonlyArray<string>
  /**
   * Where the classpath came from: `the classpath option`, `ZOOKEEPER_CLASSPATH`,
   * `ZOOKEEPER_HOME=<dir>` or `Debian's zookeeper package`.
   */
  readonly source: string
}

/**
 * Options of `make`.
 *
 * @example
 * ```ts
 * import type { ZooKeeperServer } from "@lockstep/servers"
 *
 * const options: ZooKeeperServer.Options = {
 *   minSessionTimeoutMs: 500,
 *   extraConfig: { maxClientCnxns: "100" }
 * }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface Options extends InstallationOptions {
  /** ZooKeeper's `tickTime` in ms (default 200, for quick timeouts and elections). */
  readonly tickTimeMs?: number
  /** `minSessionTimeout` in ms (default 1000): shorter session timeouts asked for are raised to it. */
  readonly minSessionTimeoutMs?: number
  /** `maxSessionTimeout` in ms (default 30000): longer session timeouts asked for are lowered to it. */
  readonly maxSessionTimeoutMs?: number
  /** More `zoo.cfg` lines; they replace the launcher's own of the same key. */
  readonly extraConfig?: Readonly<Record<string, string>>
  /** How long to wait for each start until the server serves (default 20 s). */
  readonly startTimeout?: Duration.DurationInput
}

/**
 * Options of `makeEnsemble`.
 *
 * @example
 * ```ts
 * import type { ZooKeeperServer } from "@lockstep/servers"
 *
 * const options: ZooKeeperServer.EnsembleOptions = { size: 5, electionTimeout: "20 seconds" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface EnsembleOptions extends Options {
  /** How many members (at least 2, default 3). */
  readonly size?: number
  /** Bound on the first election and on every `leader` (default 15 s). */
  readonly electionTimeout?: Duration.DurationInput
}

/**
 * Finds the ZooKeeper installation that runs the servers, in this order (the first one given is
 * used; a wrong one is reported, not passed over):
 *
 * 1. the `classpath` option;
 * 2. `ZOOKEEPER_CLASSPATH`: the classpath, its entries separated as `PATH`'s;
 * 3. `ZOOKEEPER_HOME`: an unpacked Apache ZooKeeper binary release (`apache-zookeeper-<version>-bin`):
 *    the jars at its top and in its `lib/`, and its `conf/`;
 * 4. Debian's `zookeeper` package: `/usr/share/java/zookeeper.jar` (its manifest names the rest),
 *    `/etc/zookeeper/conf` and `/usr/share/java/slf4j-simple.jar` (so that the server logs).
 *
 * and `java`: the `java` option, else `JAVA`, else `$JAVA_HOME/bin/java`, else `java` on `PATH`.
 * Fails with a `ZooKeeperServerError` that says what was looked for and which variable to set.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const program = Effect.flatMap(ZooKeeperServer.installation(), (found) =>
 *   Effect.log(`ZooKeeper from ${found.source}, run by ${found.java}`)
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const installation: (
  options?: InstallationOptions
) => Effect.Effect<Installation, ZooKeeperServerError> = internal.installation

/**
 * Whether a ZooKeeper server can be run: `installation()` finds one (from the environment or
 * Debian's package), and its `java -version` runs and exits 0.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const program = Effect.flatMap(ZooKeeperServer.available, (ok) =>
 *   ok ? Effect.log("ZooKeeper suites will run") : Effect.log("ZooKeeper not found: ZooKeeper suites not run")
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const available: Effect.Effect<boolean> = internal.available

/**
 * Starts a standalone ZooKeeper server on a free loopback port with a fresh temp dir, and waits
 * until `ruok` answers `imok` and `srvr` reports `standalone`. Closing the scope stops it
 * (SIGTERM, SIGKILL after 2 s) and removes the dir.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const server = yield* ZooKeeperServer.make()
 *     yield* Effect.log(`ZooKeeper at ${server.connectionString}`)
 *     yield* server.kill
 *     yield* server.restart
 *   })
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: (
  options?: Options
) => Effect.Effect<ZooKeeperServer, ZooKeeperServerError, Scope.Scope> = internal.make

/**
 * Starts an ensemble of `size` (default 3) members on free loopback ports (client, quorum and
 * election port each), each with its own dir and `myid`, all together, and waits until every
 * member serves and exactly one reports `leader`. Closing the scope stops every member.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { ZooKeeperServer } from "@lockstep/servers"
 *
 * const program = Effect.scoped(
 *   Effect.gen(function*() {
 *     const ensemble = yield* ZooKeeperServer.makeEnsemble({ size: 3 })
 *     const leader = yield* ensemble.leader
 *     yield* Effect.log(`${ensemble.connectionString}, leader server.${leader.id}`)
 *   })
 * )
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const makeEnsemble: (
  options?: EnsembleOptions
) => Effect.Effect<Ensemble, ZooKeeperServerError, Scope.Scope> = internal.makeEnsemble
