/**
 * The typed errors of lockstep. Every failure a lock operation can report is one of these.
 *
 * @since 0.1.0
 */
import { Data, Duration } from "effect"

/**
 * The wait for a lock ended before the lock was granted. Nothing is left held and no queue
 * entry or subscription is left behind.
 *
 * @example
 * ```ts
 * import { Effect, Duration } from "effect"
 * import { Lock, LockError } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("orders:42")
 *   return yield* Effect.void.pipe(Lock.withLock(lock, { timeout: "1 second" }))
 * }).pipe(Effect.catchTag("LockTimeout", (e: LockError.LockTimeout) => Effect.log(e.message)))
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class LockTimeout extends Data.TaggedError("LockTimeout")<{
  readonly key: string
  readonly timeout: Duration.Duration
}> {
  override get message(): string {
    return `lock "${this.key}" was not granted within ${Duration.format(this.timeout)}`
  }
}

/**
 * A held lease is gone: a renewal reported that the holder no longer holds the key, or the local
 * deadline (acquisition time + lease, on a monotonic clock) passed without a confirmed renewal.
 * `withLock` interrupts its body with this error.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const lock = yield* Lock.make("jobs:nightly")
 *   yield* Effect.never.pipe(Lock.withLock(lock))
 * }).pipe(Effect.catchTag("LockLost", (e) => Effect.logWarning(e.message)))
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class LockLost extends Data.TaggedError("LockLost")<{
  readonly key: string
  readonly holder: string
  readonly reason: "NotHeld" | "DeadlinePassed"
  /** The lease's fixed length, when it had one (`lease` option): such a lease is never renewed. */
  readonly fixedLease?: Duration.Duration | undefined
}> {
  override get message(): string {
    const lost = `lease on "${this.key}" held by ${this.holder} was lost`
    if (this.reason === "NotHeld") return `${lost}: the backend reports it is no longer held`
    if (this.fixedLease !== undefined) {
      return `${lost}: its fixed lease of ${Duration.format(this.fixedLease)} ran out (a fixed lease is never renewed; use \`watchdog\` for one that is)`
    }
    return `${lost}: its deadline passed without a confirmed renewal`
  }
}

/**
 * A release (or renewal) named a holder that does not hold the key. Nothing was changed.
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 *
 * const error = new LockError.NotHeld({ key: "orders:42", holder: "c0ffee:1" })
 * console.log(error.message)
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class NotHeld extends Data.TaggedError("NotHeld")<{
  readonly key: string
  readonly holder: string
}> {
  override get message(): string {
    return `"${this.key}" is not held by ${this.holder}`
  }
}

/**
 * A holder of a read lock asked for the write lock of the same key. Upgrading would deadlock as
 * soon as two readers tried it, so it fails fast instead. Release the read lock first.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock, ReadWriteLock } from "@lockstep/core"
 *
 * const program = Effect.gen(function* () {
 *   const rw = yield* ReadWriteLock.make("config")
 *   // fails with LockUpgradeNotSupported
 *   yield* Effect.void.pipe(Lock.withLock(rw.write), Lock.withLock(rw.read))
 * })
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class LockUpgradeNotSupported extends Data.TaggedError("LockUpgradeNotSupported")<{
  readonly key: string
  readonly holder: string
}> {
  override get message(): string {
    return `${this.holder} holds a read lock on "${this.key}" and asked for its write lock: upgrading is not supported, release the read lock first`
  }
}

/**
 * The current fiber asked for a hold that could only be granted once it released a hold of its
 * own on the same key: a `Lock` on a key it holds as a `Semaphore`, a `Semaphore` on a key it holds
 * as a `Lock`, more permits than the limit leaves beside its own. Waiting would never end, so the
 * request fails at once. Nothing was changed.
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 *
 * const error = new LockError.SelfDeadlock({ key: "jobs", reason: "it holds the key exclusively under another lock handle" })
 * console.log(error.message)
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class SelfDeadlock extends Data.TaggedError("SelfDeadlock")<{
  readonly key: string
  readonly reason: string
}> {
  override get message(): string {
    return `the current fiber would wait for itself on "${this.key}": ${this.reason}`
  }
}

/**
 * Bad input, reported before any backend call: `field` names the offending option.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 *
 * // fails with InvalidLockOptions { field: "key" }
 * const program = Lock.make("")
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class InvalidLockOptions extends Data.TaggedError("InvalidLockOptions")<{
  readonly field: string
  readonly reason: string
}> {
  override get message(): string {
    return `invalid lock option "${this.field}": ${this.reason}`
  }
}

/** The first line of `text`, trimmed: a message never carries a stack trace or a multi-line dump. */
const oneLine = (text: string): string => {
  const end = text.indexOf("\n")
  return (end < 0 ? text : text.slice(0, end)).trim()
}

