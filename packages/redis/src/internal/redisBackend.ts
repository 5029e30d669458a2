import { createHash } from "node:crypto"
import type { Scope } from "effect"
import { Duration, Effect, Either, Option, Runtime } from "effect"
import calculateSlot from "cluster-key-slot"
import type * as LockBackend from "@lockstep/core/LockBackend"
import { forceReleaseMemoryMs, latchCallMemoryMs } from "@lockstep/core/LockBackend"
import { BackendError, InvalidLockOptions, LockUpgradeNotSupported, NotHeld } from "@lockstep/core/LockError"
import type { Client, Tuning } from "../RedisBackend.js"
import { keepOpen, subscriberFor, whenNotHandshaking } from "./connection.js"
import type { Tracker } from "./connection.js"
import * as replication from "./replication.js"
import * as scripts from "./scripts.js"
import { makeWakeups, wakeCode } from "./wakeups.js"


interface Script {
  readonly name: string
  readonly lua: string
  readonly sha: string
}

const script = (name: string, lua: string): Script => ({
  name,
  lua,
  sha: createHash("sha1").update(lua).digest("hex")
})

const acquireScript = script("acquire", scripts.acquire)
const releaseScript = script("release", scripts.release)
const renewScript = script("renew", scripts.renew)
const inspectScript = script("inspect", scripts.inspect)
const forceReleaseScript = script("forceRelease", scripts.forceRelease)
const cancelScript = script("cancel", scripts.cancel)
const raiseFenceScript = script("raiseFence", scripts.raiseFence)
const leaveScript = script("leave", scripts.leave)
const latchSetCountScript = script("latchSetCount", scripts.latchSetCount)
const latchCountDownScript = script("latchCountDown", scripts.latchCountDown)
const latchCountScript = script("latchCount", scripts.latchCount)

/**
 * The Redis keys of lock `key`, in the order the scripts expect them; `memo` is the key that
 * remembers the holder (or operation) the call is about.
 */
export const keysOf = (key: string, memo = `lockstep_ended:{${key}}`) => [
  key,
  `redisson_lock_token:{${key}}`,
  channelOf(key),
  `lockstep_fair:{${key}}`,
  `lockstep_fair_ttl:{${key}}`,
  memo,
  `lockstep_waiters:{${key}}`,
  `lockstep_waiting:{${key}}`,
  `lockstep_woken:{${key}}`
]

/** Where a holder that ended is remembered. */
export const endedKeyOf = (key: string, holder: string) => `lockstep_ended:{${key}}:${holder}`

/** The keys of lock `key` that are the same on every call (`keysOf`), and the prefix of its ended keys. */
interface KeySet {
  readonly keys: ReadonlyArray<string>
  readonly endedPrefix: string
}

/** Lock keys whose `KeySet` is kept; past that many, the cache starts over. */
const keySetsKept = 4096
const keySets = new Map<string, KeySet>()

/**
 * The `KeySet` of `key`, built once and kept: acquire and release name the same eight keys of a
 * lock on every call (and a ninth, the holder's), which are not built again for each call.
 */
const keySetOf = (key: string): KeySet => {
  let set = keySets.get(key)
  if (set === undefined) {
    if (keySets.size >= keySetsKept) keySets.clear()
    set = { keys: keysOf(key), endedPrefix: `lockstep_ended:{${key}}:` }
    keySets.set(key, set)
  }
  return set
}

/** `keysOf(key, endedKeyOf(key, holder))`, from the kept `KeySet`. */
const holderKeysOf = (key: string, holder: string): Array<string> => {
  const { endedPrefix, keys } = keySetOf(key)
  return [keys[0]!, keys[1]!, keys[2]!, keys[3]!, keys[4]!, endedPrefix + holder, keys[6]!, keys[7]!, keys[8]!]
}

export const channelOf = (key: string) => `redisson_lock__channel:{${key}}`

/** The server's epoch record, which the failover quarantine keeps (one per server). */
export const epochKey = "lockstep_epoch"

/**
 * The quarantine's longest lease in ms (`undefined`: no quarantine), or why it cannot be had: a
 * cluster has no key every node's scripts can share, and a lease must be positive and finite.
 */
