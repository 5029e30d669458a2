/**
 * Keys and holder ids with characters that mean something in SQL text (quotes, backslashes,
 * placeholders, comments, statement separators) or outside ASCII: each is stored and read back
 * exactly, and does not touch another key.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { LockBackend } from "@lockstep/core/LockBackend"
import { backend, database, exclusiveRequest } from "./fixtures/databases.js"

const texts = [
  "plain",
  "it's",
  "'; DROP TABLE lockstep_locks; --",
  "back\\slash",
  "\\'",
  "\\\\''\\",
  "E'x'",
  "$1 ? ?? :name",
  "/* comment */ -- dash",
  "semi;colon",
  "tab\tnewline\nreturn\r",
  "\u001a\b\f",
  "ünïcödé ключ 鍵 🔒",
  "%_",
  `quote"double`,
  "x".repeat(600)
]

for (const kind of ["pg", "mysql", "sqlite"] as const) {
  const db = await database(kind)
  describe.runIf(db !== undefined)(`unusual keys and holders on ${kind}`, () => {
    if (db === undefined) return

    it.scopedLive("each is stored and read back exactly, apart from every other", () =>
      Effect.gen(function*() {
        const service = Context.get(yield* Layer.build(backend(db)), LockBackend)
        for (const [i, text] of texts.entries()) {
          const key = `literal:${kind}:${text}`
          // a holder id is at most 256 bytes on MySQL
          const holder = `${service.clientId}:${text.slice(0, 100)}`
          const request = exclusiveRequest(key, holder)
          const granted = yield* service.acquire(request)
          assert.strictEqual(granted._tag, "Granted", `acquire of key #${i}`)
          const state = yield* service.inspect(key)
          assert.strictEqual(state.key, key)
          assert.deepStrictEqual(state.holders.map((h) => h.holder), [holder], `holders of key #${i}`)
          // a key that differs only in its last character is another key
          const other = yield* service.inspect(`${key}.`)
          assert.strictEqual(other.holders.length, 0, `neighbour of key #${i}`)
          assert.strictEqual(yield* service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: 10_000 }), 0)
          assert.strictEqual((yield* service.inspect(key)).holders.length, 0, `released key #${i}`)
          // the ended holder is remembered: its late acquire grants nothing
          const late = yield* Effect.either(service.acquire(request))
          assert.isTrue(late._tag === "Left" || late.right._tag !== "Granted", `late acquire of key #${i}`)
        }
        // several keys in one transaction
        const renewed = yield* service.renew(texts.map((text) => ({ key: `literal:${kind}:${text}`, holder: "nobody", leaseMs: 1_000 })))
        assert.strictEqual(renewed.length, texts.length)
      }), 60_000)

    it.scopedLive("a number that is text at run time (a caller of the service without types) is never SQL", () =>
      Effect.gen(function*() {
        const service = Context.get(yield* Layer.build(backend(db)), LockBackend)
        const key = `literal:${kind}:numbers`
        const holder = `${service.clientId}:numbers`
        const hostile = "0'::float8); DROP TABLE lockstep_locks; COMMIT; --" as unknown as number
        // a release of a holder that holds nothing writes its ended record with leaseMs in it
        yield* Effect.either(service.release({ key, holder, mode: "exclusive", count: 1, leaseMs: hostile }))
        yield* Effect.either(service.cancel({ key, holder: `${holder}:2`, leaseMs: hostile }))
        // the table is there, and locks work
        const request = exclusiveRequest(key, `${holder}:3`)
        assert.strictEqual((yield* service.acquire(request))._tag, "Granted")
        assert.strictEqual((yield* service.inspect(key)).holders.length, 1)
      }), 60_000)
  })
}