/**
 * The backend could not carry out an operation (connection loss, timeout, script error, wrong key
 * type, ...). `cause` holds the underlying failure. A backend that knows where it talks to names
 * it in `endpoint`, and may say more than `cause` does in `detail` (for instance the connection
 * error behind a timeout). `message` is one line: no stack trace.
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 *
 * const error = new LockError.BackendError({ operation: "acquire", cause: new Error("ECONNRESET") })
 * console.log(error.message) // lock backend failed during acquire: ECONNRESET
 *
 * const located = new LockError.BackendError({
 *   operation: "acquire",
 *   cause: new Error("no answer within 2s"),
 *   endpoint: "Redis 10.0.0.7:6379",
 *   detail: "connect ECONNREFUSED 10.0.0.7:6379 (no answer within 2s)"
 * })
 * console.log(located.message)
 * // lock backend failed during acquire on Redis 10.0.0.7:6379: connect ECONNREFUSED 10.0.0.7:6379 (no answer within 2s)
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class BackendError extends Data.TaggedError("BackendError")<{
  readonly operation: string
  readonly cause: unknown
  /** Where the backend talks to, e.g. `Redis 127.0.0.1:6379`. */
  readonly endpoint?: string | undefined
  /** What went wrong, in place of `cause`'s own message when the backend knows more. */
  readonly detail?: string | undefined
}> {
  override get message(): string {
    const detail = this.detail ?? (this.cause instanceof Error ? this.cause.message : String(this.cause))
    const where = this.endpoint === undefined ? "" : ` on ${this.endpoint}`
    return oneLine(`lock backend failed during ${this.operation}${where}: ${detail}`)
  }
}

/**
 * The cause of a `BackendError` from a backend whose layer (or scope) has ended: the backend no
 * longer takes calls, and a lock handle made under it must be made again under a live one.
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 *
 * const error = LockError.backendClosed({ operation: "acquire", backend: "memory backend" })
 * console.log(error.cause instanceof LockError.BackendClosed) // true
 * console.log(error.message)
 * // lock backend failed during acquire: the memory backend is closed (the layer or scope that made it has ended)
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class BackendClosed extends Data.TaggedError("BackendClosed")<{
  /** What was closed, e.g. `memory backend` or `Redis backend`. */
  readonly backend: string
}> {
  override get message(): string {
    return `the ${this.backend} is closed (the layer or scope that made it has ended)`
  }
}

/**
 * The `BackendError` every backend answers with once it is closed: its `cause` is a
 * `BackendClosed`, so `isBackendClosed` tells it from an outage.
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 *
 * const error = LockError.backendClosed({ operation: "renew", backend: "Redis backend", endpoint: "Redis 127.0.0.1:6379" })
 * console.log(LockError.isBackendClosed(error)) // true
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const backendClosed = (options: {
  readonly operation: string
  readonly backend: string
  readonly endpoint?: string | undefined
}): BackendError =>
  new BackendError({
    operation: options.operation,
    cause: new BackendClosed({ backend: options.backend }),
    endpoint: options.endpoint
  })

/**
 * Whether a `BackendError` says its backend was closed (rather than unreachable or failing).
 *
 * @example
 * ```ts
 * import { LockError } from "@lockstep/core"
 *
 * const outage = new LockError.BackendError({ operation: "acquire", cause: new Error("ECONNRESET") })
 * console.log(LockError.isBackendClosed(outage)) // false
 * ```
 *
 * @since 0.1.0
 * @category guards
 */
export const isBackendClosed = (error: BackendError): boolean => error.cause instanceof BackendClosed

/**
 * What one node of a quorum (`RedLock`) answered to an operation: `failed` carries the node's
 * error (a `BackendError`, or the quorum's own per-node time limit) in `detail`.
 *
 * @example
 * ```ts
 * import type { LockError } from "@lockstep/core"
 *
 * const answer: LockError.NodeAnswer = { node: 2, outcome: "failed", detail: "no answer within 200ms" }
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export interface NodeAnswer {
  /** The node's position in the list the quorum was made from, from 0. */
  readonly node: number
  readonly outcome: "granted" | "denied" | "not held" | "done" | "failed"
  readonly detail?: string | undefined
}

/**
 * A quorum of independent backends (`RedLock`) could not decide an operation: too few nodes
 * answered for a majority either way. It is the `cause` of the `BackendError` the operation fails
 * with (a lock's operations fail with `BackendError` on every backend); `answers` says what each
 * node answered.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockError } from "@lockstep/core"
 *
 * const explain = (error: LockError.BackendError) =>
 *   error.cause instanceof LockError.QuorumNotReached
 *     ? Effect.logWarning(`${error.cause.answers.filter((a) => a.outcome === "failed").length} nodes failed`)
 *     : Effect.logWarning(error.message)
 * ```
 *
 * @since 0.1.0
 * @category errors
 */
export class QuorumNotReached extends Data.TaggedError("QuorumNotReached")<{
  readonly key: string
  readonly operation: string
  /** Nodes needed: a majority of all of them. */
  readonly quorum: number
  readonly answers: ReadonlyArray<NodeAnswer>
}> {
  override get message(): string {
    const said = this.answers.map((a) => `node ${a.node} ${a.outcome}${a.detail === undefined ? "" : ` (${oneLine(a.detail)})`}`)
    return `no quorum of ${this.quorum} for ${this.operation} of "${this.key}": ${said.join(", ")}`
  }
}

/**
 * What waiting for a lock can fail with.
 *
 * @example
 * ```ts
 * import type { LockError } from "@lockstep/core"
 *
 * const describe = (e: LockError.AcquireError): string => e._tag
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type AcquireError = LockTimeout | LockUpgradeNotSupported | SelfDeadlock | InvalidLockOptions | BackendError

/**
 * Every error lockstep reports.
 *
 * @example
 * ```ts
 * import type { LockError } from "@lockstep/core"
 *
 * const tag = (e: LockError.LockError): string => e._tag
 * ```
 *
 * @since 0.1.0
 * @category models
 */
export type LockError = AcquireError | LockLost | NotHeld
