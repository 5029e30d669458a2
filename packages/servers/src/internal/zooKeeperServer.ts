/**
 * Spawning and supervising real ZooKeeper servers (standalone and ensembles) for tests.
 *
 * @since 0.1.0
 * @internal
 */
import { execFile } from "node:child_process"
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as path from "node:path"
import type { Scope } from "effect"
import { Data, Duration, Effect, Either, Option, Schedule } from "effect"
import type {
  Ensemble,
  EnsembleMember,
  EnsembleOptions,
  Installation,
  InstallationOptions,
  Mode,
  Options,
  ZooKeeperServer
} from "../ZooKeeperServer.js"
import type { Proc } from "./serverProcess.js"
import * as ServerProcess from "./serverProcess.js"
import { close, describeExit, HOST, listen } from "./serverProcess.js"
import * as ZooKeeperInstallation from "./zooKeeperInstallation.js"

/** Every failure of the launcher. */
export class ZooKeeperServerError extends Data.TaggedError("ZooKeeperServerError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

const MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

const LOG_TAIL_CHARS = 8_000
const PROBE_ATTEMPT = Duration.millis(500)
const POLL_INTERVAL = Duration.millis(50)
const DEFAULT_START_TIMEOUT = Duration.seconds(20)
const DEFAULT_ELECTION_TIMEOUT = Duration.seconds(15)
const DEFAULT_TICK_TIME_MS = 200
const DEFAULT_MIN_SESSION_TIMEOUT_MS = 1_000
const DEFAULT_MAX_SESSION_TIMEOUT_MS = 30_000
const DEFAULT_SIZE = 3
const PORT_ATTEMPTS = 3
/** Never the shared ZooKeeper ports (client, quorum, election, admin). */
const RESERVED_PORTS: ReadonlySet<number> = new Set([2181, 2888, 3888, 8080])

// ---------------------------------------------------------------------------------------------
// installation and availability
// ---------------------------------------------------------------------------------------------

/** `ZooKeeperServer.installation`: the options' choice, else the environment's, else Debian's. */
export const installation = (
  options: InstallationOptions = {}
): Effect.Effect<Installation, ZooKeeperServerError> =>
  Effect.suspend(() =>
    Either.match(ZooKeeperInstallation.find(options, ZooKeeperInstallation.processHost), {
      onLeft: (message) => Effect.fail(new ZooKeeperServerError({ message })),
      onRight: (found) => Effect.succeed(found)
    })
  )

/** Whether `java -version` runs and exits 0. */
const javaRuns = (java: string): Effect.Effect<boolean> =>
  Effect.async<boolean>((resume) => {
    const child = execFile(java, ["-version"], { timeout: 10_000, killSignal: "SIGKILL" }, (error) =>
      resume(Effect.succeed(error === null)))
    child.stdin?.end()
    return Effect.sync(() => {
      child.kill("SIGKILL")
    })
  })

/** Whether an installation is found (without options) and its `java -version` runs and exits 0. */
export const available: Effect.Effect<boolean> = installation().pipe(
  Effect.matchEffect({ onFailure: () => Effect.succeed(false), onSuccess: (found) => javaRuns(found.java) })
)

// ---------------------------------------------------------------------------------------------
// ports
// ---------------------------------------------------------------------------------------------

/**
 * `count` distinct free loopback ports: bind port 0, read it, and keep every candidate open until
 * all are found, so that the kernel does not hand one out twice.
 */
export const freePorts = (count: number): Effect.Effect<ReadonlyArray<number>, ZooKeeperServerError> =>
  Effect.acquireUseRelease(
    Effect.sync((): Array<net.Server> => []),
    (held) =>
      Effect.gen(function*() {
        const ports: Array<number> = []
        for (let attempt = 0; attempt < 200 + count && ports.length < count; attempt++) {
          const candidate = yield* listen(0)
          if (Option.isNone(candidate)) continue
          held.push(candidate.value.server)
          if (!RESERVED_PORTS.has(candidate.value.port)) ports.push(candidate.value.port)
        }
        if (ports.length < count) {
          return yield* new ZooKeeperServerError({ message: `could not find ${count} free loopback ports` })
        }
        return ports
      }),
    (held) => Effect.forEach(held, close, { discard: true })
  )

// ---------------------------------------------------------------------------------------------
// four-letter words over node:net
// ---------------------------------------------------------------------------------------------

/**
 * Sends a four-letter word on a fresh connection and reads the answer until the server closes the
 * connection, within `timeout`.
 */
export const fourLetterWord = (
  port: number,
  word: string,
  timeout: Duration.Duration = PROBE_ATTEMPT
): Effect.Effect<string, ZooKeeperServerError> =>
  Effect.async<string, ZooKeeperServerError>((resume) => {
    const socket = net.createConnection({ host: HOST, port })
    let received = ""
    let settled = false
    const settle = (effect: Effect.Effect<string, ZooKeeperServerError>) => {
      if (settled) return
      settled = true
      socket.destroy()
      resume(effect)
    }
    socket.setNoDelay(true)
    socket.on("connect", () => socket.write(word))
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString("utf8")
    })
    socket.on("error", (error) =>
      settle(Effect.fail(
        new ZooKeeperServerError({ message: `${word} on ${HOST}:${port}: ${error.message}`, cause: error })
      )))
    socket.on("close", () => settle(Effect.succeed(received)))
    return Effect.sync(() => {
      settled = true
      socket.destroy()
    })
  }).pipe(
    Effect.timeoutFail({
      duration: timeout,
      onTimeout: () =>
        new ZooKeeperServerError({
          message: `${word} on ${HOST}:${port}: no answer within ${Duration.format(timeout)}`
        })
    })
  )

