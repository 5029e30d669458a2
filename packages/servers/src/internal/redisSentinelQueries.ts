/**
 * Asking the processes of a `RedisSentinel` topology: one command on a fresh connection (plain or
 * TLS), `INFO` and `ROLE` read, and polling until a check passes, with the last log lines of the
 * processes whose view matters when it does not.
 *
 * @since 0.1.0
 * @internal
 */
import { Duration, Effect, Either, Option } from "effect"
import type { RedisServer } from "../RedisServer.js"
import type { Role } from "../RedisSentinel.js"
import type { Reply, TlsClient } from "./redisServer.js"
import { call as callWithin, RedisServerError } from "./redisServer.js"
import { HOST } from "./serverProcess.js"

const CALL_TIMEOUT = Duration.millis(1_000)
/** `CONFIG REWRITE` writes a file: more than a plain command's time. */
export const REWRITE_TIMEOUT = Duration.seconds(3)
export const DEFAULT_WAIT_TIMEOUT = Duration.seconds(20)
const POLL_INTERVAL = Duration.millis(50)
const LOG_LINES = 12

export const decode = (input: Duration.DurationInput | undefined, fallback: Duration.Duration): Duration.Duration =>
  input === undefined ? fallback : Duration.decode(input)

/** How the topology's processes are reached: in plain text, or over TLS trusting their CA. */
export type Call = (
  port: number,
  args: ReadonlyArray<string>,
  timeout?: Duration.Duration
) => Effect.Effect<Reply, RedisServerError>

/** One command on a fresh connection to `port` (TLS with `secure`), within `timeout`. */
export const callOver = (secure: TlsClient | undefined): Call => (port, args, timeout = CALL_TIMEOUT) =>
  callWithin(port, args, timeout, secure)

const text = (reply: Reply): string => (typeof reply === "string" ? reply : "")

/** `INFO <section>` as a field map. */
export const info = (
  call: Call,
  port: number,
  section: string
): Effect.Effect<ReadonlyMap<string, string>, RedisServerError> =>
  Effect.map(call(port, ["INFO", section]), (reply) => {
    const fields = new Map<string, string>()
    for (const line of text(reply).split(/\r?\n/)) {
      const colon = line.indexOf(":")
      if (colon > 0) fields.set(line.slice(0, colon), line.slice(colon + 1).trim())
    }
    return fields
  })

/** A flat `[field, value, field, value, ...]` array (as `SENTINEL MASTER`) as a map. */
export const fieldsOf = (reply: Reply): ReadonlyMap<string, string> => {
  const fields = new Map<string, string>()
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) fields.set(String(reply[i]), String(reply[i + 1]))
  }
  return fields
}

/** What `ROLE` on `port` answers. */
export const roleOf = (call: Call, port: number): Effect.Effect<Role | "sentinel", RedisServerError> =>
  Effect.flatMap(call(port, ["ROLE"]), (reply) => {
    const first = Array.isArray(reply) ? reply[0] : undefined
    switch (first) {
      case "master":
        return Effect.succeed("master" as const)
      case "slave":
        return Effect.succeed("replica" as const)
      case "sentinel":
        return Effect.succeed("sentinel" as const)
      default:
        return Effect.fail(
          new RedisServerError({ message: `ROLE on ${HOST}:${port} answered ${JSON.stringify(reply)}` })
        )
    }
  })

// ---------------------------------------------------------------------------------------------
// polling
// ---------------------------------------------------------------------------------------------

/** Right: done; Left: why not yet (the last reason ends up in the timeout error). */
export type Check<A> = Effect.Effect<Either.Either<A, string>, RedisServerError>

/** A process whose last log lines a timeout reports; `only`: just the lines that match. */
export interface Logged {
  readonly label: string
  readonly server: RedisServer
  readonly only?: RegExp
}

/** Data nodes (or sentinels) as `Logged`, under their names. */
export const logged = (
  servers: ReadonlyArray<{ readonly name: string; readonly server: RedisServer }>
): ReadonlyArray<Logged> => servers.map(({ name, server }) => ({ label: name, server }))

const tail = (log: string, lines: number, only: RegExp | undefined): string =>
  log.trimEnd().split("\n").filter((line) => only === undefined || only.test(line)).slice(-lines).join("\n")

/** A sentinel's warning-level lines (` # `): down and up calls, votes, failover steps, switches. */
export const SENTINEL_EVENTS = / # /

/**
 * Repeats `check` until it succeeds; after `timeout`, fails with `what`, the last reason, and the
 * last log lines of `logged` (the processes whose view matters).
 */
export const poll = <A>(
  what: string,
  timeout: Duration.Duration,
  check: Check<A>,
  logged: ReadonlyArray<Logged> = []
): Effect.Effect<A, RedisServerError> =>
  Effect.suspend(() => {
    let last = "no answer yet"
    const loop = (): Effect.Effect<A> =>
      Effect.flatMap(
        check.pipe(Effect.catchAll((error) => Effect.succeed<Either.Either<A, string>>(Either.left(error.message)))),
        Either.match({
          onLeft: (reason) =>
            Effect.zipRight(Effect.sync(() => (last = reason)), Effect.delay(Effect.suspend(loop), POLL_INTERVAL)),
          onRight: Effect.succeed
        })
      )
    return loop().pipe(
      Effect.timeoutOption(timeout),
      Effect.flatMap(Option.match({
        onSome: Effect.succeed,
        onNone: () =>
          Effect.flatMap(
            Effect.forEach(logged, ({ label, only, server }) =>
              Effect.map(server.logs, (log) => {
                const lines = tail(log, LOG_LINES, only)
                return lines === "" ? "" : `\n--- ${label} (port ${server.port}), last lines:\n${lines}`
              })),
            (logs) =>
              Effect.fail(
                new RedisServerError({ message: `${what} within ${Duration.format(timeout)}: ${last}${logs.join("")}` })
              )
          )
      }))
    )
  })

/** `value` if it is an integer of at least `min`, else a failure naming `what`. */
export const integerAtLeast = (value: number, what: string, min: number): Effect.Effect<number, RedisServerError> =>
  Number.isInteger(value) && value >= min
    ? Effect.succeed(value)
    : Effect.fail(new RedisServerError({ message: `${what} must be an integer >= ${min}, got ${value}` }))
