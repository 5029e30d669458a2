/**
 * Spawning and supervising real `redis-server` processes for tests.
 *
 * @since 0.1.0
 * @internal
 */
import { execFile } from "node:child_process"
import { existsSync } from "node:fs"
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as path from "node:path"
import * as tls from "node:tls"
import type { Scope } from "effect"
import { Data, Duration, Effect, Option, Schedule } from "effect"
import type {
  Address,
  Certificates,
  ClusterOptions,
  Options,
  RedisCluster,
  RedisServer,
  TlsOptions
} from "../RedisServer.js"
import type { Proc } from "./serverProcess.js"
import * as ServerProcess from "./serverProcess.js"
import { close, describeExit, HOST, listen, withLog } from "./serverProcess.js"

/** Every failure of the launcher. */
export class RedisServerError extends Data.TaggedError("RedisServerError")<{
  readonly message: string
  readonly cause?: unknown
}> {}


const LOG_TAIL_CHARS = 4_000
const PING_ATTEMPT = Duration.millis(500)
const POLL_INTERVAL = Duration.millis(25)
const DEFAULT_START_TIMEOUT = Duration.seconds(10)
const DEFAULT_CLUSTER_TIMEOUT = Duration.seconds(20)
const DEFAULT_MASTERS = 3
const PORT_ATTEMPTS = 3
/** Redis puts the cluster bus on port + 10000, so cluster ports must stay below this. */
const MAX_CLUSTER_PORT = 55_535
/** Never the shared Redis (6379) nor its cluster bus. */
const RESERVED_PORTS: ReadonlySet<number> = new Set([6379, 16379])

// ---------------------------------------------------------------------------------------------
// binaries
// ---------------------------------------------------------------------------------------------

const envVar = (name: string): string | undefined => {
  const value = process.env[name]
  return value === undefined || value === "" ? undefined : value
}

/** `override`, else `REDIS_SERVER_BIN`, else `redis-server` (looked up on `PATH`). */
export const serverBin = (override: string | undefined): string =>
  override ?? envVar("REDIS_SERVER_BIN") ?? "redis-server"

/**
 * `override`, else `REDIS_CLI_BIN`, else the `redis-cli` next to `REDIS_SERVER_BIN` when that is a
 * path and the file exists, else `redis-cli` (looked up on `PATH`).
 */
export const cliBin = (override: string | undefined): Effect.Effect<string> =>
  Effect.sync(() => {
    const explicit = override ?? envVar("REDIS_CLI_BIN")
    if (explicit !== undefined) return explicit
    const server = envVar("REDIS_SERVER_BIN")
    if (server !== undefined && server.includes(path.sep)) {
      const sibling = path.join(path.dirname(server), "redis-cli")
      if (existsSync(sibling)) return sibling
    }
    return "redis-cli"
  })

interface CommandOutput {
  readonly stdout: string
  readonly stderr: string
}

/** Runs a command to completion (bounded); a non-zero exit is a failure carrying its output. */
export const runCommand = (
  bin: string,
  args: ReadonlyArray<string>,
  timeout: Duration.Duration
): Effect.Effect<CommandOutput, RedisServerError> =>
  Effect.async<CommandOutput, RedisServerError>((resume) => {
    const child = execFile(
      bin,
      args,
      { timeout: Duration.toMillis(timeout), killSignal: "SIGKILL", maxBuffer: 4 * 1024 * 1024, encoding: "utf8" },
      (error, stdout, stderr) => {
        if (error === null) {
          resume(Effect.succeed({ stdout, stderr }))
        } else {
          resume(Effect.fail(
            new RedisServerError({
              message: withLog(
                `\`${[bin, ...args].join(" ")}\` failed: ${error.message.split("\n")[0] ?? ""}`,
                `${stdout}\n${stderr}`
              ),
              cause: error
            })
          ))
        }
      }
    )
    child.stdin?.end()
    return Effect.sync(() => {
      child.kill("SIGKILL")
    })
  })

