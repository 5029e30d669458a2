/**
 * Database servers of a test's own, for fault tests that restart or stop them: a PostgreSQL
 * cluster (`initdb` / `pg_ctl`) or a MariaDB server (`mariadb-install-db` / `mariadbd`) in a
 * temporary data directory, listening on a free loopback port, removed with the scope. Never the
 * machine's shared services.
 */
import { execFile, spawn } from "node:child_process"
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import type { Scope } from "effect"

export interface OwnServer {
  readonly kind: "pg" | "mysql"
  /** The URL of database `lockstep` on this server. */
  readonly url: string
  /** Stops the server cleanly and starts it again on the same port and data. */
  readonly restart: Effect.Effect<void>
  /** With `ssl`: the file of the CA certificate that signed the server's. */
  readonly caFile?: string | undefined
}

const postgresBin = (() => {
  const root = "/usr/lib/postgresql"
  const version = existsSync(root) ? readdirSync(root).sort().at(-1) : undefined
  return version === undefined ? undefined : join(root, version, "bin")
})()

/** Whether this machine can start servers of its own (the binaries are installed). */
export const ownServersAvailable: boolean = postgresBin !== undefined && existsSync("/usr/sbin/mariadbd")

const isRoot = process.getuid?.() === 0

const run = (command: string, args: ReadonlyArray<string>, asPostgres = false): Effect.Effect<string> =>
  Effect.async<string>((resume) => {
    const [file, argv] = asPostgres && isRoot ? ["runuser", ["-u", "postgres", "--", command, ...args]] : [command, args]
    execFile(file, argv, { timeout: 60_000 }, (error, stdout, stderr) => {
      resume(error === null ? Effect.succeed(stdout) : Effect.die(new Error(`${command} failed: ${error.message}\n${stderr}`)))
    })
  })

/** A loopback port nothing listens on (at the time of asking). */
export const freePort: Effect.Effect<number> = Effect.async<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

/** The uid and gid of the `postgres` user, who runs the clusters when the tests run as root. */
const postgresIds = (): [number, number] => {
  const ids = /^postgres:[^:]*:(\d+):(\d+):/m.exec(readFileSync("/etc/passwd", "utf8"))
  return ids === null ? [0, 0] : [Number(ids[1]), Number(ids[2])]
}

const temporaryDirectory = (prefix: string, owner?: "postgres"): Effect.Effect<string, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const dir = mkdtempSync(join(tmpdir(), prefix))
      if (owner !== undefined && isRoot) chownSync(dir, ...postgresIds())
      return dir
    }),
    (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
  )

/** Retries `check` every 100 ms until it succeeds, for at most `seconds`. */
const until = (check: Effect.Effect<unknown>, seconds: number): Effect.Effect<void> =>
  Effect.gen(function*() {
    const deadline = Date.now() + seconds * 1_000
    while (true) {
      const ok = yield* Effect.exit(check)
      if (ok._tag === "Success") return
      if (Date.now() > deadline) return yield* Effect.die(new Error("server did not become ready"))
      yield* Effect.sleep("100 millis")
    }
  })

/**
 * A throwaway CA and a server certificate it signed for `localhost` and `127.0.0.1`, in `dir/tls`:
 * `ca.crt`, `server.crt` and `server.key` (mode 0600, owned by `owner` when the tests run as root).
 */
const certificates = (dir: string, owner?: "postgres"): Effect.Effect<{ readonly ca: string; readonly cert: string; readonly key: string }> =>
  Effect.gen(function*() {
    const tls = join(dir, "tls")
    mkdirSync(tls)
    const file = (name: string) => join(tls, name)
    const openssl = (...args: ReadonlyArray<string>) => run("openssl", args)
    yield* openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=lockstep test CA",
      "-keyout", file("ca.key"), "-out", file("ca.crt"))
    yield* openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", file("server.key"), "-out", file("server.csr"))
    writeFileSync(file("server.ext"), "subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    yield* openssl("x509", "-req", "-in", file("server.csr"), "-CA", file("ca.crt"), "-CAkey", file("ca.key"), "-CAcreateserial",
      "-days", "2", "-extfile", file("server.ext"), "-out", file("server.crt"))
    chmodSync(file("server.key"), 0o600)
    if (owner !== undefined && isRoot) {
      for (const name of ["server.crt", "server.key"]) chownSync(file(name), ...postgresIds())
    }
    return { ca: file("ca.crt"), cert: file("server.crt"), key: file("server.key") }
  })

/**
 * A PostgreSQL cluster of the test's own, with database `lockstep`. With `password`, connections
 * over TCP must give it (as user `postgres`); the socket in its directory stays open to the test.
 * With `ssl`, TCP connections must use TLS (plaintext ones are refused), with a certificate for
 * `localhost` and `127.0.0.1` signed by a CA of the server's own (`caFile`); the server also
 * listens on 127.0.0.2, a loopback address the certificate does not name.
 */
