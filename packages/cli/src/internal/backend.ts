/**
 * The backend a command locks on, from a URL (`--backend` or `LOCKSTEP_BACKEND`): every scheme the
 * Redis, SQL and ZooKeeper backends take, plus `redis+cluster://` for a Redis Cluster. The URL is checked
 * before anything connects; a failure to connect is one line naming the endpoint.
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
 * the credentials (percent-decoded) those of every node; `rediss+cluster://` speaks TLS.
 */
const clusterConnection = (url: string): Either.Either<RedisBackend.Connection, string> => {
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
      redisOptions: {
        ...(username === undefined ? {} : { username }),
        ...(password === undefined ? {} : { password }),
        ...(tls ? { tls: {} } : {})
      }
    }
  })
}

/** The backend layer for `url`, or the usage failure a URL no backend takes is. */
export const layerFor = (
  url: string
): Either.Either<Layer.Layer<LockBackend, BackendError | InvalidLockOptions | CliFailure>, CliFailure> => {
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url)?.[1]?.toLowerCase()
  if (url === "memory" || scheme === "memory") {
    return Either.left(
      usage(`the memory backend cannot coordinate processes (each lockstep would lock on its own memory): use one of ${schemes}`)
    )
  }
  switch (scheme) {
    case "redis":
    case "rediss":
    case "redis+sentinel":
    case "rediss+sentinel":
      return Either.right(RedisBackend.layerFrom(url))
    case "redis+cluster":
    case "rediss+cluster":
      return Either.map(
        Either.mapLeft(clusterConnection(url), (problem) => usage(`invalid Redis Cluster URL: ${problem}`)),
        (connection) => RedisBackend.layerFrom(connection)
      )
    case "postgres":
    case "postgresql":
    case "mysql":
    case "mariadb":
    case "sqlite":
    case "file":
      return Either.right(
        SqlBackend.layerConfig(Config.succeed(Redacted.make(url))).pipe(
          Layer.catchAll((error) =>
            Layer.fail(
              error._tag === "BackendError" || error._tag === "InvalidLockOptions"
                ? error
                : usage(`invalid backend URL: ${error.message}`)
            )
          )
        )
      )
    case "zk":
      return Either.right(ZooKeeperBackend.layerFrom(Redacted.make(url)))
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

/** Runs `effect` on the backend named by `flag` / `LOCKSTEP_BACKEND`; every failure becomes a `CliFailure`. */
export const provide = <A, E, R>(
  flag: Option.Option<string>,
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E | CliFailure, Exclude<R, LockBackend>> =>
  Effect.gen(function*() {
    const url = yield* urlOf(flag)
    const layer = yield* Either.match(layerFor(url), { onLeft: Effect.fail, onRight: Effect.succeed })
    return yield* Effect.provide(effect, Layer.mapError(layer, failure))
  })