/** Whether `redis-server --version` runs and exits 0. */
export const available: Effect.Effect<boolean> = Effect.suspend(() =>
  runCommand(serverBin(undefined), ["--version"], Duration.seconds(5))
).pipe(Effect.as(true), Effect.orElseSucceed(() => false))

// ---------------------------------------------------------------------------------------------
// ports
// ---------------------------------------------------------------------------------------------

/**
 * A free loopback port: bind port 0, read it, close. With `cluster`, the port is at most 55535 and
 * port + 10000 (the cluster bus) is free too. Candidates that do not fit stay open until a fitting
 * one is found, so the kernel does not hand them out again meanwhile.
 */
export const freePort = (cluster: boolean): Effect.Effect<number, RedisServerError> =>
  Effect.acquireUseRelease(
    Effect.sync((): Array<net.Server> => []),
    (held) =>
      Effect.gen(function*() {
        for (let attempt = 0; attempt < 200; attempt++) {
          const candidate = yield* listen(0)
          if (Option.isNone(candidate)) continue
          const { port, server } = candidate.value
          held.push(server)
          if (RESERVED_PORTS.has(port)) continue
          if (!cluster) return port
          if (port > MAX_CLUSTER_PORT || RESERVED_PORTS.has(port + 10_000)) continue
          const bus = yield* listen(port + 10_000)
          if (Option.isNone(bus)) continue
          held.push(bus.value.server)
          return port
        }
        return yield* new RedisServerError({ message: "could not find a free loopback port" })
      }),
    (held) => Effect.forEach(held, close, { discard: true })
  )

// ---------------------------------------------------------------------------------------------
// RESP over node:net
// ---------------------------------------------------------------------------------------------

/** A RESP2 reply; error replies fail the call instead. */
export type Reply = string | number | null | ReadonlyArray<Reply>

type Parsed =
  | { readonly _tag: "Incomplete" }
  | { readonly _tag: "Value"; readonly value: Reply; readonly end: number }
  | { readonly _tag: "Error"; readonly message: string }

const incomplete: Parsed = { _tag: "Incomplete" }

const parse = (buffer: Buffer, start: number): Parsed => {
  const lineEnd = buffer.indexOf("\r\n", start)
  if (lineEnd < 0) return incomplete
  const type = String.fromCharCode(buffer[start] ?? 0)
  const line = buffer.toString("utf8", start + 1, lineEnd)
  const next = lineEnd + 2
  switch (type) {
    case "+":
      return { _tag: "Value", value: line, end: next }
    case ":":
      return { _tag: "Value", value: Number(line), end: next }
    case "-":
      return { _tag: "Error", message: line }
    case "$": {
      const length = Number(line)
      if (length < 0) return { _tag: "Value", value: null, end: next }
      if (buffer.length < next + length + 2) return incomplete
      return { _tag: "Value", value: buffer.toString("utf8", next, next + length), end: next + length + 2 }
    }
    case "*": {
      const length = Number(line)
      if (length < 0) return { _tag: "Value", value: null, end: next }
      const items: Array<Reply> = []
      let offset = next
      for (let i = 0; i < length; i++) {
        const item = parse(buffer, offset)
        if (item._tag !== "Value") return item
        items.push(item.value)
        offset = item.end
      }
      return { _tag: "Value", value: items, end: offset }
    }
    default:
      return { _tag: "Error", message: `unsupported reply type ${JSON.stringify(type)}` }
  }
}

const encode = (args: ReadonlyArray<string>): string =>
  `*${args.length}\r\n${args.map((arg) => `$${Buffer.byteLength(arg)}\r\n${arg}\r\n`).join("")}`

/** The cause of a call's failure when the server answered with an error reply. */
export class ReplyError extends Error {}

/**
 * How the launcher reaches a TLS server: trusting `ca`, whatever names the certificate carries (a
 * test may give it a certificate for another host on purpose; the launcher only checks it is up).
 */
export interface TlsClient {
  readonly ca: string
}

const connect = (port: number, secure: TlsClient | undefined): net.Socket =>
  secure === undefined
    ? net.createConnection({ host: HOST, port })
    : tls.connect({ host: HOST, port, ca: secure.ca, checkServerIdentity: () => undefined })