const quarantineOf = (tuning: Tuning | undefined, isCluster: boolean): number | string | undefined => {
  if (tuning?.quarantine === undefined) return undefined
  if (isCluster) return "the failover quarantine keeps one record per server, which a Redis Cluster cannot share between slots"
  const longest = tuning.quarantine.longestLease === undefined
    ? Option.some(Duration.seconds(30))
    : Duration.decodeUnknown(tuning.quarantine.longestLease)
  if (Option.isNone(longest)) return "longestLease is not a duration"
  const ms = Duration.toMillis(longest.value)
  if (!Number.isFinite(ms) || ms <= 0) return `longestLease must be a positive, finite duration, got ${Duration.format(longest.value)}`
  return Math.ceil(ms)
}

/** The keys of latch `key`: its count (Redisson's layout) and the calls applied to it. */
export const latchKeysOf = (key: string) => [key, `lockstep_latch_applied:{${key}}`]

/** Redisson's RCountDownLatch channel. */
export const latchChannelOf = (key: string) => `redisson_countdownlatch__channel__{${key}}`

/** EVALSHA / EVAL with the keys and the arguments as arrays, which ioredis flattens. */
type Evalsha = (
  script: string,
  numKeys: number,
  keys: ReadonlyArray<string>,
  args: ReadonlyArray<string | number>
) => Promise<unknown>

const isNoScript = (error: unknown) => error instanceof Error && error.message.startsWith("NOSCRIPT")

const asNumber = (value: unknown): number => Number(value)

/** A renew reply that renewed at least one lease. */
const renewedAny = (reply: unknown): boolean => Array.isArray(reply) && reply.some((answer) => answer === 1)

/** An acquire reply that granted (a new hold, or a re-entry). */
const isGrant = (reply: unknown): boolean => Array.isArray(reply) && Number(reply[0]) === 1

/**
 * Builds the backend on `client` (borrowed: never closed here), which `connection` tracks. A
 * duplicate connection carries the subscriptions of all waiters; with `replication`, another one
 * carries the scripts whose writes the replicas acknowledge (replication.ts). Both are closed with
 * the scope. Fails (BackendError "connect") only on a `replication` it cannot honour.
 */
