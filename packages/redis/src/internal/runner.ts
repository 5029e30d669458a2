/**
 * How the Redis backend runs its scripts: each call through the tracker (its deadline, its
 * errors), sent the way calls.ts finds (FCALL or EVALSHA) and sent again once that way recovered,
 * and, with replica acknowledgement, on a connection of its own with a `WAIT` behind it
 * (replication.ts). `openRunner` also settles what decides that at build: the replication
 * settings, the eviction guard (eviction.ts) and the commands the server must take.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import type { Redis } from "ioredis"
import { type BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import type { Client, Tuning } from "../RedisBackend.js"
import { unlessConnectionFails } from "./clients.js"
import { probeCommands } from "./commands.js"
import { viaSentinels } from "./descriptions.js"
import * as calls from "./calls.js"
import type { ClientTracker } from "./tracker.js"
import * as eviction from "./eviction.js"
import * as replication from "./replication.js"
import type { Script } from "./scripts/descriptor.js"
import * as library from "./scripts/library.js"

/** Where a backend's scripts go: one server (or a master the sentinels manage) or a cluster. */
export interface Target {
  readonly client: Client
  readonly isCluster: boolean
  /** The client reaches its master through sentinels. */
  readonly sentinels: boolean
  /** The client's ioredis `keyPrefix` (see `namespaceOf`). */
  readonly namespace: string
  /** The cluster slot of a lock's keys, as the server names them (in the namespace). */
  readonly slotOf: (key: string) => number
}

/**
 * The namespace of `client`: its ioredis `keyPrefix`, which ioredis puts before the KEYS of every
 * script (and the keys of every other command) but not before channel names. The backend puts it
 * before the channels it subscribes to and the names it builds for the scripts (a latch's
 * channel, a forced release's ended keys), so that every key and channel a lock touches starts
 * with it ("": none).
 */
const namespaceOf = (client: Client): string => {
  const prefix: unknown = client.options.keyPrefix
  return typeof prefix === "string" ? prefix : ""
}

/** The `Target` of a backend on `client`. */
export const targetOf = (client: Client, slotOfKey: (key: string) => number): Target => {
  const isCluster = "isCluster" in client && client.isCluster === true
  const namespace = namespaceOf(client)
  return {
    client,
    isCluster,
    sentinels: !isCluster && viaSentinels((client as Redis).options),
    namespace,
    slotOf: namespace === "" ? slotOfKey : (key: string) => slotOfKey(namespace + key)
  }
}

/**
 * Redis's refusal of a command a script calls, or of a key it names, which says the script's line
 * but not the command: the line of the EVAL script (`@user_script`), or of the library a
 * function belongs to (`@user_function`).
 */
const scriptRefused = /can't (run this command or subcommand|access at least one of the keys).*@user_(script|function):(\d+)/

/**
 * `error` as the reply to script `s`: when the ACL user may not run a command the script calls (or
 * access a key it names), an error that names that command (Redis names only the script's line);
 * otherwise `error`.
 */