/**
 * Sends one command on a fresh connection (TLS with `secure`) and reads its reply, within
 * `timeout`.
 */
export const call = (
  port: number,
  args: ReadonlyArray<string>,
  timeout: Duration.Duration,
  secure?: TlsClient
): Effect.Effect<Reply, RedisServerError> =>
  Effect.async<Reply, RedisServerError>((resume) => {
    const socket = connect(port, secure)
    let buffer = Buffer.alloc(0)
    let settled = false
    const settle = (effect: Effect.Effect<Reply, RedisServerError>) => {
      if (settled) return
      settled = true
      socket.destroy()
      resume(effect)
    }
    const fail = (message: string, cause?: unknown) =>
      settle(Effect.fail(new RedisServerError({ message: `${args.join(" ")} on ${HOST}:${port}: ${message}`, cause })))
    socket.setNoDelay(true)
    socket.on(secure === undefined ? "connect" : "secureConnect", () => socket.write(encode(args)))
    socket.on("data", (chunk: Buffer) => {
      buffer = Buffer.concat([buffer, chunk])
      const parsed = parse(buffer, 0)
      if (parsed._tag === "Value") settle(Effect.succeed(parsed.value))
      else if (parsed._tag === "Error") fail(parsed.message, new ReplyError(parsed.message))
    })
    socket.on("error", (error) => fail(error.message, error))
    socket.on("close", () => fail("connection closed before a reply"))
    return Effect.sync(() => {
      settled = true
      socket.destroy()
    })
  }).pipe(
    Effect.timeoutFail({
      duration: timeout,
      onTimeout: () =>
        new RedisServerError({
          message: `${args.join(" ")} on ${HOST}:${port}: no reply within ${Duration.format(timeout)}`
        })
    })
  )

/** `call` for the replies the launcher reads as text: a string, an integer as text, or null. */
export const command = (
  port: number,
  args: ReadonlyArray<string>,
  timeout: Duration.Duration,
  secure?: TlsClient
): Effect.Effect<string | null, RedisServerError> =>
  Effect.map(call(port, args, timeout, secure), (reply) =>
    typeof reply === "number" ? String(reply) : typeof reply === "string" || reply === null ? reply : JSON.stringify(reply))

/**
 * One PING; succeeds on PONG, on NOAUTH (a server started with `--requirepass` answers an
 * unauthenticated PING that way) and on `ERR unknown command` (one started with
 * `--rename-command PING ""`): either way it answered, and it is up.
 */
export const ping = (
  port: number,
  timeout: Duration.Duration,
  secure?: TlsClient
): Effect.Effect<void, RedisServerError> =>
  Effect.flatMap(
    command(port, ["PING"], timeout, secure).pipe(
      Effect.catchIf(
        (error) => /^(NOAUTH|ERR unknown command)/.test(error.message.slice(`PING on ${HOST}:${port}: `.length)),
        () => Effect.succeed("PONG")
      )
    ),
    (reply) =>
      reply === "PONG"
        ? Effect.void
        : Effect.fail(new RedisServerError({ message: `PING on ${HOST}:${port} answered ${String(reply)}` }))
  )

// ---------------------------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------------------------

const { awaitReady, makeSlot, tempDir } = ServerProcess.make<RedisServerError>({
  leftoversKey: "@lockstep/servers/RedisServer/leftovers",
  logTailChars: LOG_TAIL_CHARS,
  name: "redis-server",
  notFoundHint: " (not found: install redis-server or set REDIS_SERVER_BIN)",
  error: (props) => new RedisServerError(props)
})

/** Polls PING until PONG, failing early (with the log tail) if the process exits first. */
const waitReady = (
  proc: Proc,
  port: number,
  timeout: Duration.Duration,
  secure: TlsClient | undefined
): Effect.Effect<void, RedisServerError> =>
  awaitReady({
    proc,
    probe: ping(port, PING_ATTEMPT, secure),
    interval: POLL_INTERVAL,
    timeout,
    exitedEarly: (info) => `redis-server on port ${port} exited (${describeExit(info)}) before answering PING`,
    timedOut: () =>
      `redis-server (pid ${proc.pid}) on port ${port} did not answer PING within ${Duration.format(timeout)}`
  })