const MODES: ReadonlySet<string> = new Set(["standalone", "leader", "follower"])

/** The `Mode:` line of a `srvr` answer; `unknown` when there is none (not serving, no answer). */
export const parseMode = (srvr: string): Mode => {
  const found = /^Mode: *(\S+)/m.exec(srvr)?.[1]
  return found !== undefined && MODES.has(found) ? (found as Mode) : "unknown"
}

/** The server's mode by `srvr`; `unknown` when it does not answer or is not serving. */
export const modeOf = (port: number): Effect.Effect<Mode> =>
  fourLetterWord(port, "srvr").pipe(Effect.map(parseMode), Effect.orElseSucceed((): Mode => "unknown"))

/** Succeeds once `ruok` answers `imok` and `srvr` reports one of `modes`. */
const serving = (port: number, modes: ReadonlySet<Mode>): Effect.Effect<Mode, ZooKeeperServerError> =>
  Effect.gen(function*() {
    const ruok = yield* fourLetterWord(port, "ruok")
    if (ruok.trim() !== "imok") {
      return yield* new ZooKeeperServerError({ message: `ruok on ${HOST}:${port} answered ${JSON.stringify(ruok)}` })
    }
    const mode = parseMode(yield* fourLetterWord(port, "srvr"))
    if (!modes.has(mode)) {
      return yield* new ZooKeeperServerError({ message: `${HOST}:${port} is not serving yet (mode ${mode})` })
    }
    return mode
  })

// ---------------------------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------------------------

const { awaitReady, makeSlot, tempDir } = ServerProcess.make<ZooKeeperServerError>({
  leftoversKey: "@lockstep/servers/ZooKeeperServer/leftovers",
  logTailChars: LOG_TAIL_CHARS,
  name: "ZooKeeper",
  notFoundHint: ZooKeeperInstallation.JAVA_NOT_FOUND,
  error: (props) => new ZooKeeperServerError(props)
})

/** The `java` arguments that run the server on `configPath` from `classpath`, logging to stderr. */
const javaArgs = (dir: string, configPath: string, classpath: ReadonlyArray<string>): ReadonlyArray<string> => [
  "-Xms16m",
  "-Xmx256m",
  "-XX:+UseSerialGC",
  "-XX:TieredStopAtLevel=1",
  "-Djava.net.preferIPv4Stack=true",
  `-Dzookeeper.log.dir=${dir}`,
  "-Dorg.slf4j.simpleLogger.showDateTime=true",
  "-cp",
  classpath.join(path.delimiter),
  MAIN_CLASS,
  configPath
]

/** What a server logs when one of its ports is taken (client port, or quorum / election port). */
const BIND_FAILURE = /BindException|Address already in use|Exiting JVM with code 14\b/

const addressInUse = (error: ZooKeeperServerError): boolean => /address already in use/i.test(error.message)

