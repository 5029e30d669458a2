/**
 * The `ClientTracker`, which follows a backend's clients as seen from the outside: where they go
 * (the endpoint, named in every BackendError), what they last reported (the last connection error
 * ioredis emitted, kept per client from its 'error' event until 'ready'), and outages (logged once
 * each, not once per failing call).
 */
import type { Scope } from "effect"
import { Duration, Effect, Queue } from "effect"
import type { RedisOptions } from "ioredis"
import type { Lifecycle } from "@lockstep/core/BackendKit"
import { makeLifecycle } from "@lockstep/core/BackendKit"
import type { Service } from "@lockstep/core/LockBackend"
import { BackendError } from "@lockstep/core/LockError"
import type { Client, Tuning } from "../RedisBackend.js"
import type { Role } from "./clients.js"
import { commandTimeout, refusedSentinelCertificate } from "./clients.js"
import { probeCommands } from "./commands.js"
import { makeDeadlines } from "./deadlines.js"
import {
  endpointOf,
  errorDetail,
  hideCertificate,
  hideCredentials,
  isCertificateError,
  isGivingUp,
  isQuietSentinelRound,
  isReplyError,
  sentinelAnswerDetail
} from "./descriptions.js"

// ---------------------------------------------------------------------------------------------
// the client tracker
// ---------------------------------------------------------------------------------------------

type Event =
  | { readonly _tag: "Lost"; readonly detail: string }
  | { readonly _tag: "Reconnected" }

/** The clients of one backend, as `track` follows them. */
export interface ClientTracker {
  /** Where the backend connects, as named in its errors and logs. */
  readonly endpoint: string
  /**
   * Follows `client`'s 'error' and 'ready' events until the scope closes, which removes the
   * listeners again. The 'error' listener also keeps ioredis from printing "Unhandled error event".
   */
  readonly watch: (client: Client, role: Role) => Effect.Effect<void, never, Scope.Scope>
  /**
   * Settles with the promise, or fails with BackendError once the command timeout passes with
   * no reply on the call's connection (since the call started, or since the last reply: calls
   * that wait in line behind others that are being answered do not time out). The
   * deadline settles the effect itself rather than interrupting it: callers run grants and the
   * registration of their release uninterruptibly (so an interruption never leaks a grant), and
   * a silent server must still not stall them. One timer keeps the deadlines of all calls in
   * flight (see deadlines.ts). Once a call has waited the whole timeout on a connection that is
   * down (it reported a connection error and has not been ready since), later calls on it (on a
   * cluster: to the same `slot`) fail at once until it answers again: the timeout bounds how long
   * an outage stalls a caller, not each call it makes. When the promise fails, `fallback` may
   * answer its failure with another promise (EVAL after NOSCRIPT), which the call then settles
   * with, within the same deadline.
   */
  readonly call: <A>(
    operation: string,
    promise: () => Promise<A>,
    role?: Role,
    slot?: number | undefined,
    fallback?: ((cause: unknown) => Promise<A> | undefined) | undefined
  ) => Effect.Effect<A, BackendError>
  /** A BackendError naming the endpoint and, while `role`'s connection is down, its last error. */
  readonly fail: (operation: string, cause: unknown, role?: Role) => BackendError
  /**
   * The backend's life (core's `BackendKit`): once it is closed (with the backend's scope), every
   * call fails with the closed-backend error, and so does a call still in flight that fails (its
   * connection closed under it), whether or not the client is open (a borrowed one may well be).
   * Its waiter signals wake the backend's waiters, and all of them at the close.
   */
  readonly lifecycle: Lifecycle
  /** `error` naming the endpoint (unchanged if it already does). */
  readonly locate: (error: BackendError) => BackendError
  /**
   * `service` whose every BackendError names the endpoint. Its acquire and release are taken as
   * they are: every BackendError they fail with must come from `call` or `fail`.
   */
  readonly locateAll: (service: Service) => Service
  /**
   * The layer's check of its own connection: one round trip within the command timeout (or until
   * ioredis gives up) that asks for the commands the backend needs (see commands.ts), rather
   * than a PING, which a managed Redis may disable and which nothing else needs. BackendError
   * "connect" if it fails or the server refuses one of them, at once if the connection refuses
   * the server's certificate.
   */
  readonly ping: Effect.Effect<void, BackendError>
  /**
   * Logs each outage once: a warning on the first connection error after being connected (or
   * built), with the endpoint and the error, and "reconnected" once every connection that failed
   * is ready again. Runs until interrupted; fork it in the backend's scope.
   */
  readonly report: Effect.Effect<never>
}

