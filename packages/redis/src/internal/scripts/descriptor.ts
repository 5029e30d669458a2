/**
 * What a script of the Redis backend is made of: its Lua source (sent by SHA1 with EVALSHA, and as
 * it is with EVAL when the server does not know it yet) and its contract, the plain functions that
 * build its KEYS and ARGV and read its reply.
 */
import { createHash } from "node:crypto"

/** A script as the backend sends it. */
export interface Script {
  /** The operation it carries out, as its BackendErrors name it. */
  readonly name: string
  readonly lua: string
  /** The SHA1 of `lua`, for EVALSHA. */
  readonly sha: string
}

/**
 * A script's contract: `keys` and `args` build KEYS and ARGV in the order the script reads them;
 * `decode` reads its reply (with what the call was about) into the operation's result, where the
 * reply is read at all; scripts whose writes the replicas may have to acknowledge say by `wrote`
 * which replies wrote something. Plain functions: one call each per operation, nothing wrapped
 * around them.
 */
export interface Contract {
  readonly keys: (...input: never) => ReadonlyArray<string>
  readonly args: (...input: never) => ReadonlyArray<string | number>
  readonly decode?: (reply: unknown, ...context: never) => unknown
  readonly wrote?: (reply: unknown) => boolean
}

/** One operation's script: its source next to its contract. */
export type Descriptor<C extends Contract> = Script & C

/** The descriptor of the script `name` with source `lua` and `contract`. */
export const defineScript = <C extends Contract>(name: string, lua: string, contract: C): Descriptor<C> => ({
  name,
  lua,
  sha: createHash("sha1").update(lua).digest("hex"),
  ...contract
})

/** A number in a reply (Redis answers integers, and strings where the script formats them). */
export const asNumber = (value: unknown): number => Number(value)