const describeModes = (modes: ReadonlySet<Mode>): string => [...modes].join(" or ")

/**
 * Polls `ruok` and `srvr` until the server serves in one of `modes`, failing early (with the log
 * tail) if the process exits first.
 */
const waitReady = (
  proc: Proc,
  port: number,
  modes: ReadonlySet<Mode>,
  timeout: Duration.Duration
): Effect.Effect<void, ZooKeeperServerError> =>
  awaitReady({
    proc,
    probe: serving(port, modes),
    interval: POLL_INTERVAL,
    timeout,
    exitedEarly: (info) =>
      `ZooKeeper on port ${port} exited (${describeExit(info)}) before serving${
        BIND_FAILURE.test(proc.log.text) ? ": address already in use" : ""
      }`,
    timedOut: () =>
      `ZooKeeper (pid ${proc.pid}) on port ${port} did not serve as ${describeModes(modes)} within ${
        Duration.format(timeout)
      }`
  })

const writeFile = (file: string, text: string): Effect.Effect<void, ZooKeeperServerError> =>
  Effect.tryPromise({
    try: () => fs.writeFile(file, text),
    catch: (cause) => new ZooKeeperServerError({ message: `cannot write ${file}: ${String(cause)}`, cause })
  })

// ---------------------------------------------------------------------------------------------
// configuration
// ---------------------------------------------------------------------------------------------

interface Settings {
  readonly tickTimeMs: number
  readonly minSessionTimeoutMs: number
  readonly maxSessionTimeoutMs: number
  readonly extraConfig: Readonly<Record<string, string>>
  readonly startTimeout: Duration.Duration
}

const decode = (input: Duration.DurationInput | undefined, fallback: Duration.Duration): Duration.Duration =>
  input === undefined ? fallback : Duration.decode(input)

const positiveInteger = (value: number): boolean => Number.isInteger(value) && value > 0

const settingsOf = (options: Options): Effect.Effect<Settings, ZooKeeperServerError> =>
  Effect.gen(function*() {
    const settings: Settings = {
      tickTimeMs: options.tickTimeMs ?? DEFAULT_TICK_TIME_MS,
      minSessionTimeoutMs: options.minSessionTimeoutMs ?? DEFAULT_MIN_SESSION_TIMEOUT_MS,
      maxSessionTimeoutMs: options.maxSessionTimeoutMs ?? DEFAULT_MAX_SESSION_TIMEOUT_MS,
      extraConfig: options.extraConfig ?? {},
      startTimeout: decode(options.startTimeout, DEFAULT_START_TIMEOUT)
    }
    const invalid = (message: string) => new ZooKeeperServerError({ message: `invalid ZooKeeper options: ${message}` })
    for (const key of ["tickTimeMs", "minSessionTimeoutMs", "maxSessionTimeoutMs"] as const) {
      if (!positiveInteger(settings[key])) return yield* invalid(`${key} must be a positive integer, got ${settings[key]}`)
    }
    if (settings.minSessionTimeoutMs > settings.maxSessionTimeoutMs) {
      return yield* invalid(
        `minSessionTimeoutMs (${settings.minSessionTimeoutMs}) exceeds maxSessionTimeoutMs (${settings.maxSessionTimeoutMs})`
      )
    }
    for (const [key, value] of Object.entries(settings.extraConfig)) {
      if (!/^[A-Za-z0-9._-]+$/.test(key) || /[\r\n]/.test(value)) {
        return yield* invalid(`bad extraConfig entry ${JSON.stringify(key)}=${JSON.stringify(value)}`)
      }
    }
    return settings
  })

interface Peer {
  readonly id: number
  readonly quorumPort: number
  readonly electionPort: number
}