/** The last connection error of a connection, and whether it was a refused certificate (the server's, or a sentinel's). */
interface LastError {
  readonly error: unknown
  readonly text: string
  readonly certificate: boolean
}

/** What a backend's connections last reported, kept from their events (`watch`). */
interface ConnectionReports {
  /** The last connection error of each connection since it was last ready. */
  readonly lastError: Map<Role, LastError>
  /**
   * Per connection (and cluster slot: one node down leaves the others alone), since when it has
   * left a call unanswered for the whole command timeout (performance.now()): set when a call
   * reaches its deadline, cleared by the next answer, or when the connection is ready again.
   */
  readonly silentSince: Map<string, number>
  /** Who waits for the commands connection to refuse the server's certificate (the layer's first PING). */
  readonly refusedCertificate: Set<(error: unknown) => void>
  readonly watch: ClientTracker["watch"]
  /** What a call's failure says, with the connection's last error while it is down. */
  readonly detailOf: (cause: unknown, role: Role) => string
}

/** Follows the connections `watch` is given; an outage and the reconnection go to `events`. */
const followConnections = (events: Queue.Queue<Event>): ConnectionReports => {
  const lastError = new Map<Role, LastError>()
  const silentSince = new Map<string, number>()
  let outage = false

  /** Per connection through sentinels: what the sentinels last said about its master, since it was last ready. */
  const sentinelAnswer = new Map<Role, string>()

  const refusedCertificate = new Set<(error: unknown) => void>()

  const onError = (role: Role, error: unknown, sentinelCertificate = false) => {
    hideCertificate(error)
    hideCredentials(error)
    const certificate = sentinelCertificate || isCertificateError(error)
    let text = errorDetail(error)
    if (isQuietSentinelRound(error)) {
      // the sentinels answered: what they said, or else the master's own error, says more
      const answer = sentinelAnswer.get(role)
      if (answer !== undefined) text = answer
      else if (lastError.has(role)) return
    }
    lastError.set(role, { error, text, certificate })
    if (role === "commands" && refusedCertificate.size > 0 && certificate) {
      for (const waiting of refusedCertificate) waiting(error)
    }
    if (!outage) {
      outage = true
      Queue.unsafeOffer(events, { _tag: "Lost", detail: text })
    }
  }
  const onReady = (role: Role) => {
    lastError.delete(role)
    sentinelAnswer.delete(role)
    for (const route of silentSince.keys()) if (route.startsWith(role)) silentSince.delete(route)
    if (outage && lastError.size === 0) {
      outage = false
      Queue.unsafeOffer(events, { _tag: "Reconnected" })
    }
  }

  const watch = (watched: Client, role: Role) =>
    Effect.asVoid(Effect.acquireRelease(
      Effect.sync(() => {
        // a cluster reports a failed node as 'node error' (it goes on with the others); its own
        // 'error' is the cluster failing as a whole (no startup node answered)
        let refusedByNode: Error | undefined
        const error = (e: unknown) => {
          // a node whose certificate was refused closes, and the cluster's own error names
          // that closing ("Connection is closed.") as its last node error: the refusal says why
          if (refusedByNode !== undefined && e instanceof Error && "lastNodeError" in e && isGivingUp(e.lastNodeError)) {
            e.lastNodeError = refusedByNode
          }
          onError(role, e, refusedSentinelCertificate(watched, e))
        }
        const nodeError = (e: unknown) => {
          if (isCertificateError(e)) {
            hideCertificate(e)
            refusedByNode = e as Error
          }
        }
        const ready = () => {
          refusedByNode = undefined
          onReady(role)
        }
        const name = (watched as { readonly options?: RedisOptions }).options?.name
        const sentinelError = (e: unknown) => {
          const answer = sentinelAnswerDetail(e, name)
          if (answer !== undefined) sentinelAnswer.set(role, answer)
        }
        watched.on("error", error)
        watched.on("node error", nodeError)
        watched.on("ready", ready)
        watched.on("sentinelError", sentinelError)
        return () => {
          watched.off("error", error)
          watched.off("node error", nodeError)
          watched.off("ready", ready)
          watched.off("sentinelError", sentinelError)
        }
      }),
      (remove) => Effect.sync(remove)
    ))

  const detailOf = (cause: unknown, role: Role): string => {
    const own = errorDetail(cause)
    const reported = lastError.get(role)?.text
    if (reported === undefined) return own
    return reported === own || isGivingUp(cause) ? reported : `${reported} (${own})`
  }

  return { lastError, silentSince, refusedCertificate, watch, detailOf }
}