const addressInUse = (error: RedisServerError): boolean => /address already in use|EADDRINUSE/i.test(error.message)

// ---------------------------------------------------------------------------------------------
// certificates
// ---------------------------------------------------------------------------------------------

const DEFAULT_ALT_NAMES: ReadonlyArray<string> = [HOST, "localhost"]
const OPENSSL_TIMEOUT = Duration.seconds(10)

const isIp = (name: string): boolean => net.isIP(name) !== 0

/**
 * `RedisServer.makeCertificates`: a CA and a server certificate for `altNames` (default 127.0.0.1
 * and localhost), P-256 keys, valid for two days, made with `openssl` in a temp dir.
 */
export const makeCertificates = (
  options: TlsOptions = {}
): Effect.Effect<Certificates, RedisServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const altNames = options.altNames ?? DEFAULT_ALT_NAMES
    if (altNames.length === 0 || altNames.some((name) => !/^[A-Za-z0-9.:*-]+$/.test(name))) {
      return yield* new RedisServerError({ message: `invalid certificate names: ${JSON.stringify(altNames)}` })
    }
    const dir = yield* tempDir("lockstep-tls-")
    const file = (name: string) => path.join(dir, name)
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    const openssl = (args: ReadonlyArray<string>) => runCommand("openssl", args, OPENSSL_TIMEOUT)
    yield* openssl([
      "req", "-x509", "-new", ...ec, "-keyout", file("ca.key"), "-out", file("ca.crt"), "-days", "2",
      "-subj", "/CN=lockstep test CA",
      "-addext", "basicConstraints=critical,CA:TRUE",
      "-addext", "keyUsage=critical,keyCertSign,cRLSign"
    ])
    yield* openssl(["req", "-new", ...ec, "-keyout", file("server.key"), "-out", file("server.csr"), "-subj", `/CN=${altNames[0]}`])
    const san = altNames.map((name) => (isIp(name) ? `IP:${name}` : `DNS:${name}`)).join(",")
    yield* Effect.tryPromise({
      try: () =>
        fs.writeFile(
          file("server.ext"),
          `subjectAltName=${san}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyAgreement\nextendedKeyUsage=serverAuth,clientAuth\n`
        ),
      catch: (cause) => new RedisServerError({ message: `cannot write ${file("server.ext")}: ${String(cause)}`, cause })
    })
    yield* openssl([
      "x509", "-req", "-in", file("server.csr"), "-CA", file("ca.crt"), "-CAkey", file("ca.key"),
      "-CAcreateserial", "-out", file("server.crt"), "-days", "2", "-extfile", file("server.ext")
    ])
    const ca = yield* Effect.tryPromise({
      try: () => fs.readFile(file("ca.crt"), "utf8"),
      catch: (cause) => new RedisServerError({ message: `cannot read ${file("ca.crt")}: ${String(cause)}`, cause })
    })
    const certificates: Certificates = {
      dir,
      ca,
      caFile: file("ca.crt"),
      certFile: file("server.crt"),
      keyFile: file("server.key"),
      altNames
    }
    return certificates
  })

/**
 * The arguments of a server that speaks TLS only, on `port` (no plaintext port), without client
 * certificates; in a cluster, the bus speaks TLS too.
 */
const tlsArgs = (certificates: Certificates, port: number, cluster: boolean): ReadonlyArray<string> => [
  "--port",
  "0",
  "--tls-port",
  String(port),
  "--tls-cert-file",
  certificates.certFile,
  "--tls-key-file",
  certificates.keyFile,
  "--tls-ca-cert-file",
  certificates.caFile,
  "--tls-auth-clients",
  "no",
  "--tls-replication",
  "yes",
  ...(cluster ? ["--tls-cluster", "yes"] : [])
]