/** The text of `zoo.cfg`; `extraConfig` entries replace the launcher's own of the same key. */
const configText = (
  settings: Settings,
  dir: string,
  clientPort: number,
  peers: ReadonlyArray<Peer>
): string => {
  const entries = new Map<string, string>([
    ["tickTime", String(settings.tickTimeMs)],
    ["initLimit", "10"],
    ["syncLimit", "5"],
    ["dataDir", path.join(dir, "data")],
    ["clientPort", String(clientPort)],
    ["clientPortAddress", HOST],
    ["minSessionTimeout", String(settings.minSessionTimeoutMs)],
    ["maxSessionTimeout", String(settings.maxSessionTimeoutMs)],
    ["admin.enableServer", "false"],
    ["4lw.commands.whitelist", "*"]
  ])
  if (peers.length > 0) {
    // a dead peer is refused at once on loopback; one that does not answer must not hold an
    // election up for the default 5 s
    entries.set("cnxTimeout", "500")
    // a member that cannot bind its election port exits soon (the launcher then retries on other
    // ports) instead of retrying for long
    entries.set("electionPortBindRetry", "2")
    for (const peer of peers) entries.set(`server.${peer.id}`, `${HOST}:${peer.quorumPort}:${peer.electionPort}`)
  }
  for (const [key, value] of Object.entries(settings.extraConfig)) entries.set(key, value)
  return [...entries].map(([key, value]) => `${key}=${value}\n`).join("")
}

// ---------------------------------------------------------------------------------------------
// servers
// ---------------------------------------------------------------------------------------------

/** One server's dir, process and controls, before its ports are final. */
interface Node {
  readonly dir: string
  readonly configPath: string
  readonly serialized: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  readonly slot: ServerProcess.Slot<ZooKeeperServerError>
  /** Starts a process (the current one must be stopped) and waits until it serves in `modes`. */
  readonly start: (
    port: number,
    modes: ReadonlySet<Mode>,
    timeout: Duration.Duration
  ) => Effect.Effect<void, ZooKeeperServerError>
}

const makeNode = (
  prefix: string,
  found: Installation
): Effect.Effect<Node, ZooKeeperServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const dir = yield* tempDir(prefix)
    yield* Effect.tryPromise({
      try: () => fs.mkdir(path.join(dir, "data")),
      catch: (cause) => new ZooKeeperServerError({ message: `cannot create ${dir}/data: ${String(cause)}`, cause })
    })
    const configPath = path.join(dir, "zoo.cfg")
    const lock = yield* Effect.makeSemaphore(1)
    const slot = yield* makeSlot

    const start = (port: number, modes: ReadonlySet<Mode>, timeout: Duration.Duration) =>
      slot.start(port, found.java, javaArgs(dir, configPath, found.classpath), (proc) =>
        waitReady(proc, port, modes, timeout))

    const serialized = lock.withPermits(1)
    yield* Effect.addFinalizer(() => serialized(slot.close))

    const node: Node = { dir, configPath, serialized, slot, start }
    return node
  })

/** The public controls of a node whose ports are final. */
const serverOf = (
  node: Node,
  port: number,
  modes: ReadonlySet<Mode>,
  startTimeout: Duration.Duration
): ZooKeeperServer => {
  const { serialized, slot } = node

  const cannot = (what: string, why: string) =>
    new ZooKeeperServerError({ message: `cannot ${what} ZooKeeper on port ${port}: ${why}` })


  const server: ZooKeeperServer = {
    host: HOST,
    port,
    connectionString: `${HOST}:${port}`,
    dir: node.dir,
    ...slot.controls({ port, serialized, cannot, start: node.start(port, modes, startTimeout) }),
    mode: modeOf(port)
  }
  return server
}

const STANDALONE: ReadonlySet<Mode> = new Set(["standalone"])
const QUORUM_MEMBER: ReadonlySet<Mode> = new Set(["leader", "follower"])

/** `ZooKeeperServer.make`. */
export const make = (options: Options = {}): Effect.Effect<ZooKeeperServer, ZooKeeperServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const settings = yield* settingsOf(options)
    const node = yield* makeNode("lockstep-zookeeper-", yield* installation(options))
    /** The first start picks the port, retrying with another one if it was taken meanwhile. */
    const firstStart = (attempt: number): Effect.Effect<number, ZooKeeperServerError> =>
      Effect.gen(function*() {
        const [port] = yield* freePorts(1)
        if (port === undefined) return yield* new ZooKeeperServerError({ message: "no free port" })
        yield* writeFile(node.configPath, configText(settings, node.dir, port, []))
        return yield* node.start(port, STANDALONE, settings.startTimeout).pipe(
          Effect.as(port),
          Effect.catchIf((error) => attempt < PORT_ATTEMPTS && addressInUse(error), () => firstStart(attempt + 1))
        )
      })
    const port = yield* node.serialized(firstStart(1))
    return serverOf(node, port, STANDALONE, settings.startTimeout)
  })

