/**
 * The commands a Redis backend needs, checked when it is built. Managed Redis services rename or
 * disable commands (`rename-command X ""`): CONFIG, DEBUG, SCRIPT, CLIENT, FUNCTION, KEYS, ...,
 * none of which lockstep sends. A command it does need that the server refuses would otherwise
 * show only at its first use (EVALSHA at the first acquisition, SUBSCRIBE at the first waiter,
 * WAIT at the first acknowledged grant, and a refused SELECT not at all: ioredis goes on in
 * database 0), as a long error reply. The probe asks for all of them at once, each without its
 * arguments: a server that knows the command answers `ERR wrong number of arguments` (nothing
 * runs, nothing is written or cached), one that does not answers `ERR unknown command`.
 */
import { Effect } from "effect"
import type { BackendError } from "@lockstep/core/LockError"
import type { Client } from "../RedisBackend.js"
import { refusalDetail, isCluster, isReplyError, refusedCommand } from "./descriptions.js"
import type { ClientTracker } from "./tracker.js"

/** What the backend will send besides its scripts, which decides the commands probed. */
export interface Needs {
  /** `replication` is set: every acknowledged write is followed by a `WAIT`. */
  readonly replication?: boolean | undefined
  /**
   * Whether a server that cannot be reached fails the probe (the layers that open their own
   * connection), or lets it pass (a borrowed client, whose server may come later: the commands
   * then show at their first use, with the same words).
   */
  readonly reachable: boolean
}

/** Commands the server refuses: the cause of the BackendError the probe fails with. */
export class RefusedCommands extends Error {
  constructor(readonly commands: ReadonlyArray<string>) {
    super(refusalDetail(commands))
    this.name = "RefusedCommands"
  }
}

/** The commands to probe on `client` for `needs`, in the order a refusal names them. */
export const probedCommands = (client: Client, needs: Pick<Needs, "replication">): ReadonlyArray<string> => {
  const db: unknown = isCluster(client) ? 0 : client.options.db
  return [
    "EVALSHA",
    "EVAL",
    // a cluster sends a SUBSCRIBE to a connection of its own, which the probe would open: its
    // waiters' first SUBSCRIBE says it instead
    ...(isCluster(client) ? [] : ["SUBSCRIBE"]),
    ...(needs.replication === true ? ["WAIT"] : []),
    // ioredis sends SELECT as the connection opens and goes on in database 0 when it is refused
    ...(typeof db === "number" && db !== 0 ? ["SELECT"] : [])
  ]
}

/**
 * Sends each of `commands` without arguments, all at once (one round trip), and settles with the
 * ones the server refuses (in that order); rejects when the connection fails (a reply error
 * that refuses no command counts as an answer: the server knows the command).
 */
export const refusedAmong = (client: Client, commands: ReadonlyArray<string>): Promise<ReadonlyArray<string>> =>
  // a mock client (ioredis-mock) has no `call`, and no command renamed
  typeof client.call !== "function" ? Promise.resolve([]) : Promise.all(commands.map((command) =>
    client.call(command).then(
      () => undefined,
      (error: unknown) => {
        // a refused command names itself; ioredis fails what it had queued with the refusal of
        // its ready check's INFO: that is the command refused
        if (isReplyError(error)) return refusedCommand(error)
        return Promise.reject(error)
      }
    )
  )).then((refused) => [...new Set(refused.filter((command): command is string => command !== undefined))])

/**
 * Fails with a BackendError (operation "connect", one line: `the server refuses EVALSHA (renamed
 * or disabled), which lockstep needs to run its scripts`) when the server behind `client` refuses
 * a command the backend needs for `needs`, or when it cannot be reached and `needs.reachable`.
 * One round trip, within the command timeout.
 */
export const probeCommands = (
  client: Client,
  tracker: ClientTracker,
  needs: Needs
): Effect.Effect<void, BackendError> =>
  Effect.flatMap(
    Effect.either(tracker.call("connect", () => refusedAmong(client, probedCommands(client, needs)))),
    (outcome) => {
      if (outcome._tag === "Right") {
        return outcome.right.length === 0 ? Effect.void : Effect.fail(tracker.fail("connect", new RefusedCommands(outcome.right)))
      }
      // an unreachable borrowed client's server is checked by the calls that reach it
      const refused = refusedCommand(outcome.left.cause)
      return needs.reachable || refused !== undefined ? Effect.fail(outcome.left) : Effect.void
    }
  )
