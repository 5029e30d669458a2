import type { Scope } from "effect"
import { Duration, Effect, Either, Option, Runtime } from "effect"
import calculateSlot from "cluster-key-slot"
import type { Redis } from "ioredis"
import type * as LockBackend from "@lockstep/core/LockBackend"
import { BackendError, InvalidLockOptions } from "@lockstep/core/LockError"
import type { Client, Tuning } from "../RedisBackend.js"
import { keepOpen, subscriberFor, unlessConnectionFails, whenNotHandshaking } from "./clients.js"
import { probeCommands } from "./commands.js"
import { viaSentinels } from "./descriptions.js"
import * as calls from "./calls.js"
import type { ClientTracker } from "./tracker.js"
import * as eviction from "./eviction.js"
import * as replication from "./replication.js"
import type { Script } from "./scripts/descriptor.js"
import * as latch from "./scripts/latch.js"
import * as library from "./scripts/library.js"
import * as lock from "./scripts/lock.js"
import { makeWakeups, wakeCode } from "./wakeups.js"

/**
 * The quarantine's longest lease in ms (`undefined`: no quarantine), or why it cannot be had: a
 * cluster has no key every node's scripts can share, and a lease must be positive and finite.
 * Unless the tuning says otherwise, it is on through sentinels and off elsewhere.
 */
const quarantineOf = (tuning: Tuning | undefined, isCluster: boolean, sentinels: boolean): number | string | undefined => {
  const quarantine = tuning?.quarantine
  if (quarantine === false || (quarantine === undefined && (isCluster || !sentinels))) return undefined
  if (isCluster) return "the failover quarantine keeps one record per server, which a Redis Cluster cannot share between slots"
  // on by default for a master the sentinels manage, which they may replace by a replica any time
  const longest = quarantine?.longestLease === undefined
    ? Option.some(Duration.seconds(30))
    : Duration.decodeUnknown(tuning.quarantine.longestLease)
  if (Option.isNone(longest)) return "longestLease is not a duration"
  const ms = Duration.toMillis(longest.value)
  if (!Number.isFinite(ms) || ms <= 0) return `longestLease must be a positive, finite duration, got ${Duration.format(longest.value)}`
  return Math.ceil(ms)
}

/**
 * The longest claim a release grants a waiter (a hand-off: see `wake` in scripts/shared.ts): long
 * enough for its message to arrive and the holder to confirm it, short enough that a waiter that
 * died (or lost the message) holds the lock back for no longer. Never longer than the lease asked
 * for.
 */
export const maxClaimMs = 2_000

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

/**
 * Builds the backend on `client` (borrowed: never closed here), which `tracker` follows. A
 * duplicate connection carries the subscriptions of all waiters; with `replication`, another one
 * carries the scripts whose writes the replicas acknowledge (replication.ts). Both are closed with
 * the scope. Fails (BackendError "connect") only on a `replication` it cannot honour.
 */
