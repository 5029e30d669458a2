/**
 * The backend a command locks on, from a URL (`--backend` or `LOCKSTEP_BACKEND`): every scheme the
 * Redis, SQL and ZooKeeper backends take, plus `redis+cluster://` for a Redis Cluster. The URL is checked
 * before anything connects; a failure to connect is one line naming the endpoint. On Redis, a key
 * prefix (`--prefix` or `LOCKSTEP_PREFIX`) is the namespace of every key and channel, the client's
 * `keyPrefix`, and `--accept-eviction` runs on a server whose eviction policy may evict lock keys;
 * the other backends refuse both.
 */
import { Config, Effect, Either, Layer, Option, Redacted } from "effect"
import type { LockBackend } from "@lockstep/core/LockBackend"
import type { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { SqlBackend } from "@lockstep/sql"
import { ZooKeeperBackend } from "@lockstep/zookeeper"
import { CliFailure, ExitCodes, usage } from "./errors.js"

/** The schemes, as the help and the errors list them. */
export const schemes =
  "redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster://, rediss+cluster://, postgres://, postgresql://, mysql://, mariadb://, sqlite:<file>, zk://"

const CLUSTER = /^(rediss?)\+cluster:\/\//i

/**
 * `redis+cluster://[[username]:password@]host:port[,host:port...]`: the startup nodes of a cluster,
 * the credentials (percent-decoded) those of every node; `rediss+cluster://` speaks TLS. The key
 * prefix, if any, is the cluster client's.
 */
const clusterConnection = (url: string, keyPrefix: string | undefined): Either.Either<RedisBackend.Connection, string> => {
  const scheme = CLUSTER.exec(url)!
  const tls = scheme[1]!.toLowerCase() === "rediss"
  let rest = url.slice(scheme[0].length).replace(/\/+$/, "")
  const at = rest.lastIndexOf("@")
  let username: string | undefined
  let password: string | undefined
  if (at >= 0) {
    const userinfo = rest.slice(0, at)
    rest = rest.slice(at + 1)
    const colon = userinfo.indexOf(":")
    try {
      username = decodeURIComponent(colon < 0 ? userinfo : userinfo.slice(0, colon)) || undefined
      password = colon < 0 ? undefined : decodeURIComponent(userinfo.slice(colon + 1))
    } catch {
      return Either.left("the credentials are not percent-encoded correctly")
    }
  }
  if (rest === "") return Either.left("no startup nodes")
  const nodes: Array<{ host: string; port: number }> = []
  for (const node of rest.split(",")) {
    const match = /^(\[[^\]]+\]|[^:[\]/]+)(?::(\d+))?$/.exec(node)
    const port = Number(match?.[2] ?? 6379)
    if (match === null || port < 1 || port > 65535) return Either.left(`"${node}" is not host[:port]`)
    nodes.push({ host: match[1]!.replace(/^\[|\]$/g, ""), port })
  }
  return Either.right({
    cluster: nodes,
    options: {
      ...(keyPrefix === undefined ? {} : { keyPrefix }),
      redisOptions: {
        ...(username === undefined ? {} : { username }),
        ...(password === undefined ? {} : { password }),
        ...(tls ? { tls: {} } : {})
      }
    }
  })
}

/** What a command says of the backend: its flags, or the environment's defaults. */
export interface Target {
  /** `--backend`, else `LOCKSTEP_BACKEND`. */
  readonly backend: Option.Option<string>
  /** `--prefix`, else `LOCKSTEP_PREFIX` (Redis only). */
  readonly prefix: Option.Option<string>
  /** `--accept-eviction` (Redis only). */
  readonly acceptEviction: boolean
}

/** The settings of a backend, once read from the flags and the environment. */
export interface Settings {
  readonly prefix: string | undefined
  readonly acceptEviction: boolean
}

const redisOnly = (scheme: string, settings: Settings): CliFailure | undefined => {
  const backend = scheme === "zk" ? "ZooKeeper" : "the SQL backend"
  if (settings.prefix !== undefined) {
    return usage(
      `--prefix (or LOCKSTEP_PREFIX) is a Redis key prefix; ${backend} has none: ` +
        (scheme === "zk"
          ? "give the URL a chroot instead (zk://host:2181/myapp), every node then lives under it"
          : "every lock is a row of one table (lockstep_locks); put the namespace in the key (app:KEY)")
    )
  }
  if (settings.acceptEviction) return usage(`--accept-eviction is for Redis (its maxmemory-policy); ${backend} evicts nothing`)
  return undefined
}

