/**
 * The SQL backend over TLS, on a PostgreSQL server of the test's own that takes TCP connections
 * only over TLS, with a certificate for `127.0.0.1` and `localhost` signed by a throwaway CA:
 * `sslmode` and `sslrootcert` in the URL given to `SqlBackend.layerConfig`, and `ssl` in the
 * options of a `PgClient` of the caller's. A certificate that cannot be trusted fails the layer
 * with one line naming the server and the TLS problem. Each prints the message it got.
 */
import { readFileSync } from "node:fs"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Config, Effect, Exit, Layer, Redacted, Scope } from "effect"
import { PgClient } from "@effect/sql-pg"
import { Lock } from "@lockstep/core"
import type { LockBackend } from "@lockstep/core/LockBackend"
import { SqlBackend } from "@lockstep/sql"
import { required } from "./fixtures/databases.js"
import { type OwnServer, ownPostgresWith, ownServersAvailable } from "./fixtures/servers.js"

if (!ownServersAvailable) {
  if (required) throw new Error("the SQL TLS tests need initdb/pg_ctl on this machine")
  console.warn("SQL TLS suite NOT RUN: initdb/pg_ctl not installed")
}

const servers = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(servers, Exit.void)))
const server: OwnServer | undefined = ownServersAvailable
  ? await Effect.runPromise(Scope.extend(ownPostgresWith({ ssl: true }), servers))
  : undefined

/** The server's URL on `host`, with `params` (`sslmode`, `sslrootcert`, …). */
const urlOf = (db: OwnServer, params: Record<string, string>, host = "127.0.0.1") => {
  const url = new URL(db.url)
  url.hostname = host
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value)
  return url.toString()
}

const fromUrl = (url: string) => SqlBackend.layerConfig(Config.succeed(Redacted.make(url)))

/** A lock is taken and let go on the backend `layer` builds, and a second holder is kept out meanwhile. */
const works = (layer: Layer.Layer<LockBackend, unknown>) =>
  Effect.gen(function*() {
    const backend = yield* Layer.build(layer)
    const lock = yield* Effect.provide(Lock.make(`tls-${crypto.randomUUID()}`), backend)
    const fence = yield* Effect.scoped(
      Effect.gen(function*() {
        const lease = yield* Lock.acquire(lock)
        assert.isTrue(yield* Lock.isLocked(lock))
        return lease.fence
      })
    )
    assert.isAbove(fence, 0)
    assert.isFalse(yield* Lock.isLocked(lock))
  }).pipe(Effect.orDie)

/** The one-line message the layer fails with on `url`. */
const refused = (label: string, url: string) =>
  Effect.gen(function*() {
    const error = yield* Effect.flip(Effect.scoped(Layer.build(fromUrl(url))))
    console.log(`[${label}] ${error.message}`)
    assert.strictEqual(error._tag, "BackendError")
    assert.notInclude(error.message, "\n", "one line")
    assert.notInclude(error.message, "    at ", "no stack")
    return error.message
  })

describe.runIf(server !== undefined)("the SQL backend over TLS to PostgreSQL", () => {
  if (server === undefined) return
  const endpoint = (host = "127.0.0.1") => `PostgreSQL ${host}:${new URL(server.url).port}/lockstep`
  const ca = server.caFile!

  it.scopedLive("a plaintext connection is refused by the server", () =>
    Effect.gen(function*() {
      const message = yield* refused("pg plaintext", server.url)
      assert.include(message, `lock backend failed during connect on ${endpoint()}: `)
      assert.include(message, "no encryption")
    }))

  it.scopedLive("sslmode=verify-full with the CA in sslrootcert: the certificate and host name checked, locks work", () =>
    works(fromUrl(urlOf(server, { sslmode: "verify-full", sslrootcert: ca }))))

  it.scopedLive("verify-full with the CA, by the host name localhost", () =>
    works(fromUrl(urlOf(server, { sslmode: "verify-full", sslrootcert: ca }, "localhost"))))

  it.scopedLive("sslmode=require with the CA: verified (the driver checks the certificate under require too)", () =>
    works(fromUrl(urlOf(server, { sslmode: "require", sslrootcert: ca }))))

  it.scopedLive("sslmode=require with uselibpqcompat=true: encrypted without checking the certificate, as libpq's require", () =>
    works(fromUrl(urlOf(server, { sslmode: "require", uselibpqcompat: "true" }))))

  it.scopedLive("a PgClient of the caller's with ssl: { ca }, under SqlBackend.layer", () =>
    works(
      SqlBackend.layer().pipe(
        Layer.provide(
          PgClient.layer({
            url: Redacted.make(server.url),
            ssl: { ca: readFileSync(ca, "utf8") }
          })
        )
      )
    ))

  it.scopedLive("verify-full without the CA: the layer fails with one line naming the server and the untrusted certificate", () =>
    Effect.gen(function*() {
      const message = yield* refused("pg verify-full, no CA", urlOf(server, { sslmode: "verify-full" }))
      assert.strictEqual(message, `lock backend failed during connect on ${endpoint()}: unable to verify the first certificate`)
    }))

  it.scopedLive("require without the CA fails the same way (the driver's require verifies)", () =>
    Effect.gen(function*() {
      const message = yield* refused("pg require, no CA", urlOf(server, { sslmode: "require" }))
      assert.strictEqual(message, `lock backend failed during connect on ${endpoint()}: unable to verify the first certificate`)
    }))

  it.scopedLive("a certificate for another host name: the layer fails with one line naming the mismatch", () =>
    Effect.gen(function*() {
      const message = yield* refused("pg host mismatch", urlOf(server, { sslmode: "verify-full", sslrootcert: ca }, "127.0.0.2"))
      assert.include(message, `lock backend failed during connect on ${endpoint("127.0.0.2")}: `)
      assert.include(message, "does not match certificate's altnames")
      assert.include(message, "127.0.0.2")
    }))
})