export const make = (
  client: Client,
  tuning: Tuning | undefined,
  tracker: ClientTracker,
  reachable: boolean
): Effect.Effect<LockBackend.Service, BackendError, Scope.Scope> =>
  Effect.gen(function*() {
    const clientId = crypto.randomUUID()
    const runtime = yield* Effect.runtime<never>()
    const renewBatchSize = tuning?.renewBatchSize ?? 1000
    const isCluster = "isCluster" in client && client.isCluster === true
    const sentinels = !isCluster && viaSentinels((client as Redis).options)
    const quarantine = quarantineOf(tuning, isCluster, sentinels)
    const namespace = namespaceOf(client)
    /** The cluster slot of a lock's keys, as the server names them (in the namespace). */
    const slotOf = namespace === "" ? calculateSlot : (key: string) => calculateSlot(namespace + key)

    /** How scripts go out (FCALL or EVALSHA), for this backend's calls and its acknowledged ones. */
    const caller = calls.make(client)

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

    /**
     * One script call (see calls.ts). Settles with the reply, or fails with BackendError (naming
     * the endpoint and the connection's trouble) once the command timeout passes: see
     * `ClientTracker.call`.
     */
    const run = (s: Script, keys: ReadonlyArray<string>, args: ReadonlyArray<string | number>) => {
      const way = caller.way()
      return tracker.call(
        s.name,
        () => caller.send(client, way, s, keys, args),
        "commands",
        isCluster ? slotOf(keys[0]!) : undefined,
        (error) => retry(s, keys, args, way, error, 1)
      )
    }

    // replica acknowledgement (`replication`): checked before anything is opened; a mistake in it
    // fails the build as a bad URL fails `layerFrom`, with BackendError "connect"
    const chosen = yield* Effect.mapError(
      replication.settingsOf(tuning),
      (invalid) => tracker.fail("connect", invalid)
    )
    // a server that may evict lock keys is refused unless the user accepted it (eviction.ts)
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

    /** The error for `outcome`'s writes (a `what`) if too few replicas acknowledged them. */
    const unconfirmed = (operation: string, what: replication.Confirmed, outcome: replication.Outcome) =>
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
    // our own connection: it never prints "Unhandled error event", even after the tracker
    // stops listening; connection errors surface through the calls that need it
    subscriber.on("error", () => undefined)
    const closeSubscriber = keepOpen(subscriber)
    // removed after the disconnect below (finalizers run in reverse order)
    yield* tracker.watch(subscriber, "subscriber")
    // the hub names channels as the scripts' callers do; on the server they are in the namespace,
    // where the scripts publish (a lock's channel is one of its KEYS, which ioredis prefixes)
    const wakeups = makeWakeups(
      {
        subscribe: (channel) => whenNotHandshaking(subscriber, () => subscriber.subscribe(namespace + channel)),
        unsubscribe: (channel) => whenNotHandshaking(subscriber, () => subscriber.unsubscribe(namespace + channel))
      },
      (ready) => Effect.asVoid(tracker.call("subscribe", () => ready, "subscriber"))
    )
    subscriber.on("message", (channel: string, message: string) =>
      wakeups.onMessage(namespace === "" ? channel : channel.slice(namespace.length), message))
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
        tracker.close()
        wakeups.close()
        closeSubscriber()
      })
    )
    /** `effect`, unless the backend is closed: calls that send nothing check it here. */
    const whileOpen = <A, E, R>(operation: string, effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | BackendError, R> =>
      Effect.suspend((): Effect.Effect<A, E | BackendError, R> =>
        tracker.isClosed() ? Effect.fail(tracker.closedError(operation)) : effect
      )

    /** The quarantine's longest lease, once it is known to be valid. */
    const longestLease = typeof quarantine === "number" ? quarantine : undefined
    /**
     * The claim a waiter asks a release to grant it (0: wake it only). None under a quarantine
     * (a release does not look at it, and must not grant while it lasts) nor with replica
     * acknowledgement (a claim is granted by a release, which no replica acknowledged before the
     * waiter would rely on it): there, the woken waiter's own acquire grants it.
     */
    const claimMsOf = (leaseMs: number): number =>
      quarantine === undefined && acknowledged === undefined ? Math.min(leaseMs, maxClaimMs) : 0
    /**
     * The BackendError of an acquisition that failed for `cause`, named like every other one (see
     * `ClientTracker.locateAll`).
     */
    const acquireFailed = (cause: Error) => tracker.fail("acquire", cause)

    /** One acquisition: call it when the effect runs (it notes the waiter's registration). */
    const attempt = (request: LockBackend.AcquireRequest): ReturnType<LockBackend.Service["acquire"]> => {
      const keys = lock.acquire.keys(request.key, request.holder, longestLease)
      const channel = keys[2]!
      const code = wakeCode(request.holder)
      const claimMs = claimMsOf(request.leaseMs)
      // only a waiter on a subscription registers: a release may then wake it by its code
      const waiting = wakeups.isWaiting(channel, request.holder, code)
      // (a fair waiter is queued by any denied attempt; on a subscription, its entry asks for hand-offs)
      const register = waiting
      if (register && !request.fair) {
        // its entry in the waiters set, as the script writes it; noted before the call, so that a
        // registration whose reply is lost is taken out too when the waiter gives up
        wakeups.registered(channel, request.holder, code, lock.waiterMember(request, code, claimMs), request.leaseMs)
      }
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
      }
      return Effect.flatMap(
        // a grant is confirmed by the replicas (with `replication`); a failure here is a
        // BackendError, after which the caller releases what the attempt may have been granted
        runAcknowledged(
          lock.acquire,
          keys,
          lock.acquire.args(request, code, register, claimMs, longestLease),
          "grant",
          lock.acquire.wrote
        ),
        (reply) => {
          // a subscribed waiter's denial: the fence floor above which a hand-off is relied on
          if (waiting) {
            const floor = lock.acquire.fenceFloor(reply)
            if (floor !== null) wakeups.denied(channel, request.holder, code, floor, claimMs)
          }
          return lock.acquire.decode(reply, request, acquireFailed)
        }
      )
    }

    // no grant from a server that may evict lock keys (unless accepted); nothing to wait for on
    // the usual path, where the eviction verdict is known
    const acquire = (request: LockBackend.AcquireRequest) =>
      Effect.suspend(() => {
        const first = evictionGuard.beforeAcquire()
        return first === undefined ? attempt(request) : Effect.zipRight(first, Effect.suspend(() => attempt(request)))
      })

    const release = (request: LockBackend.ReleaseRequest) =>
      Effect.flatMap(
        run(lock.release, lock.release.keys(request.key, request.holder), lock.release.args(request)),
        (reply) => lock.release.decode(reply, request)
      )

    /** Sends a batch of renewals: one script per cluster slot (all of them at once on a single server). */
    const renewBatch = (requests: ReadonlyArray<LockBackend.RenewRequest>) => {
      const groups: Array<Array<number>> = []
      const open = new Map<number, Array<number>>()
      requests.forEach((request, i) => {
        const slot = isCluster ? slotOf(request.key) : 0
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
                lock.renew,
                lock.renew.keys(requests, indexes),
                lock.renew.args(requests, indexes),
                lock.renew.wrote
              ),
              (outcome) => {
                // renewals the replicas did not acknowledge are not confirmed
                const notAcknowledged = unconfirmed("renew", "renewal", outcome)
                return indexes.map((index, j) => [index, lock.renew.decode(outcome.reply, j, notAcknowledged)] as const)
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
        : Effect.catchAllDefect(
          // renewals keep the eviction verdict fresh: a policy changed at run time is noticed
          // within one renewal period
          Effect.zipRight(Effect.sync(evictionGuard.touch), renewBatch(requests)),
          (cause) => Effect.fail(new BackendError({ operation: "renew", cause }))
        )

    /**
     * A registered waiter gave up without a grant: its entry leaves the waiters set, and a wake-up
     * a release had already aimed at it goes on. Not awaited: the waiter's exit does not wait for
     * it, and a failure only leaves the entry to expire.
     */
    const abandon = (key: string, holder: string, member: string, leaseMs: number) => {
      Runtime.runFork(runtime)(
        Effect.ignore(run(lock.leave, lock.leave.keys(key, holder), lock.leave.args(member, holder, leaseMs)))
      )
    }

    const inspect = (key: string) =>
      Effect.map(run(lock.inspect, lock.inspect.keys(key), lock.inspect.args()), (reply) => lock.inspect.decode(reply, key))

    return {
      clientId,
      latchSetCount: ({ count, id, key }) =>
        Effect.flatMap(
          runAcknowledged(
            latch.setCount,
            latch.setCount.keys(key),
            latch.setCount.args(key, id, count, namespace),
            "latch change",
            latch.setCount.wrote
          ),
          (reply) => latch.setCount.decode(reply, key)
        ),
      latchCountDown: ({ id, key }) =>
        Effect.flatMap(
          runAcknowledged(
            latch.countDown,
            latch.countDown.keys(key),
            latch.countDown.args(key, id, namespace),
            "latch change",
            latch.countDown.wrote
          ),
          (reply) => latch.countDown.decode(reply, key)
        ),
      latchCount: (key) =>
        Effect.flatMap(run(latch.count, latch.count.keys(key), latch.count.args()), (reply) => latch.count.decode(reply, key)),
      // a message on the latch's channel wakes every latch waiter
      latchSubscribe: (key, waiter) =>
        whileOpen(
          "latchSubscribe",
          Effect.mapError(wakeups.subscribe(latch.latchChannelOf(key), waiter, "latch"), (cause) =>
            cause instanceof BackendError ? cause : new BackendError({ operation: "subscribe", cause }))
        ),
      acquire,
      release,
      renew,
      inspect,
      forceRelease: ({ id, key }) =>
        Effect.map(
          run(lock.forceRelease, lock.forceRelease.keys(key, id), lock.forceRelease.args(key, namespace)),
          lock.forceRelease.decode
        ),
      raiseFence: ({ fence, key, leaseMs }) =>
        Effect.asVoid(
          runAcknowledged(
            lock.raiseFence,
            lock.raiseFence.keys(key),
            lock.raiseFence.args(fence, leaseMs),
            "fence raise",
            lock.raiseFence.wrote
          )
        ),
      cancel: ({ holder, key, leaseMs }) =>
        Effect.asVoid(run(lock.cancel, lock.cancel.keys(key, holder), lock.cancel.args(holder, leaseMs, claimMsOf(leaseMs)))),
      subscribe: (key, holder, mode) =>
        whileOpen(
          "subscribe",
          Effect.mapError(
            wakeups.subscribe(lock.channelOf(key), holder, mode, (member, leaseMs) => abandon(key, holder, member, leaseMs)),
            (cause) =>
            cause instanceof BackendError ? cause : new BackendError({ operation: "subscribe", cause }))
        )
    } satisfies LockBackend.Service
  })
