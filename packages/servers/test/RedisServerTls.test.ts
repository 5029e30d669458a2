/**
 * `RedisServer.make({ tls })` and `makeCertificates`: the server speaks TLS only, on its port,
 * with a certificate (for the names asked) that the returned CA signed; the certificates go with
 * the scope. Probed with Node's own TLS client and plain sockets, not the launcher's helpers.
 */
import { assert, describe, it } from "@effect/vitest"
import { existsSync, readFileSync } from "node:fs"
import * as net from "node:net"
import * as tls from "node:tls"
import { X509Certificate } from "node:crypto"
import { Effect, Exit, Scope } from "effect"
import * as RedisServer from "@lockstep/servers/RedisServer"

const required = process.env["LOCKSTEP_REQUIRE_REDIS"] === "1"
const available = await Effect.runPromise(RedisServer.available)
const runnable = available || required
if (!runnable) {
  console.warn(
    "RedisServer TLS suite NOT RUN: redis-server not found (set REDIS_SERVER_BIN, or LOCKSTEP_REQUIRE_REDIS=1 to fail instead)"
  )
}

type Outcome = "pong" | `refused: ${string}` | `other: ${string}`

/**
 * A PING on a socket `connect` opens (it emits `ready` once the handshake, if any, is done); what
 * happened within `timeoutMs`. An error counts as `refusal` (`refused` over TLS, `other` in plain).
 */
const ping = (
  connect: () => net.Socket,
  ready: "secureConnect" | "connect",
  refusal: "refused" | "other",
  timeoutMs: number
): Effect.Effect<Outcome> =>
  Effect.async<Outcome>((resume) => {
    const socket = connect()
    let settled = false
    let received = ""
    const settle = (outcome: Outcome) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      socket.destroy()
      resume(Effect.succeed(outcome))
    }
    const timer = setTimeout(() => settle("other: timeout"), timeoutMs)
    socket.on(ready, () => socket.write("PING\r\n"))
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString()
      if (received.includes("\r\n")) settle(received.startsWith("+PONG") ? "pong" : `other: ${received.trim()}`)
    })
    socket.on("error", (error) => settle(`${refusal}: ${error.message}`))
    socket.on("close", () => settle(`other: closed after ${JSON.stringify(received)}`))
    return Effect.sync(() => {
      settled = true
      clearTimeout(timer)
      socket.destroy()
    })
  })

/** A PING over TLS with `options`; what happened within `timeoutMs`. */
const tlsPing = (port: number, options: tls.ConnectionOptions, timeoutMs = 2_000): Effect.Effect<Outcome> =>
  ping(() => tls.connect({ host: "127.0.0.1", port, ...options }), "secureConnect", "refused", timeoutMs)

/** A plaintext PING: a TLS-only port never answers PONG to it. */
const plainPing = (port: number): Effect.Effect<Outcome> =>
  ping(() => net.createConnection({ host: "127.0.0.1", port }), "connect", "other", 1_000)

describe.runIf(runnable)("RedisServer with TLS", () => {
  it.scopedLive("tls: true: a TLS-only server on its port, trusted through the returned CA, for 127.0.0.1 and localhost", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: true })
      assert.strictEqual(server.url, `rediss://127.0.0.1:${server.port}`)
      const ca = server.ca ?? ""
      assert.include(ca, "-----BEGIN CERTIFICATE-----")
      assert.strictEqual(yield* tlsPing(server.port, { ca }), "pong")
      assert.strictEqual(yield* tlsPing(server.port, { ca, servername: "localhost" }), "pong")
      // not trusted without the CA; no plaintext on the port
      assert.match(yield* tlsPing(server.port, {}), /^refused: self-signed certificate in certificate chain/)
      assert.notStrictEqual(yield* plainPing(server.port), "pong")
      // a restart keeps the TLS setup
      yield* server.restart
      assert.strictEqual(yield* tlsPing(server.port, { ca }), "pong")
      // pause and resume work as for any server
      yield* server.pause
      assert.strictEqual(yield* tlsPing(server.port, { ca }, 300), "other: timeout")
      yield* server.resume
      assert.strictEqual(yield* tlsPing(server.port, { ca }), "pong")
    }))

  it.scopedLive("a certificate for other names: the CA is trusted but the host name check fails", () =>
    Effect.gen(function*() {
      const server = yield* RedisServer.make({ tls: { altNames: ["other.example"] } })
      const ca = server.ca ?? ""
      assert.match(yield* tlsPing(server.port, { ca }), /^refused: Hostname\/IP does not match certificate's altnames/)
      assert.strictEqual(yield* tlsPing(server.port, { ca, servername: "other.example" }), "pong")
    }))

  it.effect("makeCertificates: a CA and a server certificate it signed, for the names asked, removed with the scope", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const certificates = yield* Scope.extend(RedisServer.makeCertificates({ altNames: ["127.0.0.1", "redis.test"] }), scope)
      const ca = new X509Certificate(readFileSync(certificates.caFile))
      const cert = new X509Certificate(readFileSync(certificates.certFile))
      assert.isTrue(ca.ca, "the CA is a CA")
      assert.isFalse(cert.ca, "the server certificate is not")
      assert.isTrue(cert.verify(ca.publicKey), "signed by the CA")
      assert.strictEqual(cert.subjectAltName, "IP Address:127.0.0.1, DNS:redis.test")
      assert.strictEqual(certificates.ca, readFileSync(certificates.caFile, "utf8"))
      assert.deepStrictEqual(certificates.altNames, ["127.0.0.1", "redis.test"])
      assert.isTrue(existsSync(certificates.keyFile))
      yield* Scope.close(scope, Exit.void)
      assert.isFalse(existsSync(certificates.dir), "removed with the scope")
    }))

  it.effect("makeCertificates refuses names that are no host names", () =>
    Effect.gen(function*() {
      // refused by the check of the names, before openssl runs (whose own failure would be a
      // RedisServerError too), and not a defect
      const bad = yield* Effect.flip(Effect.scoped(RedisServer.makeCertificates({ altNames: ["a b", "x,DNS:evil"] })))
      assert.strictEqual(bad._tag, "RedisServerError")
      assert.strictEqual(bad.message, `invalid certificate names: ["a b","x,DNS:evil"]`)
      const empty = yield* Effect.flip(Effect.scoped(RedisServer.makeCertificates({ altNames: [] })))
      assert.strictEqual(empty._tag, "RedisServerError")
      assert.strictEqual(empty.message, "invalid certificate names: []")
    }))

  it.scopedLive("servers given the same Certificates share one CA", () =>
    Effect.gen(function*() {
      const certificates = yield* RedisServer.makeCertificates()
      const a = yield* RedisServer.make({ tls: certificates })
      const b = yield* RedisServer.make({ tls: certificates })
      assert.strictEqual(a.ca, certificates.ca)
      assert.strictEqual(b.ca, certificates.ca)
      assert.strictEqual(yield* tlsPing(b.port, { ca: certificates.ca }), "pong")
    }))
})
