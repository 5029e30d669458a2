/**
 * No password of the Redis backend ever shows: for every way its connections can fail (a
 * password the server refuses, an ACL user's wrong password, a closed port, a certificate it
 * cannot trust, a command timeout on a paused server), with the password in the URL or in the
 * options, nothing the failure produces contains it: not the error (its message, `String`,
 * `JSON.stringify`, `util.inspect`, and all of that for each error in its `cause` chain), not
 * `Cause.pretty`, not a log line (message, annotations, cause), not a span (name, attribute,
 * event, status), not a metric (name or label).
 */
import { assert, describe, it } from "@effect/vitest"
import { randomUUID } from "node:crypto"
import { inspect } from "node:util"
import type { Scope } from "effect"
import { Cause, Context, Effect, Exit, Layer, Logger, Metric, Tracer } from "effect"
import type { MetricLabel } from "effect"
import { Redis } from "ioredis"
import { Lock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import { hideCredentials } from "../src/internal/descriptions.js"
import { deadPort, runnable, trapRejections, warnIfNotRun } from "./fixtures/realRedis.js"

warnIfNotRun("Redis secrets suite (secrets.test.ts)")

const escaped = trapRejections()

/** The password of every connection in this file: distinctive, so any copy of it is found. */
const SECRET = `S3cr3t-${randomUUID()}`
/** The password the servers actually require (never the one the clients give, unless a test says so). */
const RIGHT = `right-${randomUUID()}`

// ---------------------------------------------------------------------------------------------
// what a failure leaves behind
// ---------------------------------------------------------------------------------------------

/** Every rendering of `error` and of each error it refers to (`cause`, `errors`, `lastNodeError`, ...). */
const renderings = (error: unknown, seen: Set<unknown> = new Set(), path = "error"): Array<[string, string]> => {
  if (error === null || error === undefined || seen.has(error)) return []
  seen.add(error)
  const out: Array<[string, string]> = [
    [`String(${path})`, String(error)],
    [`inspect(${path})`, inspect(error, { depth: 8 })]
  ]
  let json: string
  try {
    json = JSON.stringify(error) ?? ""
  } catch (e) {
    json = `JSON.stringify threw: ${String(e)}`
  }
  out.push([`JSON.stringify(${path})`, json])
  if (error instanceof Error) out.push([`${path}.message`, error.message], [`${path}.stack`, error.stack ?? ""])
  if (typeof error === "object") {
    const record = error as Record<string, unknown>
    const named = ["cause", "errors", "lastNodeError", "error", "command", "previousErrors"]
    for (const key of new Set([...Object.keys(record), ...named])) {
      const value = key in record ? record[key] : undefined
      if (typeof value === "object" && value !== null) {
        const values: ReadonlyArray<unknown> = Array.isArray(value) ? value : [value]
        values.forEach((item, i) =>
          out.push(...renderings(item, seen, Array.isArray(value) ? `${path}.${key}[${i}]` : `${path}.${key}`))
        )
      } else if (typeof value === "string") {
        out.push([`${path}.${key}`, value])
      }
    }
  }
  return out
}

/** Everything the program under test logged, traced and measured. */
interface Traces {
  readonly logs: Array<string>
  readonly spans: Array<string>
}

/** A tracer that records every span's name, attributes, events, links and end status as text. */
const recordingTracer = (into: Array<string>): Tracer.Tracer =>
  Tracer.make({
    span: (name, parent, context, links, startTime, kind, options) => {
      const attributes = new Map<string, unknown>(Object.entries(options?.attributes ?? {}))
      const allLinks = [...links]
      const text = (value: unknown) => (typeof value === "string" ? value : inspect(value, { depth: 8 }))
      const span: Tracer.Span = {
        _tag: "Span",
        name,
        spanId: randomUUID(),
        traceId: randomUUID(),
        parent,
        context,
        status: { _tag: "Started", startTime },
        attributes,
        links: allLinks,
        sampled: true,
        kind,
        end: (endTime, exit) => {
          into.push(`span ${name} [${[...attributes].map(([k, v]) => `${k}=${text(v)}`).join(", ")}]`)
          into.push(`span ${name} ended: ${Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "success"} at ${endTime}`)
        },
        attribute: (key, value) => {
          attributes.set(key, value)
          into.push(`span ${name} attribute ${key}=${text(value)}`)
        },
        event: (event, _time, eventAttributes) => into.push(`span ${name} event ${event} ${text(eventAttributes)}`),
        addLinks: (more) => {
          allLinks.push(...more)
        }
      }
      into.push(`span ${name} started [${[...attributes].map(([k, v]) => `${k}=${text(v)}`).join(", ")}]`)
      return span
    },
    context: (f) => f()
  })

/** A logger that records every line: level, message, annotations, spans and cause. */
const recordingLogger = (into: Array<string>) =>
  Logger.make(({ annotations, cause, logLevel, message, spans }) => {
    const messages = Array.isArray(message) ? message : [message]
    into.push(
      [
        logLevel.label,
        ...messages.map((m) => (typeof m === "string" ? m : inspect(m, { depth: 8 }))),
        inspect(Object.fromEntries(annotations), { depth: 8 }),
        inspect([...spans], { depth: 4 }),
        Cause.isEmpty(cause) ? "" : Cause.pretty(cause)
      ].join(" | ")
    )
  })

/** Runs `program` with the recording logger and tracer; its exit and what it left. */
const observe = <A, E>(program: Effect.Effect<A, E, Scope.Scope>) =>
  Effect.gen(function*() {
    const traces: Traces = { logs: [], spans: [] }
    const exit = yield* Effect.exit(Effect.scoped(program)).pipe(
      Effect.withTracer(recordingTracer(traces.spans)),
      Effect.provide(Logger.replace(Logger.defaultLogger, recordingLogger(traces.logs)))
    )
    return { exit, traces }
  })

/**
 * The failure must be the one provoked (its `Cause.pretty` matches `expected`), and no text it
 * left may contain the secret (the test fails naming each place that does).
 */
const assertNoSecret = <A, E>(
  what: string,
  outcome: { readonly exit: Exit.Exit<A, E>; readonly traces: Traces },
  expected: RegExp
): Effect.Effect<void> =>
  Effect.gen(function*() {
    const { exit, traces } = outcome
    assert.isTrue(Exit.isFailure(exit), `${what}: expected a failure`)
    const texts: Array<[string, string]> = []
    if (Exit.isFailure(exit)) {
      const pretty = Cause.pretty(exit.cause)
      assert.match(pretty, expected, `${what}: the failure provoked: ${pretty.split("\n")[0]}`)
      texts.push(["Cause.pretty", pretty])
      for (const failure of [...Cause.failures(exit.cause), ...Cause.defects(exit.cause)]) {
        texts.push(...renderings(failure))
      }
      texts.push(["String(exit)", String(exit)])
    }
    traces.logs.forEach((line, i) => texts.push([`log ${i}`, line]))
    traces.spans.forEach((line, i) => texts.push([`span record ${i}`, line]))
    const snapshot = yield* Metric.snapshot
    for (const pair of snapshot) {
      const tags = pair.metricKey.tags as ReadonlyArray<MetricLabel.MetricLabel>
      texts.push([`metric ${pair.metricKey.name}`, `${pair.metricKey.name} ${tags.map((t) => `${t.key}=${t.value}`).join(",")}`])
    }
    const leaks = texts.filter(([, text]) => text.includes(SECRET)).map(([where, text]) =>
      `${where}: ${text.length > 300 ? `${text.slice(0, 300)}...` : text}`
    )
    assert.deepStrictEqual(leaks, [], `${what}: the password shows in ${leaks.length} place(s)`)
    assert.deepStrictEqual(escaped, [])
  })

// ---------------------------------------------------------------------------------------------
// the failures
// ---------------------------------------------------------------------------------------------

/** Builds the backend from `connection`, then takes and releases a lock on it. */
const useBackend = (connection: RedisBackend.Connection, tuning: RedisBackend.Tuning = { commandTimeout: "500 millis" }) =>
  Effect.gen(function*() {
    const backend = yield* Layer.build(RedisBackend.layerFrom(connection, tuning))
    const lock = yield* Effect.provideService(Lock.make("secrets:lock", { name: "secrets" }), LockBackend, Context.get(backend, LockBackend))
    return yield* Lock.withLock(Effect.void, lock, { timeout: "300 millis" })
  })

/** Sends one command with a client of the test's own (to set ACL users up). */
const setUp = (server: RedisServer.RedisServer, ...args: ReadonlyArray<string>): Effect.Effect<unknown> =>
  Effect.acquireUseRelease(
    Effect.sync(() => new Redis({ host: server.host, port: server.port, password: RIGHT, lazyConnect: true })),
    (client) => Effect.promise(() => client.call(args[0]!, ...args.slice(1))),
    (client) => Effect.sync(() => client.disconnect())
  )

describe.runIf(runnable)("Redis backend: no password ever shows", () => {
  it.scopedLive("a password the server refuses (requirepass), in the URL or in the options", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--requirepass", RIGHT] })
      const refused = /connect on Redis .*127\.0\.0\.1:\d+.*WRONGPASS/
      yield* assertNoSecret("URL", yield* observe(useBackend(`redis://:${SECRET}@127.0.0.1:${server.port}`)), refused)
      yield* assertNoSecret(
        "URL with user and database",
        yield* observe(useBackend(`redis://default:${SECRET}@127.0.0.1:${server.port}/0`)),
        refused
      )
      yield* assertNoSecret(
        "options",
        yield* observe(useBackend({ host: server.host, port: server.port, password: SECRET })),
        refused
      )
      // a borrowed client: the refusal shows in the calls
      const borrowed = Effect.gen(function*() {
        const client = yield* Effect.acquireRelease(
          Effect.sync(() => new Redis(`redis://:${SECRET}@127.0.0.1:${server.port}`, { maxRetriesPerRequest: 1 })),
          (client) => Effect.sync(() => client.disconnect())
        )
        const backend = yield* RedisBackend.make({ client, commandTimeout: "500 millis" })
        const lock = yield* Effect.provideService(Lock.make("secrets:borrowed", { name: "secrets" }), LockBackend, backend)
        return yield* Lock.withLock(Effect.void, lock, { timeout: "300 millis" })
      })
      yield* assertNoSecret("borrowed client", yield* observe(borrowed), /on Redis 127\.0\.0\.1:\d+: WRONGPASS/)
    }))

  it.scopedLive("a password rotated on the server under a running backend: the outage and the calls", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--requirepass", SECRET] })
      const rotated = Effect.gen(function*() {
        const backend = yield* Layer.build(
          RedisBackend.layerFrom(`redis://:${SECRET}@127.0.0.1:${server.port}`, { commandTimeout: "500 millis" })
        )
        const lock = yield* Effect.provideService(
          Lock.make("secrets:rotated", { name: "secrets" }),
          LockBackend,
          Context.get(backend, LockBackend)
        )
        yield* Lock.withLock(Effect.void, lock)
        // the server now wants another password, and drops its clients: they reconnect with the old one
        yield* Effect.acquireUseRelease(
          Effect.sync(() => new Redis({ host: server.host, port: server.port, password: SECRET, lazyConnect: true })),
          (admin) =>
            Effect.promise(async () => {
              await admin.call("CONFIG", "SET", "requirepass", RIGHT)
              await admin.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            }),
          (admin) => Effect.sync(() => admin.disconnect())
        )
        yield* Effect.sleep("200 millis")
        return yield* Lock.withLock(Effect.void, lock, { timeout: "300 millis" })
      })
      const outcome = yield* observe(rotated)
      assert.isTrue(outcome.traces.logs.some((line) => line.includes("WRONGPASS")), "the outage was logged")
      yield* assertNoSecret("rotated", outcome, /on Redis 127\.0\.0\.1:\d+: WRONGPASS/)
    }))

  it.scopedLive("an ACL user's wrong password (and an unknown user), in the URL or in the options", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--requirepass", RIGHT] })
      yield* setUp(server, "ACL", "SETUSER", "locks", "on", `>${RIGHT}`, "~*", "&*", "+@all")
      const refused = /connect on Redis 127\.0\.0\.1:\d+: WRONGPASS/
      yield* assertNoSecret("URL", yield* observe(useBackend(`redis://locks:${SECRET}@127.0.0.1:${server.port}`)), refused)
      yield* assertNoSecret(
        "options",
        yield* observe(useBackend({ host: server.host, port: server.port, username: "locks", password: SECRET })),
        refused
      )
      yield* assertNoSecret(
        "unknown user",
        yield* observe(useBackend(`redis://nobody:${SECRET}@127.0.0.1:${server.port}`)),
        refused
      )
    }))

  it.scopedLive("an unreachable server (closed port): single, cluster and Sentinel, in the URL or in the options", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const refused = new RegExp(`connect on .*127\\.0\\.0\\.1:${port}.*(ECONNREFUSED|Failed to refresh slots cache|no sentinel answered|unreachable)`)
      yield* assertNoSecret("URL", yield* observe(useBackend(`redis://user:${SECRET}@127.0.0.1:${port}`)), refused)
      yield* assertNoSecret("options", yield* observe(useBackend({ host: "127.0.0.1", port, password: SECRET })), refused)
      yield* assertNoSecret(
        "cluster options",
        yield* observe(useBackend({ cluster: [{ host: "127.0.0.1", port }], options: { redisOptions: { password: SECRET } } })),
        refused
      )
      yield* assertNoSecret(
        "Sentinel URL",
        yield* observe(useBackend(`redis+sentinel://:${SECRET}@127.0.0.1:${port}/orders?sentinelPassword=${SECRET}`)),
        refused
      )
      yield* assertNoSecret(
        "Sentinel options",
        yield* observe(useBackend({
          sentinels: [{ host: "127.0.0.1", port }],
          name: "orders",
          password: SECRET,
          sentinelPassword: SECRET
        })),
        refused
      )
    }))

  it.scopedLive("a certificate the client cannot trust, in the URL or in the options", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: true, args: ["--requirepass", RIGHT] })
      const untrusted = /connect on Redis .*127\.0\.0\.1:\d+.*self-signed certificate in certificate chain/
      yield* assertNoSecret("URL", yield* observe(useBackend(`rediss://:${SECRET}@127.0.0.1:${server.port}`)), untrusted)
      yield* assertNoSecret(
        "options",
        yield* observe(useBackend({ host: server.host, port: server.port, password: SECRET, tls: {} })),
        untrusted
      )
      const other = yield* RedisServer.make({ tls: { altNames: ["other.example"] }, args: ["--requirepass", RIGHT] })
      yield* assertNoSecret(
        "certificate for another host",
        yield* observe(useBackend({ host: other.host, port: other.port, password: SECRET, tls: { ca: other.ca ?? "" } })),
        /connect on Redis 127\.0\.0\.1:\d+ \(TLS\): Hostname\/IP does not match/
      )
    }))

  it.scopedLive("a command timeout (paused server), and an outage (killed server), with the right password", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ args: ["--requirepass", SECRET] })
      const lockOn = (connection: RedisBackend.Connection, key: string) =>
        Effect.flatMap(
          Layer.build(RedisBackend.layerFrom(connection, { commandTimeout: "300 millis" })),
          (backend) =>
            Effect.provideService(Lock.make(key, { name: "secrets" }), LockBackend, Context.get(backend, LockBackend))
        )
      const paused = (connection: RedisBackend.Connection) =>
        Effect.gen(function*() {
          const lock = yield* lockOn(connection, "secrets:paused")
          yield* Lock.withLock(Effect.void, lock)
          yield* server.pause
          const exit = yield* Effect.exit(Lock.withLock(Effect.void, lock, { timeout: "1 second" }))
          yield* server.resume
          // after the resume the lock works again
          yield* Lock.withLock(Effect.void, lock)
          return yield* exit
        })
      const timedOut = /on Redis 127\.0\.0\.1:\d+: no answer from Redis/
      for (
        const connection of [`redis://:${SECRET}@127.0.0.1:${server.port}`, {
          host: server.host,
          port: server.port,
          password: SECRET
        }]
      ) {
        const outcome = yield* observe(paused(connection))
        assert.isTrue(outcome.traces.spans.some((line) => line.includes("lockstep.acquire")), "the acquisitions were traced")
        yield* assertNoSecret("paused", outcome, timedOut)
      }
      // killed and restarted: the outage is logged, the reconnection authenticates again
      const killed = Effect.gen(function*() {
        const lock = yield* lockOn(`redis://:${SECRET}@127.0.0.1:${server.port}`, "secrets:killed")
        yield* server.kill
        const exit = yield* Effect.exit(Lock.withLock(Effect.void, lock, { timeout: "500 millis" }))
        yield* server.restart
        yield* Effect.sleep("300 millis")
        return yield* exit
      })
      const outcome = yield* observe(killed)
      assert.isTrue(outcome.traces.logs.some((line) => line.includes("failed: connect ECONNREFUSED")), "the outage was logged")
      yield* assertNoSecret("killed", outcome, /ECONNREFUSED|no answer from Redis/)
    }))

  it("the arguments of AUTH and HELLO ... AUTH on an error (and on the errors it refers to) lose the password", () => {
    const reply = (name: string, args: ReadonlyArray<string>) =>
      Object.assign(new Error("WRONGPASS invalid username-password pair"), { command: { name, args } })
    const auth = reply("auth", ["locks", SECRET])
    const hello = reply("hello", ["3", "AUTH", "locks", SECRET, "SETNAME", "x"])
    const other = reply("evalsha", ["abc", "1", "key"])
    const outer = new Error("no answer", { cause: Object.assign(new Error("all failed"), { errors: [hello], lastNodeError: auth }) })
    hideCredentials(outer)
    hideCredentials(other)
    assert.deepStrictEqual(auth.command, { name: "auth", args: ["locks", "***"] })
    assert.deepStrictEqual(hello.command, { name: "hello", args: ["3", "AUTH", "locks", "***", "SETNAME", "x"] })
    assert.deepStrictEqual(other.command, { name: "evalsha", args: ["abc", "1", "key"] }, "other commands as they were")
    assert.notInclude(inspect(outer, { depth: 10 }), SECRET)
  })
})
