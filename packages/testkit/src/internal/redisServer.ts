/**
 * Spawning and supervising real `redis-server` processes for tests.
 *
 * @since 0.1.0
 * @internal
 */
import type { ChildProcess } from "node:child_process"
import { execFile, spawn } from "node:child_process"
import { existsSync, rmSync } from "node:fs"
import * as fs from "node:fs/promises"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import * as tls from "node:tls"
import { Data, Deferred, Duration, Effect, Exit, Option, Ref, Schedule, Scope } from "effect"
import type {
  Address,
  Certificates,
  ClusterOptions,
  Options,
  RedisCluster,
  RedisServer,
  TlsOptions
} from "../RedisServer.js"

/** Every failure of the launcher. */
export class RedisServerError extends Data.TaggedError("RedisServerError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

/** The loopback address every server binds. */
export const HOST = "127.0.0.1"

const LOG_TAIL_CHARS = 4_000
const ERROR_TAIL_LINES = 25
const TERM_GRACE = Duration.seconds(2)
const KILL_WAIT = Duration.seconds(5)
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

const tailLines = (text: string, lines: number = ERROR_TAIL_LINES): string =>
  text.trimEnd().split("\n").slice(-lines).join("\n")

export const withLog = (message: string, log: string): string => {
  const tail = tailLines(log)
  return tail === "" ? `${message} (no output)` : `${message}; last output:\n${tail}`
}

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

/** Listens on `port` (0: any) on the loopback address and returns the open server and its port. */
const listen = (port: number): Effect.Effect<Option.Option<{ readonly server: net.Server; readonly port: number }>> =>
  Effect.async((resume) => {
    const server = net.createServer()
    let settled = false
    server.once("error", () => {
      if (!settled) {
        settled = true
        resume(Effect.succeed(Option.none()))
      }
    })
    server.listen({ port, host: HOST, exclusive: true }, () => {
      const address = server.address()
      if (settled) return
      settled = true
      if (address !== null && typeof address === "object") {
        resume(Effect.succeed(Option.some({ server, port: address.port })))
      } else {
        server.close()
        resume(Effect.succeed(Option.none()))
      }
    })
    return Effect.sync(() => {
      server.close()
    })
  })

const close = (server: net.Server): Effect.Effect<void> =>
  Effect.async<void>((resume) => {
    server.close(() => resume(Effect.void))
  })

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
 * One PING; succeeds on PONG, and on NOAUTH: a server started with `--requirepass` answers an
 * unauthenticated PING that way, and it is up.
 */
export const ping = (
  port: number,
  timeout: Duration.Duration,
  secure?: TlsClient
): Effect.Effect<void, RedisServerError> =>
  Effect.flatMap(
    command(port, ["PING"], timeout, secure).pipe(
      Effect.catchIf((error) => error.message.startsWith(`PING on ${HOST}:${port}: NOAUTH`), () => Effect.succeed("PONG"))
    ),
    (reply) =>
      reply === "PONG"
        ? Effect.void
        : Effect.fail(new RedisServerError({ message: `PING on ${HOST}:${port} answered ${String(reply)}` }))
  )

// ---------------------------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------------------------

interface ExitInfo {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
  readonly error?: Error
}

const describeExit = (info: ExitInfo): string =>
  info.error !== undefined
    ? info.error.message
    : info.signal !== null
    ? `killed by ${info.signal}`
    : `exit code ${String(info.code)}`

interface Proc {
  readonly child: ChildProcess
  readonly pid: number
  readonly exited: Deferred.Deferred<ExitInfo>
  /** The tail of stdout + stderr (redis-server logs to stdout when `--logfile` is unset). */
  readonly log: { text: string }
}

/** What is left to clean up if the Node process exits before the scopes close. */
interface Leftovers {
  readonly children: Set<ChildProcess>
  readonly dirs: Set<string>
}

/**
 * Children still alive are SIGKILLed, and temp dirs removed, if the Node process exits before
 * their scopes close. Kept on `globalThis` so that one `exit` hook serves every copy of this
 * module in a process (test runners may evaluate it once per test file).
 */
const leftovers = (): Leftovers => {
  const key = Symbol.for("@lockstep/testkit/RedisServer/leftovers")
  const holder = globalThis as { [key]?: Leftovers }
  const existing = holder[key]
  if (existing !== undefined) return existing
  const created: Leftovers = { children: new Set(), dirs: new Set() }
  holder[key] = created
  process.once("exit", () => {
    for (const child of created.children) {
      try {
        child.kill("SIGKILL")
      } catch {
        // nothing left to do while exiting
      }
    }
    for (const dir of created.dirs) {
      try {
        rmSync(dir, { recursive: true, force: true })
      } catch {
        // nothing left to do while exiting
      }
    }
  })
  return created
}

const signal = (proc: Proc, sig: NodeJS.Signals): Effect.Effect<boolean> =>
  Effect.sync(() => {
    try {
      return proc.child.kill(sig)
    } catch {
      return false
    }
  })

/** Spawns the process; fails (with the spawn error) if it cannot be started at all. */
const spawnProcess = (bin: string, args: ReadonlyArray<string>): Effect.Effect<Proc, RedisServerError> =>
  Effect.gen(function*() {
    const exited = yield* Deferred.make<ExitInfo>()
    const log = { text: "" }
    const append = (chunk: Buffer | string): void => {
      log.text = (log.text + chunk.toString()).slice(-LOG_TAIL_CHARS)
    }
    // Spawning and wiring every listener happen in one synchronous step, so that no event
    // (notably a spawn `error`, which would otherwise be unhandled) can slip in between.
    const child = yield* Effect.try({
      try: () => {
        const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] })
        child.stdout?.on("data", append)
        child.stderr?.on("data", append)
        child.stdout?.on("error", () => undefined)
        child.stderr?.on("error", () => undefined)
        child.on("error", (error) => {
          append(`\n[${bin}] ${error.message}\n`)
          if (child.pid === undefined) Deferred.unsafeDone(exited, Exit.succeed({ code: null, signal: null, error }))
        })
        child.on("exit", (code, sig) => {
          leftovers().children.delete(child)
          Deferred.unsafeDone(exited, Exit.succeed({ code, signal: sig }))
        })
        if (child.pid !== undefined) leftovers().children.add(child)
        return child
      },
      catch: (cause) => new RedisServerError({ message: `cannot start ${bin}: ${String(cause)}`, cause })
    })
    const pid = child.pid
    if (pid === undefined) {
      const info = yield* Deferred.await(exited)
      const hint = (info.error as NodeJS.ErrnoException | undefined)?.code === "ENOENT"
        ? " (not found: install redis-server or set REDIS_SERVER_BIN)"
        : ""
      return yield* new RedisServerError({
        message: `cannot start ${bin}: ${describeExit(info)}${hint}`,
        cause: info.error
      })
    }
    return { child, pid, exited, log }
  })