/** The certificates `tls` asks for: none, new ones (in the scope), or the ones given. */
export const certificatesFor = (
  option: Options["tls"]
): Effect.Effect<Certificates | undefined, RedisServerError, Scope.Scope> =>
  option === undefined || option === false
    ? Effect.succeed(undefined)
    : option === true
    ? makeCertificates()
    : "certFile" in option
    ? Effect.succeed(option)
    : makeCertificates(option)

// ---------------------------------------------------------------------------------------------
// servers
// ---------------------------------------------------------------------------------------------

export interface Launch {
  readonly bin: string
  readonly startTimeout: Duration.Duration
  readonly cluster: boolean
  readonly args: (port: number) => ReadonlyArray<string>
  /**
   * The text of a config file, written once into the server's dir and passed first, so that
   * `CONFIG REWRITE` (which sentinels rely on) works and a restart keeps what was rewritten.
   */
  readonly configFile?: string
  /** The server speaks TLS only, on its port, with these certificates. */
  readonly tls?: Certificates
}

export const launch = (config: Launch): Effect.Effect<RedisServer, RedisServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const dir = yield* tempDir("lockstep-redis-")
    const configPath = config.configFile === undefined ? undefined : path.join(dir, "redis.conf")
    if (configPath !== undefined) {
      yield* Effect.tryPromise({
        try: () => fs.writeFile(configPath, config.configFile ?? ""),
        catch: (cause) => new RedisServerError({ message: `cannot write ${configPath}: ${String(cause)}`, cause })
      })
    }
    const lock = yield* Effect.makeSemaphore(1)
    const serialized = lock.withPermits(1)
    const slot = yield* makeSlot

    const argsFor = (port: number): ReadonlyArray<string> => [
      ...(configPath === undefined ? [] : [configPath]),
      "--port",
      String(port),
      "--bind",
      HOST,
      "--save",
      "",
      "--appendonly",
      "no",
      "--daemonize",
      "no",
      "--protected-mode",
      "no",
      "--dir",
      dir,
      ...(config.tls === undefined ? [] : tlsArgs(config.tls, port, config.cluster)),
      ...config.args(port)
    ]

    /** Starts a process on `port` (the current one must be stopped) and waits until it answers. */
    const start = (port: number): Effect.Effect<void, RedisServerError> =>
      slot.start(port, config.bin, argsFor(port), (proc) => waitReady(proc, port, config.startTimeout, config.tls))

    yield* Effect.addFinalizer(() =>
      serialized(slot.close)
    )

    /** The first start picks the port, retrying with another one if it was taken meanwhile. */
    const firstStart = (attempt: number): Effect.Effect<number, RedisServerError> =>
      Effect.flatMap(freePort(config.cluster), (port) =>
        start(port).pipe(
          Effect.as(port),
          Effect.catchIf((error) => attempt < PORT_ATTEMPTS && addressInUse(error), () => firstStart(attempt + 1))
        ))
    const port = yield* serialized(firstStart(1))

    const cannot = (what: string, why: string) =>
      new RedisServerError({ message: `cannot ${what} redis-server on port ${port}: ${why}` })


    const server: RedisServer = {
      host: HOST,
      port,
      url: `${config.tls === undefined ? "redis" : "rediss"}://${HOST}:${port}`,
      ca: config.tls?.ca,
      dir,
      ...slot.controls({ port, serialized, cannot, start: start(port) })
    }
    return server
  })

const decode = (input: Duration.DurationInput | undefined, fallback: Duration.Duration): Duration.Duration =>
  input === undefined ? fallback : Duration.decode(input)

/** `RedisServer.make`. */
export const make = (options: Options = {}): Effect.Effect<RedisServer, RedisServerError, Scope.Scope> =>
  Effect.flatMap(certificatesFor(options.tls), (certificates) => {
    const extra = options.args ?? []
    return launch({
      bin: serverBin(options.bin),
      startTimeout: decode(options.startTimeout, DEFAULT_START_TIMEOUT),
      cluster: false,
      args: () => extra,
      ...(certificates === undefined ? {} : { tls: certificates })
    })
  })