export const make = (
  client: Client,
  tuning: Tuning | undefined,
  connection: Tracker
): Effect.Effect<LockBackend.Service, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const clientId = crypto.randomUUID()
    const runtime = yield* Effect.runtime<never>()
    const renewBatchSize = tuning?.renewBatchSize ?? 1000
    const isCluster = "isCluster" in client && client.isCluster === true
    const quarantine = quarantineOf(tuning, isCluster)

    /**
     * One script call: EVALSHA, and EVAL when the server does not know the script yet. Settles
     * with the reply, or fails with BackendError (naming the endpoint and the connection's
     * trouble) once the command timeout passes: see `Tracker.call`.
     */
    const scripting = client as unknown as { readonly evalsha: Evalsha; readonly eval: Evalsha }
    const run = (s: Script, keys: ReadonlyArray<string>, args: ReadonlyArray<string | number>) =>
      connection.call(
        s.name,
        // ioredis flattens array arguments one level: the keys and arguments go as they are
        () => scripting.evalsha(s.sha, keys.length, keys, args),
        "commands",
        isCluster ? calculateSlot(keys[0]!) : undefined,
        (error) => isNoScript(error) ? scripting.eval(s.lua, keys.length, keys, args) : undefined
      )

    // replica acknowledgement (`replication`): checked before anything is opened; a mistake in it
    // fails the build as a bad URL fails `layerFrom`, with BackendError "connect"
    const replicated = yield* Effect.mapError(
      replication.settingsOf(tuning),
      (invalid) => connection.fail("connect", invalid)
    )
    if (replicated?.aof === true) {
      const known = yield* connection.call("connect", () => replication.hasWaitAof(client))
      if (!known) {
        return yield* Effect.fail(connection.fail(
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
      : yield* replication.make(client, replicated, (c) => connection.watch(c, "acknowledged"))

    /**
     * A script whose writes must reach the replicas before its caller relies on them: with
     * `replication`, on the acknowledged connection with a WAIT behind it (see replication.ts);
     * `needs(reply)` says whether this reply wrote something to confirm. Settles with the reply and
     * the replicas that acknowledged it (undefined: not asked).
     */
    const runConfirmed = (
      s: Script,
      keys: ReadonlyArray<string>,
      args: ReadonlyArray<string | number>,
      needs: (reply: unknown) => boolean
    ): Effect.Effect<replication.Outcome, BackendError> =>
      acknowledged === undefined
        ? Effect.map(run(s, keys, args), (reply) => ({ reply, acknowledged: undefined }))
        : connection.call(
          s.name,
          () => acknowledged.run(s, keys, args, needs),
          // a connection of its own: its health is not the commands connection's
          "acknowledged",
          isCluster ? calculateSlot(keys[0]!) : undefined
        )

    /** The error for `outcome`'s writes (a `what`) if too few replicas acknowledged them. */
    const unconfirmed = (operation: string, what: replication.Confirmed, outcome: replication.Outcome) =>
      replicated === undefined || outcome.acknowledged === undefined || outcome.acknowledged >= replicated.replicas
        ? undefined
        : connection.fail(
          operation,
          new replication.ReplicationNotAcknowledged({
            operation: what,
            required: replicated.replicas,
            acknowledged: outcome.acknowledged,
            timeout: replicated.timeout,
            aof: replicated.aof
          })
        )

    /**
     * `run`, and with `replication` the reply only once the replicas acknowledged its writes (a
     * `what`), or BackendError (operation: the script's name) caused by ReplicationNotAcknowledged.
     */
    const runAcknowledged = (
      s: Script,
      keys: ReadonlyArray<string>,
      args: ReadonlyArray<string | number>,
      what: replication.Confirmed,
      needs: (reply: unknown) => boolean
    ): Effect.Effect<unknown, BackendError> =>
      acknowledged === undefined
        ? run(s, keys, args)
        : Effect.flatMap(runConfirmed(s, keys, args, needs), (outcome) => {
          const error = unconfirmed(s.name, what, outcome)
          return error === undefined ? Effect.succeed(outcome.reply) : Effect.fail(error)
        })

    const subscriber = subscriberFor(client)
    // our own connection: it never prints "Unhandled error event", even after the tracking
    // listener is removed; connection errors surface through the calls that need it
    subscriber.on("error", () => undefined)
    const closeSubscriber = keepOpen(subscriber)
    // removed after the disconnect below (finalizers run in reverse order)
    yield* connection.watch(subscriber, "subscriber")
    const wakeups = makeWakeups(
      {
        subscribe: (channel) => whenNotHandshaking(subscriber, () => subscriber.subscribe(channel)),
        unsubscribe: (channel) => whenNotHandshaking(subscriber, () => subscriber.unsubscribe(channel))
      },
      (ready) => Effect.asVoid(connection.call("subscribe", () => ready, "subscriber"))
    )
    subscriber.on("message", (channel: string, message: string) => wakeups.onMessage(channel, message))
    let connectedOnce = false
    subscriber.on("ready", () => {
      if (connectedOnce) wakeups.wakeAll()
      connectedOnce = true
    })
    // the first finalizer of the backend to run: calls made from now on (through handles that
    // outlive the layer, by waiters woken here) fail as closed, whether or not the client is still
    // open
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        connection.close()
        wakeups.close()
        closeSubscriber()
      })
    )
    /** `effect`, unless the backend is closed: calls that send nothing check it here. */
    const whileOpen = <A, E, R>(operation: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | BackendError, R> =>
      Effect.suspend((): Effect.Effect<A, E | BackendError, R> =>
        connection.isClosed() ? Effect.fail(connection.closedError(operation)) : effect
      )

    const acquire = (request: LockBackend.AcquireRequest) =>
      Effect.suspend(() => {
        const keys = holderKeysOf(request.key, request.holder)
        const channel = keys[2]!
        const code = wakeCode(request.holder)
        const limit = request.limit === Infinity ? -1 : request.limit
        // only a waiter on a subscription registers: a release may then wake it by its code
        const register = !request.fair && wakeups.isWaiting(channel, request.holder, code)
        if (register) {
          // its entry in the waiters set, as the script writes it; noted before the call, so that a
          // registration whose reply is lost is taken out too when the waiter gives up
          const member = `${code}|${request.mode === "exclusive" ? "x" : "s"}|${request.permits}|${limit}`
          wakeups.registered(channel, request.holder, code, member)
        }
        const args = [
          request.holder,
          request.mode === "exclusive" ? "x" : "s",
          request.permits,
          limit,
          request.leaseMs,
          request.fair ? "1" : "0",
          request.waiterTtlMs,
          request.count,
          code,
          register ? "1" : "0"
        ]
        if (quarantine !== undefined) {
          if (typeof quarantine === "string") return Effect.fail(new InvalidLockOptions({ field: "quarantine", reason: quarantine }))
          if (request.leaseMs > quarantine) {
            return Effect.fail(
              new InvalidLockOptions({
                field: "lease",
                reason: `a lease of ${request.leaseMs}ms is longer than the Redis backend's quarantine.longestLease (${quarantine}ms), ` +
                  "which must cover every lease its server grants"
              })
            )
          }
          args.push(quarantine)
          keys.push(epochKey)
        }
        return Effect.flatMap(
          // a grant is confirmed by the replicas (with `replication`); a failure here is a
          // BackendError, after which the caller releases what the attempt may have been granted
          runAcknowledged(acquireScript, keys, args, "grant", isGrant),
          (reply): Effect.Effect<
            LockBackend.AcquireResult,
            BackendError | InvalidLockOptions | LockUpgradeNotSupported | NotHeld
          > => {
            const [status, a, b] = reply as [number, number?, number?]
            switch (status) {
              case 1:
                return Effect.succeed({ _tag: "Granted", fence: asNumber(a), count: asNumber(b) })
              case 0:
                return Effect.succeed({ _tag: "Denied", retryAfterMs: asNumber(a) })
              case 2:
                return Effect.fail(new LockUpgradeNotSupported({ key: request.key, holder: request.holder }))
              case 3:
                return Effect.fail(
                  new InvalidLockOptions({
                    field: "limit",
                    reason: `"${request.key}" is held with limit ${
                      asNumber(a) === -1 ? "unlimited" : a
                    }, the request names ${request.limit}`
                  })
                )
              case 4:
                return Effect.fail(
                  new InvalidLockOptions({
                    field: "permits",
                    reason: `${request.permits} permits exceed the limit ${request.limit}`
                  })
                )
              case 5:
                return Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
              default:
                // named like every other BackendError of acquire (see `Tracker.locateAll`)
                return Effect.fail(connection.fail("acquire", new Error(`unexpected reply ${String(reply)}`)))
            }
          }
        )
      })

    const release = (request: LockBackend.ReleaseRequest) =>
      Effect.flatMap(
        run(releaseScript, holderKeysOf(request.key, request.holder), [
          request.holder,
          request.mode === "exclusive" ? "x" : "s",
          request.count,
          request.leaseMs
        ]),
        (reply) =>
          asNumber(reply) < 0
            ? Effect.fail(new NotHeld({ key: request.key, holder: request.holder }))
            : Effect.succeed(asNumber(reply))
      )

    /** Sends a batch of renewals: one script per cluster slot (all of them at once on a single server). */
    const renewBatch = (requests: ReadonlyArray<LockBackend.RenewRequest>) => {
      const groups: Array<Array<number>> = []
      const open = new Map<number, Array<number>>()
      requests.forEach((request, i) => {
        const slot = isCluster ? calculateSlot(request.key) : 0
        let group = open.get(slot)
        if (group === undefined || group.length >= renewBatchSize) {
          group = []
          open.set(slot, group)
          groups.push(group)
        }
        group.push(i)
      })
      return Effect.map(
        Effect.forEach(
          groups,
          (indexes) =>
            Effect.map(
              runConfirmed(
                renewScript,
                indexes.map((i) => requests[i]!.key),
                indexes.flatMap((i) => [requests[i]!.holder, requests[i]!.leaseMs]),
                renewedAny
              ),
              (outcome) => {
                // renewals the replicas did not acknowledge are not confirmed: each such lease keeps
                // the deadline it had (a "not held" needs no acknowledgement: the lease is lost)
                const notAcknowledged = unconfirmed("renew", "renewal", outcome)
                return indexes.map((index, j) => {
                  const answer = (outcome.reply as Array<number | string>)[j]
                  const result: LockBackend.RenewResult = typeof answer === "string"
                    // this lease's own error (a key of another type, say): the others are unaffected
                    ? Either.left(new BackendError({ operation: "renew", cause: new Error(answer) }))
                    : answer === 1 && notAcknowledged !== undefined
                    ? Either.left(notAcknowledged)
                    : Either.right(answer === 1)
                  return [index, result] as const
                })
              }
            ),
          { concurrency: "unbounded" }
        ),
        (parts) => {
          const out = new Array<LockBackend.RenewResult>(requests.length).fill(Either.right(false))
          for (const part of parts) for (const [index, ok] of part) out[index] = ok
          return out
        }
      )
    }

    // the lock API's keeper sends every renewal that is due in one call: it goes out as it is
    const renew = (requests: ReadonlyArray<LockBackend.RenewRequest>) =>
      requests.length === 0
        ? whileOpen("renew", Effect.succeed([]))
        : Effect.catchAllDefect(renewBatch(requests), (cause) => Effect.fail(new BackendError({ operation: "renew", cause })))

    /**
     * A registered waiter gave up without a grant: its entry leaves the waiters set, and a wake-up
     * a release had already aimed at it goes on. Not awaited: the waiter's exit does not wait for
     * it, and a failure only leaves the entry to expire.
     */
    const abandon = (key: string, member: string) => {
      Runtime.runFork(runtime)(Effect.ignore(run(leaveScript, keysOf(key), [member])))
    }

    const inspect = (key: string) =>
      Effect.map(run(inspectScript, keysOf(key), []), (reply): LockBackend.KeyState => {
        const flat = reply as Array<string | number | null>
        const count = asNumber(flat[2])
        const holders: Array<LockBackend.HolderState> = []
        for (let i = 0; i < count; i++) {
          const at = 3 + i * 6
          holders.push({
            holder: String(flat[at]),
            exclusive: asNumber(flat[at + 1]),
            shared: asNumber(flat[at + 2]),
            permits: asNumber(flat[at + 3]),
            fence: asNumber(flat[at + 4]),
            ttlMs: asNumber(flat[at + 5])
          })
        }
        const queue: Array<LockBackend.WaiterState> = []
        for (let at = 3 + count * 6; at + 1 < flat.length; at += 2) {
          queue.push({ holder: String(flat[at]), ttlMs: asNumber(flat[at + 1]) })
        }
        const limit = flat[1] === null || flat[1] === undefined || flat[1] === "" ? undefined : asNumber(flat[1])
        return { key, fence: asNumber(flat[0]), limit: limit === -1 ? Infinity : limit, holders, queue }
      })

    /** A latch script's reply, or InvalidLockOptions when the key holds something else (a lock). */
    const latchReply = (key: string, reply: unknown) =>
      asNumber(reply) === -1
        ? Effect.fail(new InvalidLockOptions({ field: "key", reason: `"${key}" is held by a lock, not a latch` }))
        : Effect.succeed(asNumber(reply))

    return {
      clientId,
      latchSetCount: ({ count, id, key }) =>
        Effect.flatMap(
          runAcknowledged(
            latchSetCountScript,
            latchKeysOf(key),
            [id, count, latchCallMemoryMs, latchChannelOf(key)],
            "latch change",
            (reply) => asNumber(reply) === 1
          ),
          (reply) => Effect.map(latchReply(key, reply), (set) => set === 1)
        ),
      latchCountDown: ({ id, key }) =>
        Effect.flatMap(
          runAcknowledged(
            latchCountDownScript,
            latchKeysOf(key),
            [id, latchCallMemoryMs, latchChannelOf(key)],
            "latch change",
            (reply) => asNumber(reply) !== -1
          ),
          (reply) => latchReply(key, reply)
        ),
      latchCount: (key) => Effect.flatMap(run(latchCountScript, latchKeysOf(key), []), (reply) => latchReply(key, reply)),
      // a message on the latch's channel wakes every latch waiter
      latchSubscribe: (key, waiter) =>
        whileOpen(
          "latchSubscribe",
          Effect.mapError(wakeups.subscribe(latchChannelOf(key), waiter, "latch"), (cause) =>
            cause instanceof BackendError ? cause : new BackendError({ operation: "subscribe", cause }))
        ),
      acquire,
      release,
      renew,
      inspect,
      forceRelease: ({ id, key }) =>
        Effect.map(
          run(forceReleaseScript, keysOf(key, `lockstep_force:{${key}}:${id}`), [forceReleaseMemoryMs]),
          (reply) => asNumber(reply) === 1
        ),
      raiseFence: ({ fence, key, leaseMs }) =>
        Effect.asVoid(runAcknowledged(raiseFenceScript, [keysOf(key)[1]!], [fence, leaseMs], "fence raise", () => true)),
      cancel: ({ holder, key, leaseMs }) =>
        Effect.asVoid(
          run(cancelScript, holderKeysOf(key, holder), [holder, leaseMs, `${wakeCode(holder)}|${holder}`])
        ),
      subscribe: (key, holder, mode) =>
        whileOpen(
          "subscribe",
          Effect.mapError(wakeups.subscribe(channelOf(key), holder, mode, (member) => abandon(key, member)), (cause) =>
            cause instanceof BackendError ? cause : new BackendError({ operation: "subscribe", cause }))
        )
    } satisfies LockBackend.Service
  })