const isAlive = (proc: Proc): Effect.Effect<boolean> => Effect.map(Deferred.isDone(proc.exited), (done) => !done)

/** SIGKILL, then wait (bounded) for the exit. */
const forceKill = (proc: Proc, port: number): Effect.Effect<void, RedisServerError> =>
  Effect.gen(function*() {
    if (!(yield* isAlive(proc))) return
    yield* signal(proc, "SIGKILL")
    yield* Deferred.await(proc.exited).pipe(
      Effect.timeoutFail({
        duration: KILL_WAIT,
        onTimeout: () =>
          new RedisServerError({
            message: `redis-server (pid ${proc.pid}, port ${port}) did not exit within ${
              Duration.format(KILL_WAIT)
            } of SIGKILL`
          })
      })
    )
  })

/** SIGCONT + SIGTERM, SIGKILL after the grace period; never fails. */
const terminate = (proc: Proc): Effect.Effect<void> =>
  Effect.gen(function*() {
    if (!(yield* isAlive(proc))) return
    yield* signal(proc, "SIGCONT")
    yield* signal(proc, "SIGTERM")
    const ended = yield* Deferred.await(proc.exited).pipe(Effect.timeout(TERM_GRACE), Effect.option)
    if (Option.isSome(ended)) return
    yield* signal(proc, "SIGKILL")
    yield* Deferred.await(proc.exited).pipe(Effect.timeout(KILL_WAIT), Effect.ignore)
  })

/** Polls PING until PONG, failing early (with the log tail) if the process exits first. */
const waitReady = (
  proc: Proc,
  port: number,
  timeout: Duration.Duration,
  secure: TlsClient | undefined
): Effect.Effect<void, RedisServerError> => {
  const pong = ping(port, PING_ATTEMPT, secure).pipe(Effect.retry(Schedule.spaced(POLL_INTERVAL)))
  const exitedEarly = Effect.flatMap(Deferred.await(proc.exited), (info) =>
    Effect.fail(
      new RedisServerError({
        message: withLog(
          `redis-server on port ${port} exited (${describeExit(info)}) before answering PING`,
          proc.log.text
        )
      })
    ))
  return Effect.raceFirst(pong, exitedEarly).pipe(
    Effect.timeoutFail({
      duration: timeout,
      onTimeout: () =>
        new RedisServerError({
          message: withLog(
            `redis-server (pid ${proc.pid}) on port ${port} did not answer PING within ${Duration.format(timeout)}`,
            proc.log.text
          )
        })
    })
  )
}

const addressInUse = (error: RedisServerError): boolean => /address already in use|EADDRINUSE/i.test(error.message)

// ---------------------------------------------------------------------------------------------
// certificates
// ---------------------------------------------------------------------------------------------

const DEFAULT_ALT_NAMES: ReadonlyArray<string> = [HOST, "localhost"]
const OPENSSL_TIMEOUT = Duration.seconds(10)