/**
 * `ClientTracker.call`, with the deadlines of the calls in flight kept by one timer (deadlines.ts);
 * a failure is `failOpen`'s error.
 */
const callsWithin = (
  timeout: Duration.Duration,
  reports: ConnectionReports,
  lifecycle: Lifecycle,
  failOpen: (operation: string, cause: unknown, role: Role) => BackendError
): ClientTracker["call"] => {
  const { lastError, silentSince } = reports
  const deadlines = makeDeadlines(Duration.toMillis(timeout))
  /** A reply, or an error reply: the server answers again. */
  const heard = (route: string, cause?: unknown) => {
    if (cause === undefined || isReplyError(cause)) {
      silentSince.delete(route)
      deadlines.heard(route)
    }
  }
  return <A>(
    operation: string,
    promise: () => Promise<A>,
    role: Role = "commands",
    slot?: number,
    fallback?: (cause: unknown) => Promise<A> | undefined
  ) =>
    Effect.async<A, BackendError>((resume) => {
      if (lifecycle.isClosed()) return resume(Effect.fail(lifecycle.closedError(operation)))
      const route = slot === undefined ? role : `${role}:${slot}`
      const since = silentSince.size === 0 ? undefined : silentSince.get(route)
      if (since !== undefined && lastError.has(role)) {
        // a connection that is down and left a call unanswered for the whole timeout: the call
        // still goes out when it is back (after those, in order: the release of an attempt
        // follows the attempt), but its caller does not wait a second timeout for it (an
        // acquisition cleaning up after its attempt timed out would take twice the timeout). A
        // connection that is up but silent (a paused server) may answer any moment: its calls
        // wait as usual
        const onFailure = (cause: unknown) => {
          const next = fallback?.(cause)
          if (next === undefined) return heard(route, cause)
          next.then(() => heard(route), (cause: unknown) => heard(route, cause))
        }
        promise().then(() => heard(route), onFailure)
        const silentFor = Duration.format(Duration.millis(Math.round(performance.now() - since)))
        return resume(Effect.fail(failOpen(
          operation,
          new Error(`no answer from Redis for ${silentFor}`, { cause: lastError.get(role)?.error }),
          role
        )))
      }
      const pending = deadlines.start(route, () => {
        if (!silentSince.has(route)) silentSince.set(route, pending.startedAt)
        resume(Effect.fail(failOpen(
          operation,
          new Error(`no answer from Redis within ${Duration.format(timeout)}`, { cause: lastError.get(role)?.error }),
          role
        )))
      })
      const onSuccess = (value: A) => {
        deadlines.end(pending)
        if (silentSince.size > 0) silentSince.delete(route)
        deadlines.heard(route)
        resume(Effect.succeed(value))
      }
      const onFailure = (cause: unknown) => {
        deadlines.end(pending)
        heard(route, cause)
        resume(Effect.fail(failOpen(operation, cause, role)))
      }
      promise().then(
        onSuccess,
        fallback === undefined ? onFailure : (cause: unknown) => {
          const next = fallback(cause)
          if (next === undefined) return onFailure(cause)
          // the reply that asked for the fallback (NOSCRIPT) is one: the connection answers
          heard(route, cause)
          next.then(onSuccess, onFailure)
        }
      )
      // no canceler: an interrupted call's entry simply expires (its late resume is ignored),
      // whereas a canceler wraps every call in an interruption handler, which costs more
      // than the rest of the call
    })
}