/** The backend layer for `url`, or the usage failure a URL no backend takes (or settings it cannot take) is. */
export const layerFor = (
  url: string,
  settings: Settings = { prefix: undefined, acceptEviction: false }
): Either.Either<Layer.Layer<LockBackend, BackendError | InvalidLockOptions | CliFailure>, CliFailure> => {
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1]?.toLowerCase()
  if (url === "memory" || scheme === "memory") {
    return Either.left(
      usage(`the memory backend cannot coordinate processes (each lockstep would lock on its own memory): use one of ${schemes}`)
    )
  }
  const tuning: RedisBackend.Tuning | undefined = settings.acceptEviction ? { acceptEviction: true } : undefined
  switch (scheme) {
    case "redis":
    case "rediss":
    case "redis+sentinel":
    case "rediss+sentinel":
      return Either.right(
        RedisBackend.layerFrom(settings.prefix === undefined ? url : { url, options: { keyPrefix: settings.prefix } }, tuning)
      )
    case "redis+cluster":
    case "rediss+cluster":
      return Either.map(
        Either.mapLeft(clusterConnection(url, settings.prefix), (problem) => usage(`invalid Redis Cluster URL: ${problem}`)),
        (connection) => RedisBackend.layerFrom(connection, tuning)
      )
    case "postgres":
    case "postgresql":
    case "mysql":
    case "mariadb":
    case "sqlite":
    case "file": {
      const refused = redisOnly(scheme, settings)
      if (refused !== undefined) return Either.left(refused)
      return Either.right(
        SqlBackend.layerConfig(Config.succeed(Redacted.make(url))).pipe(
          Layer.catchAll((error) =>
            Layer.fail(
              error._tag === "BackendError"
                ? missingDriver(error) ?? error
                : error._tag === "InvalidLockOptions"
                ? error
                : usage(`invalid backend URL: ${error.message}`)
            )
          )
        )
      )
    }
    case "zk": {
      const refused = redisOnly(scheme, settings)
      if (refused !== undefined) return Either.left(refused)
      return Either.right(ZooKeeperBackend.layerFrom(Redacted.make(url)))
    }
    default:
      return Either.left(
        usage(
          scheme === undefined
            ? `"${url}" is not a backend URL: use one of ${schemes}`
            : `unknown backend scheme "${scheme}:": use one of ${schemes}`
        )
      )
  }
}

/**
 * A driver the SQL backend could not load: one line naming the package missing. The bin has every
 * driver inlined but better-sqlite3, a native module `sqlite:` loads from beside it.
 */
const missingDriver = (error: BackendError): CliFailure | undefined => {
  if (!/^cannot load /.test(error.detail ?? "")) return undefined
  const cause = error.cause instanceof Error ? error.cause.message : String(error.cause)
  const missing = /Cannot find (?:module|package) '([^']+)'/.exec(cause)?.[1] ?? /^cannot load (\S+)/.exec(error.detail ?? "")?.[1]
  return new CliFailure({
    code: ExitCodes.unavailable,
    message: missing === "better-sqlite3"
      ? "sqlite: needs better-sqlite3, a native module lockstep does not include: install it beside lockstep " +
        "(npm install -g better-sqlite3@^12 with the prefix lockstep was installed with, or npm install better-sqlite3@^12 in the project)"
      : `${error.endpoint}: cannot load ${missing}: install it beside lockstep`
  })
}

/** The URL from `--backend`, else `LOCKSTEP_BACKEND`. */
export const urlOf = (flag: Option.Option<string>): Effect.Effect<string, CliFailure> =>
  Option.match(flag, {
    onSome: Effect.succeed,
    onNone: () =>
      Config.string("LOCKSTEP_BACKEND").pipe(
        Effect.filterOrFail((url) => url.trim() !== "", () => "empty"),
        Effect.mapError(() => usage(`no backend: pass --backend URL or set LOCKSTEP_BACKEND (${schemes})`))
      )
  })

/** A backend failure as the line and code it ends a command with. */
export const failure = (error: BackendError | InvalidLockOptions | CliFailure): CliFailure => {
  if (error._tag === "CliFailure") return error
  if (error._tag === "InvalidLockOptions") return usage(error.message)
  // a URL the backend could not mean is a usage error; anything else is the backend unreachable
  const invalid = error.operation === "connect" && /^invalid /.test(error.detail ?? "")
  return new CliFailure({ code: invalid ? ExitCodes.usage : ExitCodes.unavailable, message: error.message })
}

/** The prefix from `--prefix`, else `LOCKSTEP_PREFIX` (empty: none). */
export const prefixOf = (flag: Option.Option<string>): Effect.Effect<string | undefined> =>
  Option.match(flag, {
    onSome: (prefix) => Effect.succeed(prefix === "" ? undefined : prefix),
    onNone: () =>
      Config.string("LOCKSTEP_PREFIX").pipe(
        Effect.map((prefix) => (prefix === "" ? undefined : prefix)),
        Effect.orElseSucceed(() => undefined)
      )
  })

/** Runs `effect` on the backend `target` names; every failure becomes a `CliFailure`. */
export const provide = <A, E, R>(
  target: Target,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E | CliFailure, Exclude<R, LockBackend>> =>
  Effect.gen(function*() {
    const url = yield* urlOf(target.backend)
    const prefix = yield* prefixOf(target.prefix)
    const layer = yield* Either.match(layerFor(url, { prefix, acceptEviction: target.acceptEviction }), {
      onLeft: Effect.fail,
      onRight: Effect.succeed
    })
    return yield* Effect.provide(effect, Layer.mapError(layer, failure)).pipe(
      Effect.mapError((error) => (error instanceof CliFailure ? namespaceHint(error, prefix) : error))
    )
  })

/**
 * A Redis user whose ACL allows one key pattern refuses every key outside it: say that the
 * namespace is the prefix lockstep is given.
 */
const namespaceHint = (error: CliFailure, prefix: string | undefined): CliFailure =>
  /NOPERM .*\b(keys|channels)\b/.test(error.message)
    ? new CliFailure({
      code: error.code,
      message: `${error.message} (${
        prefix === undefined
          ? "a user whose ACL allows only a namespace (~ns:* &ns:*) needs it as the key prefix: --prefix ns: or LOCKSTEP_PREFIX"
          : `the key prefix ${JSON.stringify(prefix)} is outside the keys or channels the user may touch`
      })`
    })
    : error
