/**
 * Replica acknowledgement (the `replication` tuning): the scripts that make or keep a hold (grants,
 * renewals, fence raises, latch changes) run on a connection of their duplicated, each followed by a
 * `WAIT` (or `WAITAOF`) written right after it, without waiting for the script's reply.
 *
 * `WAIT` blocks the connection it runs on until the replicas have acknowledged every write that
 * connection made before it, or the timeout passes: hence a connection of their own (reads,
 * releases and the other calls stay on the commands connection, never stuck behind a `WAIT`), and
 * acknowledgements are grouped: at most one `WAIT` is in flight on it, and it covers every script
 * written before it; scripts written meanwhile share the next one, sent when that one answers.
 * With replicas missing, a call then waits for at most the `WAIT` in flight and its duplicated, about
 * twice the timeout, however many calls are queued (plus, per `WAIT`, up to the server's timer
 * period 1/hz, which is when it notices a timeout: 100 ms at the default hz 10).
 *
 * On a Redis Cluster the `WAIT` has to reach the node that ran the script: each script goes out in
 * a pipeline of its own with its `WAIT` ([script, WAIT]), routed by the key's slot. Calls to one
 * node queue behind each other's `WAIT`s there (with that node's replicas missing, the k-th call
 * queued waits about k timeouts, up to the command timeout).
 *
 * A reply that needs no acknowledgement (a denied attempt, say) settles as soon as it arrives;
 * but a script sent while a `WAIT` is in flight runs only after it, whatever its reply.
 *
 * Nothing is re-sent on these connections after a reconnect (a `WAIT` re-sent on a new connection
 * would cover that connection's writes only): a call in flight when its connection closes fails
 * with BackendError (on a single server at once; on a cluster, whose node connections drop such
 * commands silently, at the command timeout), and the caller's usual clean-up (the release of an
 * attempt that failed) applies.
 */
import type { Scope } from "effect"
import { Data, Duration, Effect, Either } from "effect"
import type { Cluster, Redis } from "ioredis"
import { InvalidLockOptions } from "@lockstep/core/LockError"
import type { Client, Tuning } from "../RedisBackend.js"
import type { ScriptCaller, Way } from "./calls.js"
import { maxSteps } from "./calls.js"
import { commandTimeout, duplicateOf, keepOpen } from "./clients.js"
import { isCluster } from "./descriptions.js"
import type { Script } from "./scripts/descriptor.js"

/** What an acknowledgement confirms: a grant, a renewal, a fence raise or a latch change. */
export type Confirmed = "grant" | "renewal" | "fence raise" | "latch change"

/**
 * The replicas did not acknowledge a write in time: fewer than `required` confirmed it (with `aof`:
 * wrote it to their append-only file) within `timeout`. It is the `cause` of the `BackendError` the
 * operation fails with (for a renewal: of that lease's `Left` in the renew results).
 */
export class ReplicationNotAcknowledged extends Data.TaggedError("ReplicationNotAcknowledged")<{
  /** What was not confirmed. */
  readonly operation: Confirmed
  /** How many replicas had to confirm it (`replication.replicas`). */
  readonly required: number
  /** How many did. */
  readonly acknowledged: number
  /** How long the server waited for them (`replication.timeout`). */
  readonly timeout: Duration.Duration
  /** Whether the replicas had to write it to their append-only file (`WAITAOF`), not only receive it. */
  readonly aof: boolean
}> {
  override get message(): string {
    const did = this.aof ? "wrote" : "acknowledged"
    const where = this.aof ? " to their append-only file" : ""
    return `${this.acknowledged} of ${this.required} replicas ${did} the ${this.operation}${where} within ${
      Duration.format(this.timeout)
    }`
  }
}

/** The `replication` tuning, checked. */
export interface Settings {
  readonly replicas: number
  readonly timeout: Duration.Duration
  /** `timeout` in whole milliseconds, as `WAIT` takes it. */
  readonly timeoutMs: number
  readonly aof: boolean
}

/** The default `replication.timeout`: 250 ms, or a quarter of the command timeout where that is shorter. */
export const defaultTimeout = (command: Duration.Duration): Duration.Duration =>
  Duration.min(Duration.millis(250), Duration.unsafeDivide(command, 4))

const invalid = (field: string, reason: string) => Either.left(new InvalidLockOptions({ field, reason }))

/**
 * The `replication` tuning of `tuning` (undefined: off, or left to the default), or
 * InvalidLockOptions naming what is wrong with it.
 */