export const permissionError = (s: Script, error: unknown): unknown => {
  const refused = error instanceof Error ? scriptRefused.exec(error.message) : null
  if (refused === null) return error
  const lines = refused[2] === "function" ? library.lines : s.lua.split("\n")
  const source = lines[Number(refused[3]) - 1] ?? ""
  const command = /(?:redis\.call|redis\.pcall|chunked)\('([A-Z]+)'/.exec(source)?.[1]
  const what = command === undefined ? "a command" : `the ${command} command`
  const denied = refused[1]!.startsWith("run") ? `run ${what}` : `access a key that ${what} names`
  return new Error(
    `NOPERM this user has no permissions to ${denied}, in the ${s.name} script (${(error as Error).message})`,
    { cause: error }
  )
}

/**
 * `error` as the reply to a script: a full server's refusal (`OOM ...`, maxmemory reached with
 * `noeviction`) says what it means for locks; any other error is `permissionError`'s.
 */
const refusal = (s: Script, error: unknown): unknown =>
  error instanceof Error && error.message.startsWith("OOM ")
    ? new Error(
      "the server is out of memory (used memory above its maxmemory, with maxmemory-policy noeviction): " +
        `it refuses new grants until memory is freed, and still renews and releases held locks (${error.message})`,
      { cause: error }
    )
    : permissionError(s, error)

/** The script calls of one backend. */
export interface ScriptRunner {
  /**
   * One script call (see calls.ts). Settles with the reply, or fails with BackendError (naming
   * the endpoint and the connection's trouble) once the command timeout passes: see
   * `ClientTracker.call`.
   */
  readonly run: (s: Script, keys: ReadonlyArray<string>, args: ReadonlyArray<string | number>) => Effect.Effect<unknown, BackendError>
  /**
   * A script whose writes must reach the replicas before its caller relies on them: with
   * `replication`, on the acknowledged connection with a WAIT behind it (see replication.ts);
   * `needs(reply)` says whether this reply wrote something to confirm. Settles with the reply and
   * the replicas that acknowledged it (undefined: not asked).
   */
  readonly runConfirmed: (
    s: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>,
    needs: (reply: unknown) => boolean
  ) => Effect.Effect<replication.Outcome, BackendError>
  /**
   * `run`, and with `replication` the reply only once the replicas acknowledged its writes (a
   * `what`), or BackendError (operation: the script's name) caused by ReplicationNotAcknowledged.
   */
  readonly runAcknowledged: (
    s: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>,
    what: replication.Confirmed,
    needs: (reply: unknown) => boolean
  ) => Effect.Effect<unknown, BackendError>
  /** The error for `outcome`'s writes (a `what`) if too few replicas acknowledged them. */
  readonly unconfirmed: (operation: string, what: replication.Confirmed, outcome: replication.Outcome) => BackendError | undefined
  /** Whether the replicas acknowledge grants (`replication`, given or by default). */
  readonly acknowledged: boolean
  /** Refuses grants on a server that may evict lock keys (eviction.ts). */
  readonly evictionGuard: eviction.EvictionGuard
}

/** What `openRunner` settles at build: the eviction guard, and the replica acknowledgement if any. */
interface Guards {
  readonly evictionGuard: eviction.EvictionGuard
  readonly replicated: replication.Settings | undefined
  readonly acknowledged: replication.Acknowledged | undefined
}

/**
 * The eviction guard and the replica acknowledgement of a backend on `target`: the `replication`
 * tuning is checked before anything is opened (a mistake in it fails the build as a bad URL fails
 * `layerFrom`, with BackendError "connect"); a server that may evict lock keys is refused unless
 * the user accepted it; the commands the backend needs are asked for where `layerFrom`'s first
 * round trip did not.
 */
const openGuards = (
  target: Target,
  tuning: Tuning | undefined,
  tracker: ClientTracker,
  reachable: boolean,
  caller: calls.ScriptCaller
): Effect.Effect<Guards, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const { client, isCluster, sentinels } = target
    const chosen = yield* Effect.mapError(
      replication.settingsOf(tuning),
      (invalid) => tracker.fail("connect", invalid)
    )
    const evictionGuard = yield* eviction.make(client, tracker, { accept: tuning?.acceptEviction === true, reachable })
    // by default, grants are acknowledged by every replica of a replicated master: one the
    // sentinels manage, or one that had replicas when the backend was built (not a cluster's)
    const replicated = chosen !== undefined || tuning?.replication === false || isCluster ||
        !(sentinels || evictionGuard.replicas() > 0)
      ? chosen
      : replication.defaultSettings(tuning, evictionGuard.replicas)
    // layerFrom asked for the commands it needs in its first round trip (tracker.ping), WAIT only
    // with `replication` given; a borrowed client, or acknowledgement on by default, is asked here
    if (!reachable || (replicated !== undefined && chosen === undefined)) {
      const probe = probeCommands(client, tracker, { replication: replicated !== undefined, reachable })
      yield* reachable ? probe : unlessConnectionFails(client, probe)
    }
    if (replicated?.aof === true) {
      const known = yield* tracker.call("connect", () => replication.hasWaitAof(client))
      if (!known) {
        return yield* Effect.fail(tracker.fail(
          "connect",
          new InvalidLockOptions({
            field: "replication.aof",
            reason: "the server has no WAITAOF (Redis 7.2 or later): use replication without aof, or upgrade the server"
          })
        ))
      }
    }
    const acknowledged = replicated === undefined
      ? undefined
      : yield* replication.make(client, replicated, caller, (c) => tracker.watch(c, "acknowledged"))
    return { evictionGuard, replicated, acknowledged }
  })

