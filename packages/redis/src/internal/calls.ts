/**
 * How a backend sends its scripts: as Redis Functions (`FCALL` of the library, library.ts) where the
 * server and the user allow it, EVALSHA (and EVAL when the server does not know the script)
 * otherwise. The backend's calls and its acknowledged connection (replication.ts) share one
 * `ScriptCaller`, so both go the same way.
 *
 * The way is found by the calls themselves, with no round trip of its own: a backend starts with
 * FCALL (on ioredis-mock, whose FCALL is a stub, with EVALSHA), and
 * - `Function not found` (the library is not loaded there yet: a new server, or one restarted
 *   without persistence, `FUNCTION FLUSH`, a cluster node that joined): the library is loaded (on
 *   every master of a cluster) and the call sent again, as EVAL follows NOSCRIPT;
 * - FCALL or FUNCTION LOAD refused (a server before 7.0, a renamed or disabled command, an ACL user
 *   without `+fcall` or `+function|load`, a library the server will not load): the backend goes on
 *   with EVALSHA for good, starting with the call that met the refusal.
 */
import type { ChainableCommander } from "ioredis"
import type { Client } from "../RedisBackend.js"
import { isCluster, isReplyError } from "./descriptions.js"
import type { Script } from "./scripts/descriptor.js"
import * as library from "./scripts/library.js"

/** How one call is sent. */
export type Way = "fcall" | "evalsha" | "eval"

/** FCALL / EVALSHA / EVAL with the keys and the arguments as arrays, which ioredis flattens. */
type Call = (
  script: string,
  numKeys: number,
  keys: ReadonlyArray<string>,
  args: ReadonlyArray<string | number>
) => Promise<unknown>

/** A connection as the calls use it. */
interface Target {
  readonly fcall: Call
  readonly evalsha: Call
  readonly eval: Call
}

/** Sends of one call at most: FCALL, FCALL again after the load, EVALSHA or EVAL, EVAL. */
export const maxSteps = 4

export interface ScriptCaller {
  /** How a call goes out now: FCALL while the server takes the library, else EVALSHA. */
  readonly way: () => Way
  /** Sends `s` on `target` the `way` given; ioredis flattens the arrays one level. */
  readonly send: (target: Client, way: Way, s: Script, keys: ReadonlyArray<string>, args: ReadonlyArray<string | number>) => Promise<unknown>
  /** Queues `s` on `pipeline` the `way` given. */
  readonly queue: (
    pipeline: ChainableCommander,
    way: Way,
    s: Script,
    keys: ReadonlyArray<string>,
    args: ReadonlyArray<string | number>
  ) => void
  /**
   * After the `step`th send of a call (1: the first), `way` on `client`, failed with `error`: the way
   * to send it again, once what it needs is done (the library loaded), or undefined when the error
   * is the call's answer. A function still missing after the library was loaded (flushed again
   * meanwhile) is sent as EVAL, which needs nothing loaded.
   */
  readonly recover: (client: Client, way: Way, error: unknown, step: number) => Promise<Way> | undefined
}

const messageOf = (error: unknown): string => error instanceof Error ? error.message : ""

/** The script's SHA1 is not in the server's script cache. */
export const isNoScript = (error: unknown): boolean => messageOf(error).startsWith("NOSCRIPT")

/** FCALL of a function the server does not have. */
const isFunctionMissing = (error: unknown): boolean => messageOf(error).startsWith("ERR Function not found")

/**
 * FCALL (or FUNCTION LOAD) refused as a command: unknown (a server before 7.0, renamed or disabled)
 * or not permitted to the user. A refused key is no such refusal: it is the call's answer.
 */
const refusesCommand = (error: unknown, command: RegExp): boolean => {
  const message = messageOf(error)
  return (message.startsWith("ERR unknown command") && command.test(message)) ||
    (message.startsWith("NOPERM") && command.test(message) && !/\bkeys?\b/.test(message))
}

const FCALL = /fcall/i
const FUNCTION = /function/i

/** A library of that name exists already: the same version's code, loaded by another process. */
const isLoaded = (error: unknown): boolean => /^ERR Library '[^']+' already exists/.test(messageOf(error))

/** A `ScriptCaller` for a backend on `client` (with FCALL unless the client has none: ioredis-mock). */
export const make = (client: Client): ScriptCaller => {
  // ioredis-mock has an `fcall` that throws, and no `call` (which the load needs)
  let functions = typeof (client as unknown as Partial<Target>).fcall === "function" &&
    typeof (client as { readonly call?: unknown }).call === "function"
  /** Per connection, the load in flight: calls that found no function at once share it. */
  const loading = new WeakMap<Client, Promise<Way>>()

  const loadOn = (target: Client): Promise<unknown> => {
    const nodes = isCluster(target) ? target.nodes("master") : [target]
    return Promise.all(nodes.map((node) =>
      node.call("FUNCTION", "LOAD", library.source).catch((error: unknown) =>
        isLoaded(error) ? undefined : Promise.reject(error)
      )
    ))
  }

  const load = (target: Client): Promise<Way> => {
    const inFlight = loading.get(target)
    if (inFlight !== undefined) return inFlight
    const loaded = loadOn(target).then(
      (): Way => "fcall",
      (error: unknown): Way => {
        // the server answered: it does not take the library from this user (or at all)
        if (isReplyError(error) || refusesCommand(error, FUNCTION)) {
          functions = false
          return "evalsha"
        }
        throw error
      }
    ).finally(() => loading.delete(target))
    loading.set(target, loaded)
    return loaded
  }

  return {
    way: () => functions ? "fcall" : "evalsha",
    send: (client, way, s, keys, args) => {
      const target = client as unknown as Target
      return way === "fcall"
        ? target.fcall(library.functionOf(s), keys.length, keys, args)
        : way === "evalsha"
        ? target.evalsha(s.sha, keys.length, keys, args)
        : target.eval(s.lua, keys.length, keys, args)
    },
    queue: (pipeline, way, s, keys, args) => {
      if (way === "fcall") pipeline.fcall(library.functionOf(s), keys.length, ...keys, ...args)
      else if (way === "evalsha") pipeline.evalsha(s.sha, keys.length, ...keys, ...args)
      else pipeline.eval(s.lua, keys.length, ...keys, ...args)
    },
    recover: (target, way, error, step) => {
      if (way === "evalsha") return isNoScript(error) ? Promise.resolve<Way>("eval") : undefined
      if (way !== "fcall") return undefined
      if (isFunctionMissing(error)) return step === 1 ? load(target) : Promise.resolve<Way>("eval")
      if (refusesCommand(error, FCALL)) {
        functions = false
        return Promise.resolve<Way>("evalsha")
      }
      return undefined
    }
  }
}