export const settingsOf = (tuning: Tuning | undefined): Either.Either<Settings | undefined, InvalidLockOptions> => {
  const replication = tuning?.replication
  if (replication === undefined || replication === false) return Either.right(undefined)
  const { aof, replicas } = replication
  if (typeof replicas !== "number" || !Number.isInteger(replicas) || replicas < 1) {
    return invalid("replication.replicas", `must be a positive integer, got ${String(replicas)}`)
  }
  if (aof !== undefined && typeof aof !== "boolean") return invalid("replication.aof", "must be a boolean")
  const command = commandTimeout(tuning)
  let timeout: Duration.Duration
  try {
    timeout = replication.timeout === undefined ? defaultTimeout(command) : Duration.decode(replication.timeout)
  } catch (error) {
    return invalid("replication.timeout", `not a duration: ${error instanceof Error ? error.message : String(error)}`)
  }
  const ms = Duration.toMillis(timeout)
  if (!Number.isFinite(ms) || ms <= 0) {
    return invalid("replication.timeout", `must be a positive, finite duration, got ${Duration.format(timeout)}`)
  }
  const timeoutMs = Math.ceil(ms)
  // a call may wait for the WAIT in flight and then for its own: both must fit in the command
  // timeout, or missing replicas would show as timed-out calls instead of ReplicationNotAcknowledged
  if (2 * timeoutMs >= Duration.toMillis(command)) {
    return invalid(
      "replication.timeout",
      `${Duration.format(timeout)} must be less than half the command timeout (${Duration.format(command)})`
    )
  }
  return Either.right({ replicas, timeout: Duration.millis(timeoutMs), timeoutMs, aof: aof === true })
}

/**
 * The default acknowledgement (no `replication` given, on a replicated deployment): by every
 * replica the master has had (`replicas()`: the replicas, by address, it has listed since this
 * backend first read it, or since a restart or failover replaced it), within the default timeout.
 * A replica that drops off, cut off or restarting, is still waited for: grants fail and renewals
 * are not confirmed meanwhile. Counting only the connected ones would let a grant go unreplicated
 * exactly when a stale replica may be promoted.
 */
export const defaultSettings = (tuning: Tuning | undefined, replicas: () => number): Settings => {
  const timeout = defaultTimeout(commandTimeout(tuning))
  return {
    get replicas() {
      return replicas()
    },
    timeout,
    timeoutMs: Math.ceil(Duration.toMillis(timeout)),
    aof: false
  }
}

/** The replies to one script sent with an acknowledgement. */
export interface Outcome {
  readonly reply: unknown
  /** How many replicas acknowledged it; undefined when the reply did not need it. */
  readonly acknowledged: number | undefined
}

/** The connection that carries the scripts that need acknowledging, and their `WAIT`s. */
export interface Acknowledged {
  /**
   * Runs `script` (as the backend's other calls do: FCALL or EVALSHA, see calls.ts) followed by a
   * `WAIT`, and settles with its reply
   * and, when `needs(reply)`, the replicas that acknowledged it. A reply that needs none (a denied
   * attempt, say) settles as soon as it arrives.
   */
  readonly run: (
    script: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>,
    needs: (reply: unknown) => boolean
  ) => Promise<Outcome>
}

/** `WAIT` answers a count; `WAITAOF 0 n t` answers [local, replicas]. */
const countOf = (reply: unknown): number => Number(Array.isArray(reply) ? reply[1] : reply)

const waitCommand = (settings: Settings): [string, ...Array<number>] =>
  settings.aof
    ? ["WAITAOF", 0, settings.replicas, settings.timeoutMs]
    : ["WAIT", settings.replicas, settings.timeoutMs]

const asError = (error: unknown): Error => error instanceof Error ? error : new Error(String(error))

/**
 * The connections of their own these calls use (see `duplicateOf`): nothing re-sent after a
 * reconnect, and nothing kept in the offline queue past a failed connection attempt
 * (`maxRetriesPerRequest` 0): a grant whose call failed is released on the commands connection,
 * and must not go out after that release.
 */
const duplicate = (client: Client): Client =>
  duplicateOf(client, { autoResendUnfulfilledCommands: false, maxRetriesPerRequest: 0 })

/** One write waiting for its acknowledgement: the order it went out in, and what to do with the `WAIT`'s answer. */
interface Ticket {
  readonly seq: number
  /** `lost`: the connection closed, so the script's reply will never come either. */
  readonly settle: (outcome: number | Error, lost: boolean) => void
}