/** The script calls of a backend on `target`, with the guards it opened. */
const runnerOf = (target: Target, tracker: ClientTracker, caller: calls.ScriptCaller, guards: Guards): ScriptRunner => {
  const { client, isCluster, slotOf } = target
  const { acknowledged, replicated } = guards

  /**
   * What answers a call of `s` sent `way` that failed with `error`: the call sent again once
   * `caller` recovered (the library loaded, EVAL after NOSCRIPT, EVALSHA where FCALL is
   * refused), a clearer refusal, or undefined (the error stands).
   */
  const retry = (
    s: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>,
    way: calls.Way,
    error: unknown,
    step: number
  ): Promise<unknown> | undefined => {
    const next = step < calls.maxSteps ? caller.recover(client, way, error, step) : undefined
    if (next === undefined) {
      const refused = refusal(s, error)
      return refused === error ? undefined : Promise.reject(refused)
    }
    return next.then((again) =>
      caller.send(client, again, s, keys, args).catch((cause: unknown) =>
        retry(s, keys, args, again, cause, step + 1) ?? Promise.reject(cause)
      )
    )
  }

  const run: ScriptRunner["run"] = (s, keys, args) => {
    const way = caller.way()
    return tracker.call(
      s.name,
      () => caller.send(client, way, s, keys, args),
      "commands",
      isCluster ? slotOf(keys[0]!) : undefined,
      (error) => retry(s, keys, args, way, error, 1)
    )
  }

  const runConfirmed: ScriptRunner["runConfirmed"] = (s, keys, args, needs) =>
    acknowledged === undefined
      ? Effect.map(run(s, keys, args), (reply) => ({ reply, acknowledged: undefined }))
      : tracker.call(
        s.name,
        () => acknowledged.run(s, keys, args, needs),
        // a connection of its own: its health is not the commands connection's
        "acknowledged",
        isCluster ? slotOf(keys[0]!) : undefined,
        (error) => {
          const refused = refusal(s, error)
          return refused === error ? undefined : Promise.reject(refused)
        }
      )

  const unconfirmed: ScriptRunner["unconfirmed"] = (operation, what, outcome) =>
    replicated === undefined || outcome.acknowledged === undefined || outcome.acknowledged >= replicated.replicas
      ? undefined
      : tracker.fail(
        operation,
        new replication.ReplicationNotAcknowledged({
          operation: what,
          required: replicated.replicas,
          acknowledged: outcome.acknowledged,
          timeout: replicated.timeout,
          aof: replicated.aof
        })
      )

  const runAcknowledged: ScriptRunner["runAcknowledged"] = (s, keys, args, what, needs) =>
    acknowledged === undefined
      ? run(s, keys, args)
      : Effect.flatMap(runConfirmed(s, keys, args, needs), (outcome) => {
        const error = unconfirmed(s.name, what, outcome)
        return error === undefined ? Effect.succeed(outcome.reply) : Effect.fail(error)
      })

  return {
    run,
    runConfirmed,
    runAcknowledged,
    unconfirmed,
    acknowledged: acknowledged !== undefined,
    evictionGuard: guards.evictionGuard
  }
}

/**
 * The script calls of a backend on `target`, which `tracker` follows. Fails (BackendError
 * "connect") on a `replication` it cannot honour, or a server it must refuse (see `openGuards`).
 */
export const openRunner = (
  target: Target,
  tuning: Tuning | undefined,
  tracker: ClientTracker,
  reachable: boolean
): Effect.Effect<ScriptRunner, BackendError, Scope.Scope> => {
  /** How scripts go out (FCALL or EVALSHA), for this backend's calls and its acknowledged ones. */
  const caller = calls.make(target.client)
  return Effect.map(openGuards(target, tuning, tracker, reachable, caller), (guards) => runnerOf(target, tracker, caller, guards))
}