/** A temp dir removed when the scope closes (or when the Node process exits first). */
const tempDir = (prefix: string): Effect.Effect<string, RedisServerError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => fs.mkdtemp(path.join(os.tmpdir(), prefix)),
      catch: (cause) => new RedisServerError({ message: `cannot create a temp dir: ${String(cause)}`, cause })
    }).pipe(Effect.tap((dir) => Effect.sync(() => leftovers().dirs.add(dir)))),
    (dir) =>
      Effect.promise(() => fs.rm(dir, { recursive: true, force: true }).catch(() => undefined)).pipe(
        Effect.zipRight(Effect.sync(() => leftovers().dirs.delete(dir)))
      )
  )

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

interface Running {
  readonly proc: Proc
  readonly scope: Scope.CloseableScope
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
    const current = yield* Ref.make(Option.none<Running>())
    const closed = yield* Ref.make(false)

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

    /** Gracefully stops the current process (if any) and forgets it. */
    const stopCurrent = Effect.flatMap(Ref.getAndSet(current, Option.none()), (running) =>
      Option.match(running, {
        onNone: () => Effect.void,
        onSome: ({ scope }) => Scope.close(scope, Exit.void)
      }))

    /** Starts a process on `port` (the current one must be stopped) and waits until it answers. */
    const start = (port: number): Effect.Effect<void, RedisServerError> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(function*() {
          const scope = yield* Scope.make()
          const proc = yield* Effect.acquireRelease(spawnProcess(config.bin, argsFor(port)), terminate).pipe(
            Scope.extend(scope),
            Effect.tapError(() => Scope.close(scope, Exit.void))
          )
          yield* Ref.set(current, Option.some({ proc, scope }))
          yield* restore(waitReady(proc, port, config.startTimeout, config.tls)).pipe(
            Effect.onError(() =>
              forceKill(proc, port).pipe(
                Effect.ignore,
                Effect.zipRight(Scope.close(scope, Exit.void)),
                Effect.zipRight(Ref.set(current, Option.none()))
              )
            )
          )
        })
      )

    yield* Effect.addFinalizer(() =>
      serialized(Effect.zipRight(Ref.set(closed, true), stopCurrent))
    )

    /** The first start picks the port, retrying with another one if it was taken meanwhile. */
    const firstStart = (attempt: number): Effect.Effect<number, RedisServerError> =>
      Effect.flatMap(freePort(config.cluster), (port) =>
        start(port).pipe(
          Effect.as(port),
          Effect.catchIf((error) => attempt < PORT_ATTEMPTS && addressInUse(error), () => firstStart(attempt + 1))
        ))
    const port = yield* serialized(firstStart(1))

    const running: Effect.Effect<Option.Option<Proc>> = Effect.flatMap(Ref.get(current), (option) =>
      Option.match(option, {
        onNone: () => Effect.succeed(Option.none()),
        onSome: ({ proc }) => Effect.map(isAlive(proc), (alive) => (alive ? Option.some(proc) : Option.none()))
      }))

    const cannot = (what: string, why: string) =>
      new RedisServerError({ message: `cannot ${what} redis-server on port ${port}: ${why}` })

    const requireRunning = (what: string): Effect.Effect<Proc, RedisServerError> =>
      Effect.flatMap(running, (option) =>
        Option.match(option, {
          onNone: () => Effect.fail(cannot(what, "it is not running")),
          onSome: Effect.succeed
        }))

    const signalling = (what: string, sig: NodeJS.Signals): Effect.Effect<void, RedisServerError> =>
      serialized(Effect.flatMap(requireRunning(what), (proc) =>
        Effect.flatMap(signal(proc, sig), (sent) => sent ? Effect.void : Effect.fail(cannot(what, `${sig} failed`)))))

    const kill: Effect.Effect<void, RedisServerError> = serialized(
      Effect.flatMap(Ref.get(current), (option) =>
        Option.match(option, {
          onNone: () => Effect.void,
          onSome: ({ proc, scope }) =>
            forceKill(proc, port).pipe(
              Effect.zipRight(Scope.close(scope, Exit.void)),
              Effect.zipRight(Ref.set(current, Option.none()))
            )
        }))
    )

    const restart: Effect.Effect<void, RedisServerError> = serialized(
      Effect.flatMap(Ref.get(closed), (isClosed) =>
        isClosed
          ? Effect.fail(cannot("restart", "its scope is closed"))
          : Effect.zipRight(stopCurrent, start(port)))
    )

    const server: RedisServer = {
      host: HOST,
      port,
      url: `${config.tls === undefined ? "redis" : "rediss"}://${HOST}:${port}`,
      ca: config.tls?.ca,
      dir,
      pid: Effect.map(running, Option.map((proc) => proc.pid)),
      isRunning: Effect.map(running, Option.isSome),
      logs: Effect.map(Ref.get(current), Option.match({ onNone: () => "", onSome: ({ proc }) => proc.log.text })),
      kill,
      restart,
      pause: signalling("pause", "SIGSTOP"),
      resume: signalling("resume", "SIGCONT")
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