/** On a single server: grouped `WAIT`s, at most one in flight. */
const onServer = (client: Redis, settings: Settings, caller: ScriptCaller): Acknowledged => {
  /** Scripts written so far. */
  let written = 0
  let waiting = false
  /** Bumped when the connection closes: a `WAIT` sent before answers for nothing after it. */
  let generation = 0
  /** Written, in order, and not yet covered by an answered `WAIT`. */
  let pending: Array<Ticket> = []

  /** Sends a `WAIT` for what is pending, unless one is in flight (it sends the next when it answers). */
  const ask = () => {
    if (waiting || pending.length === 0) return
    waiting = true
    const covers = written
    const asked = generation
    const answered = (outcome: number | Error) => {
      if (asked !== generation) return
      waiting = false
      let i = 0
      while (i < pending.length && pending[i]!.seq <= covers) i++
      const covered = pending.slice(0, i)
      pending = pending.slice(i)
      for (const ticket of covered) ticket.settle(outcome, false)
      ask()
    }
    // asked for as many replicas as are required now (the default follows the master's replicas)
    client.call(...waitCommand(settings)).then(
      (reply) => answered(countOf(reply)),
      (error: unknown) => answered(asError(error))
    )
  }

  client.on("close", () => {
    generation++
    waiting = false
    const lost = pending
    pending = []
    const error = new Error("the connection closed before the replicas acknowledged")
    for (const ticket of lost) ticket.settle(error, true)
  })

  const run = (
    script: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>,
    needs: (reply: unknown) => boolean
  ) =>
    new Promise<Outcome>((resolve, reject) => {
      const attempt = (way: Way, step: number) => {
        let reply: { readonly value: unknown } | undefined
        let acknowledged: number | Error | undefined
        const finish = (value: unknown, outcome: number | Error) =>
          typeof outcome === "number" ? resolve({ reply: value, acknowledged: outcome }) : reject(outcome)
        pending.push({
          seq: ++written,
          settle: (outcome, lost) => {
            acknowledged = outcome
            if (reply !== undefined) {
              if (needs(reply.value)) finish(reply.value, outcome)
            } else if (lost) {
              reject(outcome)
            }
          }
        })
        const sent = caller.send(client, way, script, keys, args)
        // right behind the script, on the same connection (or with the next group)
        ask()
        sent.then(
          (value: unknown) => {
            reply = { value }
            if (!needs(value)) resolve({ reply: value, acknowledged: undefined })
            else if (acknowledged !== undefined) finish(value, acknowledged)
          },
          (error: unknown) => {
            // the library or the script missing (or FCALL refused): sent again once recovered, as
            // a new write, covered by a later WAIT
            const next = step < maxSteps ? caller.recover(client, way, error, step) : undefined
            if (next === undefined) reject(error)
            else next.then((again) => attempt(again, step + 1), reject)
          }
        )
      }
      attempt(caller.way(), 1)
    })

  return { run }
}

const isRedirection = (error: unknown) => error instanceof Error && /^(MOVED|ASK) /.test(error.message)

/** On a Redis Cluster: a pipeline [script, WAIT] per call, routed by the key's slot. */
const onCluster = (cluster: Cluster, settings: Settings, caller: ScriptCaller): Acknowledged => {
  const refreshed = () =>
    new Promise<void>((resolve) => {
      cluster.refreshSlotsCache(() => resolve())
    })

  const run = async (
    script: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>,
    needs: (reply: unknown) => boolean
  ): Promise<Outcome> => {
    let way = caller.way()
    let step = 1
    let redirected = false
    for (;;) {
      const pipeline = cluster.pipeline()
      caller.queue(pipeline, way, script, keys, args)
      pipeline.call(...waitCommand(settings))
      const results = (await pipeline.exec()) ?? []
      const [scriptError, reply] = results[0] ?? [new Error("no reply to the script"), undefined]
      if (scriptError !== null && scriptError !== undefined) {
        // the library or the script missing on that node (or FCALL refused): once recovered, again
        const next = step < maxSteps ? caller.recover(cluster, way, scriptError, step) : undefined
        if (next !== undefined) {
          way = await next
          step++
          continue
        }
        // a redirection fails the whole pipeline (the WAIT ran elsewhere): once, on the new slot map
        if (!redirected && isRedirection(scriptError)) {
          redirected = true
          await refreshed()
          continue
        }
        throw scriptError
      }
      if (!needs(reply)) return { reply, acknowledged: undefined }
      const [waitError, waitReply] = results[1] ?? [new Error("no reply to WAIT"), undefined]
      if (waitError !== null && waitError !== undefined) throw waitError
      return { reply, acknowledged: countOf(waitReply) }
    }
  }
  return { run }
}

/**
 * The acknowledged connection of a backend on `client`: a duplicate, connected on its first call,
 * closed with the scope. `watch` follows its errors as the backend follows its other connections.
 */
export const make = (
  client: Client,
  settings: Settings,
  caller: ScriptCaller,
  watch: (client: Client) => Effect.Effect<void, never, Scope.Scope>
): Effect.Effect<Acknowledged, never, Scope.Scope> =>
  Effect.gen(function*() {
    const duplicated = duplicate(client)
    // our own connection: it never prints "Unhandled error event", even after the watch ends
    duplicated.on("error", () => undefined)
    yield* watch(duplicated)
    const close = keepOpen(duplicated)
    yield* Effect.addFinalizer(() => Effect.sync(close))
    return isCluster(duplicated) ? onCluster(duplicated, settings, caller) : onServer(duplicated as Redis, settings, caller)
  })

/**
 * Whether the server has `WAITAOF` (Redis 7.2 and later): `COMMAND INFO WAITAOF` names it, or
 * answers nil for a command it does not know.
 */
export const hasWaitAof = (client: Client): Promise<boolean> =>
  client.call("COMMAND", "INFO", "WAITAOF").then((reply) =>
    Array.isArray(reply) && reply.length > 0 && reply[0] !== null && reply[0] !== undefined
  )