/** Waits until exactly one of `members` reports `leader`, and returns it. */
const awaitLeader = (
  members: ReadonlyArray<EnsembleMember>,
  timeout: Duration.Duration
): Effect.Effect<EnsembleMember, ZooKeeperServerError> =>
  Effect.gen(function*() {
    let last: ReadonlyArray<Mode> = []
    const poll = Effect.gen(function*() {
      const modes = yield* Effect.forEach(members, (member) => member.mode, { concurrency: "unbounded" })
      last = modes
      const leaders = members.filter((_, i) => modes[i] === "leader")
      const [leader] = leaders
      if (leaders.length !== 1 || leader === undefined) {
        return yield* new ZooKeeperServerError({ message: `${leaders.length} members report leader` })
      }
      return leader
    })
    return yield* poll.pipe(
      Effect.retry(Schedule.spaced(POLL_INTERVAL)),
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () =>
          new ZooKeeperServerError({
            message: `no single ZooKeeper leader within ${Duration.format(timeout)}:\n${
              members.map((member, i) => `  server.${member.id} at ${member.connectionString}: ${last[i] ?? "?"}`)
                .join("\n")
            }`
          })
      })
    )
  })

/** `ZooKeeperServer.makeEnsemble`. */
export const makeEnsemble = (
  options: EnsembleOptions = {}
): Effect.Effect<Ensemble, ZooKeeperServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const size = options.size ?? DEFAULT_SIZE
    if (!Number.isInteger(size) || size < 2) {
      return yield* new ZooKeeperServerError({ message: `a ZooKeeper ensemble needs at least 2 members, got ${size}` })
    }
    const settings = yield* settingsOf(options)
    const electionTimeout = decode(options.electionTimeout, DEFAULT_ELECTION_TIMEOUT)
    const found = yield* installation(options)
    const nodes = yield* Effect.forEach(
      Array.from({ length: size }, (_, i) => i + 1),
      (id) =>
        Effect.flatMap(makeNode(`lockstep-zookeeper-${id}-`, found), (node) =>
          Effect.as(writeFile(path.join(node.dir, "data", "myid"), `${id}\n`), { id, node }))
    )

    /** Picks every port, writes every config and starts every member together. */
    const firstStart = (attempt: number): Effect.Effect<ReadonlyArray<number>, ZooKeeperServerError> =>
      Effect.gen(function*() {
        const ports = yield* freePorts(3 * size)
        const port = (i: number) => ports[i] ?? 0
        const peers: ReadonlyArray<Peer> = nodes.map(({ id }, i) => ({
          id,
          quorumPort: port(size + i),
          electionPort: port(2 * size + i)
        }))
        const clientPorts = nodes.map((_, i) => port(i))
        yield* Effect.forEach(nodes, ({ node }, i) =>
          writeFile(node.configPath, configText(settings, node.dir, port(i), peers)), { discard: true })
        const started = yield* Effect.forEach(
          nodes,
          ({ node }, i) => Effect.either(node.serialized(node.start(port(i), QUORUM_MEMBER, settings.startTimeout))),
          { concurrency: "unbounded" }
        )
        const failures = started.flatMap((result) => (result._tag === "Left" ? [result.left] : []))
        const [failure] = failures
        if (failure === undefined) return clientPorts
        yield* Effect.forEach(nodes, ({ node }, i) => node.serialized(node.slot.killCurrent(port(i))).pipe(Effect.ignore), {
          discard: true
        })
        return yield* attempt < PORT_ATTEMPTS && failures.some(addressInUse)
          ? firstStart(attempt + 1)
          : Effect.fail(failure)
      })
    const clientPorts = yield* firstStart(1)

    const members: ReadonlyArray<EnsembleMember> = nodes.map(({ id, node }, i) => ({
      ...serverOf(node, clientPorts[i] ?? 0, QUORUM_MEMBER, settings.startTimeout),
      id
    }))
    yield* awaitLeader(members, electionTimeout)
    const ensemble: Ensemble = {
      members,
      connectionString: members.map((member) => member.connectionString).join(","),
      leader: awaitLeader(members, electionTimeout)
    }
    return ensemble
  })