const clusterInfo = (node: RedisServer): Effect.Effect<string, RedisServerError> =>
  Effect.map(
    command(node.port, ["CLUSTER", "INFO"], PING_ATTEMPT, node.ca === undefined ? undefined : { ca: node.ca }),
    (reply) => reply ?? ""
  )

const infoField = (info: string, field: string): string | undefined =>
  info.split(/\r?\n/).find((line) => line.startsWith(`${field}:`))?.slice(field.length + 1).trim()

const describeInfo = (info: string | undefined): string =>
  info === undefined
    ? "no CLUSTER INFO reply"
    : `cluster_state:${infoField(info, "cluster_state") ?? "?"}, known_nodes:${
      infoField(info, "cluster_known_nodes") ?? "?"
    }`

/** Waits until every running node reports `cluster_state:ok` and knows all nodes. */
export const awaitHealthy = (
  nodes: ReadonlyArray<RedisServer>,
  timeout: Duration.Duration
): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    const last = new Map<number, string>()
    const healthy = (node: RedisServer) =>
      Effect.flatMap(node.isRunning, (isRunning) =>
        isRunning
          ? clusterInfo(node).pipe(
            Effect.tap((info) => Effect.sync(() => last.set(node.port, info))),
            Effect.filterOrFail(
              (info) =>
                infoField(info, "cluster_state") === "ok" &&
                Number(infoField(info, "cluster_known_nodes")) >= nodes.length,
              () => new RedisServerError({ message: `node ${node.port} is not healthy yet` })
            ),
            Effect.retry(Schedule.spaced(Duration.millis(50)))
          )
          : Effect.void)
    yield* Effect.forEach(nodes, healthy, { concurrency: "unbounded", discard: true }).pipe(
      Effect.timeoutFail({
        duration: timeout,
        onTimeout: () =>
          new RedisServerError({
            message: `cluster did not reach cluster_state:ok within ${Duration.format(timeout)}:\n${
              nodes.map((node) => `  ${node.host}:${node.port}: ${describeInfo(last.get(node.port))}`).join("\n")
            }`
          })
      })
    )
  })

/** `RedisServer.makeCluster`. */
export const makeCluster = (options: ClusterOptions = {}): Effect.Effect<RedisCluster, RedisServerError, Scope.Scope> =>
  Effect.gen(function*() {
    const masters = options.masters ?? DEFAULT_MASTERS
    if (!Number.isInteger(masters) || masters < 3) {
      return yield* new RedisServerError({ message: `a Redis cluster needs at least 3 masters, got ${masters}` })
    }
    const bin = serverBin(options.bin)
    const cli = yield* cliBin(options.cliBin)
    const startTimeout = decode(options.startTimeout, DEFAULT_START_TIMEOUT)
    const clusterTimeout = decode(options.clusterTimeout, DEFAULT_CLUSTER_TIMEOUT)
    const extra = options.args ?? []
    const certificates = yield* certificatesFor(options.tls)
    const nodes: ReadonlyArray<RedisServer> = yield* Effect.forEach(
      Array.from({ length: masters }, (_, i) => i),
      () =>
        launch({
          bin,
          startTimeout,
          cluster: true,
          args: (port) => [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            `nodes-${port}.conf`,
            "--cluster-node-timeout",
            "2000",
            ...extra
          ],
          ...(certificates === undefined ? {} : { tls: certificates })
        })
    )
    yield* runCommand(
      cli,
      [
        ...(certificates === undefined ? [] : ["--tls", "--cacert", certificates.caFile]),
        "--cluster",
        "create",
        ...nodes.map((node) => `${node.host}:${node.port}`),
        "--cluster-replicas",
        "0",
        "--cluster-yes"
      ],
      clusterTimeout
    )
    yield* awaitHealthy(nodes, clusterTimeout)
    const startupNodes: ReadonlyArray<Address> = nodes.map((node) => ({ host: node.host, port: node.port }))
    const cluster: RedisCluster = {
      nodes,
      startupNodes,
      awaitHealthy: (timeout) => awaitHealthy(nodes, decode(timeout, clusterTimeout))
    }
    return cluster
  })