/**
 * Fails as soon as the commands connection refuses the server's certificate, or a sentinel's
 * (or has done so since it was last ready): ioredis retries such a connection like any other (with
 * `maxRetriesPerRequest: null`, until the command timeout), though no retry can succeed.
 */
const certificateRefused = (
  reports: ConnectionReports,
  fail: ClientTracker["fail"]
): Effect.Effect<never, BackendError> =>
  Effect.async<never, BackendError>((resume) => {
    const last = reports.lastError.get("commands")
    if (last !== undefined && last.certificate) return resume(Effect.fail(fail("connect", last.error)))
    const waiting = (error: unknown) => resume(Effect.fail(fail("connect", error)))
    reports.refusedCertificate.add(waiting)
    return Effect.sync(() => {
      reports.refusedCertificate.delete(waiting)
    })
  })

/** Logs each outage `events` tells of once, and the reconnection (see `ClientTracker.report`). */
const reportOutages = (events: Queue.Queue<Event>, endpoint: string): Effect.Effect<never> =>
  Effect.forever(
    Effect.flatMap(Queue.take(events), (event) =>
      event._tag === "Lost"
        ? Effect.logWarning(
          `lockstep: connection to ${endpoint} failed: ${event.detail}; calls fail with BackendError until it is back`
        )
        : Effect.logInfo(`lockstep: reconnected to ${endpoint}`)).pipe(Effect.annotateLogs("endpoint", endpoint))
  )

/**
 * Tracks `client` (as the commands connection) in the scope; further connections of the same
 * backend (the subscriber) join with `watch`.
 */
export const track = (client: Client, tuning?: Tuning): Effect.Effect<ClientTracker, never, Scope.Scope> =>
  Effect.gen(function*() {
    const endpoint = endpointOf(client)
    const events = yield* Queue.unbounded<Event>()
    yield* Effect.addFinalizer(() => Queue.shutdown(events))
    const reports = followConnections(events)
    const { detailOf } = reports
    const lifecycle = makeLifecycle({ backend: "Redis backend", endpoint })

    const fail = (operation: string, cause: unknown, role: Role = "commands") => {
      hideCredentials(cause)
      return new BackendError({ operation, cause, endpoint, detail: detailOf(cause, role) })
    }
    /** `fail`, unless the backend closed meanwhile: then that is what the call ran into. */
    const failOpen = (operation: string, cause: unknown, role: Role) =>
      lifecycle.isClosed() ? lifecycle.closedError(operation) : fail(operation, cause, role)

    const locate = (error: BackendError) =>
      error.endpoint !== undefined
        ? error
        : new BackendError({ operation: error.operation, cause: error.cause, endpoint, detail: error.detail ?? detailOf(error.cause, "commands") })

    yield* reports.watch(client, "commands")

    const tracker: ClientTracker = {
      endpoint,
      watch: reports.watch,
      call: callsWithin(commandTimeout(tuning), reports, lifecycle, failOpen),
      fail,
      lifecycle,
      locate,
      locateAll: (service) => ({
        ...service,
        // acquire and release fail only with errors made by `call` and `fail`, which name the
        // endpoint already: they go as they are, without an error handler around every call
        renew: (requests) => Effect.mapError(service.renew(requests), locate),
        inspect: (key) => Effect.mapError(service.inspect(key), locate),
        forceRelease: (request) => Effect.mapError(service.forceRelease(request), locate),
        cancel: (request) => Effect.mapError(service.cancel(request), locate),
        subscribe: (key, holder, mode) => Effect.mapError(service.subscribe(key, holder, mode), locate)
      }),
      ping: Effect.raceFirst(
        // WAIT with `replication` asked for (`false` turns acknowledgement off)
        Effect.suspend(() =>
          probeCommands(client, tracker, { replication: typeof tuning?.replication === "object", reachable: true })
        ),
        certificateRefused(reports, fail)
      ),
      report: reportOutages(events, endpoint)
    }
    return tracker
  })