export const ownPostgresWith = (
  options: { readonly password?: string | undefined; readonly ssl?: boolean | undefined }
): Effect.Effect<OwnServer, never, Scope.Scope> =>
  Effect.gen(function*() {
    const bin = postgresBin!
    const dir = yield* temporaryDirectory("lockstep-pg-", "postgres")
    const port = yield* freePort
    const data = join(dir, "data")
    const auth = options.password === undefined
      ? ["-A", "trust"]
      : ["--auth-local=trust", "--auth-host=scram-sha-256", `--pwfile=${join(dir, "password")}`]
    if (options.password !== undefined) {
      writeFileSync(join(dir, "password"), `${options.password}\n`)
      if (isRoot) chownSync(join(dir, "password"), ...postgresIds())
    }
    yield* run(join(bin, "initdb"), ["-D", data, ...auth, "-U", "postgres", "--no-sync"], true)
    const tls = options.ssl === true ? yield* certificates(dir, "postgres") : undefined
    if (tls !== undefined) {
      // TCP only over TLS: no `host` line, so a plaintext connection finds no entry
      const method = options.password === undefined ? "trust" : "scram-sha-256"
      writeFileSync(join(data, "pg_hba.conf"), `local all all trust\nhostssl all all 127.0.0.0/8 ${method}\n`)
    }
    const serverOptions = tls === undefined
      ? `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`
      : `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1,127.0.0.2 -c fsync=off -c ssl=on ` +
        `-c ssl_cert_file=${tls.cert} -c ssl_key_file=${tls.key}`
    const ctl = (...args: ReadonlyArray<string>) => run(join(bin, "pg_ctl"), ["-D", data, "-w", ...args], true)
    // with its log in a file: a server that inherits pg_ctl's output keeps the pipe open
    const log = ["-o", serverOptions, "-l", join(dir, "log")]
    yield* Effect.acquireRelease(ctl(...log, "start"), () => Effect.ignore(ctl("-m", "immediate", "stop")))
    // through the socket: no password asked
    yield* run(join(bin, "psql"), ["-h", dir, "-p", String(port), "-U", "postgres", "-c", "CREATE DATABASE lockstep"])
    const credentials = options.password === undefined ? "postgres" : `postgres:${encodeURIComponent(options.password)}`
    return {
      kind: "pg" as const,
      url: `postgres://${credentials}@127.0.0.1:${port}/lockstep`,
      restart: Effect.asVoid(ctl(...log, "-m", "fast", "restart")),
      caFile: tls?.ca
    }
  })

/** A PostgreSQL cluster of the test's own, with database `lockstep`, open to anyone on loopback. */
export const ownPostgres: Effect.Effect<OwnServer, never, Scope.Scope> = ownPostgresWith({})

/**
 * A MariaDB server of the test's own, with database `lockstep` (no grant tables: anyone may
 * connect), started with `extra` arguments for `mariadbd` (e.g. `--sysdate-is-now`).
 */
export const ownMariadbWith = (extra: ReadonlyArray<string>): Effect.Effect<OwnServer, never, Scope.Scope> => Effect.gen(function*() {
  const dir = yield* temporaryDirectory("lockstep-mariadb-")
  const port = yield* freePort
  const data = join(dir, "data")
  yield* run("mariadb-install-db", ["--no-defaults", `--datadir=${data}`, "--user=root", "--skip-test-db"])
  const args = [
    "--no-defaults",
    `--datadir=${data}`,
    `--port=${port}`,
    "--bind-address=127.0.0.1",
    `--socket=${join(dir, "mysqld.sock")}`,
    `--pid-file=${join(dir, "mysqld.pid")}`,
    "--user=root",
    "--skip-grant-tables",
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=16M",
    ...extra
  ]
  const ping = run("mysqladmin", ["-h", "127.0.0.1", "-P", String(port), "-uroot", "ping"])
  const mariadbd = { current: undefined as ReturnType<typeof spawn> | undefined }
  const start = Effect.gen(function*() {
    mariadbd.current = spawn("/usr/sbin/mariadbd", args, { stdio: "ignore" })
    yield* until(ping, 30)
  })
  const stop = Effect.async<void>((resume) => {
    const child = mariadbd.current
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
    child.once("exit", () => resume(Effect.void))
    child.kill("SIGTERM")
  })
  yield* Effect.acquireRelease(start, () => stop)
  yield* run("mysql", ["-h", "127.0.0.1", "-P", String(port), "-uroot", "-e", "CREATE DATABASE lockstep"])
  return {
    kind: "mysql" as const,
    url: `mysql://root@127.0.0.1:${port}/lockstep`,
    restart: Effect.zipRight(stop, start)
  }
})

/** A MariaDB server of the test's own, with database `lockstep` (no grant tables: anyone may connect). */
export const ownMariadb: Effect.Effect<OwnServer, never, Scope.Scope> = ownMariadbWith([])
