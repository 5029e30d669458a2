import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { CountDownLatch, Lock } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"

/** The InvalidLockOptions `make` fails with, as `field: reason`; "ok" when it succeeds. */
const refusal = <A, E extends { readonly _tag: string }>(make: Effect.Effect<A, E, never>) =>
  Effect.map(Effect.either(make), (result) => {
    if (result._tag === "Right") return "ok"
    const error = result.left as unknown as { readonly _tag: string; readonly field?: string; readonly reason?: string }
    return error._tag === "InvalidLockOptions" ? `${error.field}: ${error.reason}` : error._tag
  })

const lockKey = (key: string) => refusal(Effect.provide(Lock.make(key), MemoryBackend.layer))
const lockName = (name: string) => refusal(Effect.provide(Lock.make("k", { name }), MemoryBackend.layer))

describe("keys and names at the limits", () => {
  it.effect("a key's length is bounded in UTF-16 units and in UTF-8 bytes, to the unit and the byte", () =>
    Effect.gen(function*() {
      assert.strictEqual(yield* lockKey("k".repeat(1024)), "ok")
      assert.strictEqual(yield* lockKey("k".repeat(1025)), "key: must be at most 1024 characters")
      assert.strictEqual(yield* lockKey("k".repeat(1024 * 1024)), "key: must be at most 1024 characters")
      // 938 three-byte characters and two bytes: 2816 bytes, the most MySQL's key column holds
      assert.strictEqual(yield* lockKey("€".repeat(938) + "kk"), "ok")
      assert.strictEqual(yield* lockKey("€".repeat(938) + "kkk"), "key: must be at most 2816 bytes in UTF-8, got 2817")
      assert.strictEqual(yield* lockKey("€".repeat(939)), "key: must be at most 2816 bytes in UTF-8, got 2817")
      // a surrogate pair is one character of 4 bytes: 512 of them are 1024 units and 2048 bytes
      assert.strictEqual(yield* lockKey("😀".repeat(512)), "ok")
      assert.strictEqual(yield* lockKey("é".repeat(1024)), "ok")
    }))

  it.effect("control characters are refused in keys and names, naming the character", () =>
    Effect.gen(function*() {
      assert.strictEqual(yield* lockKey("k\u0000"), "key: must not contain control characters (U+0000 at 1)")
      assert.strictEqual(yield* lockKey("\u001bk"), "key: must not contain control characters (U+001B at 0)")
      for (const c of ["\t", "\n", "\r", "\u007f", "\u0080", "\u0085", "\u009f"]) {
        assert.match(yield* lockKey(`a${c}b`), /^key: must not contain control characters/)
        assert.match(yield* lockName(`a${c}b`), /^name: must not contain control characters/)
      }
      // the first and last character past each range are text
      for (const c of [" ", "~", "\u00a0"]) {
        assert.strictEqual(yield* lockKey(`a${c}b`), "ok")
        assert.strictEqual(yield* lockName(`a${c}b`), "ok")
      }
    }))

  it.effect("lone surrogates are refused in keys and names; pairs are taken", () =>
    Effect.gen(function*() {
      for (const bad of ["\uD800", "k\uDBFF", "\uDC00k", "\uDC00\uD800"]) {
        assert.match(yield* lockKey(bad), /^key: must be well-formed text/)
        assert.match(yield* lockName(bad), /^name: must be well-formed text/)
      }
      assert.strictEqual(yield* lockName("\uD83D\uDE00"), "ok")
    }))

  it.effect("latch keys are checked alike", () =>
    Effect.gen(function*() {
      const latch = (key: string) => refusal(Effect.provide(CountDownLatch.make(key), MemoryBackend.layer))
      assert.match(yield* latch("k\u0000"), /^key: must not contain control/)
      assert.match(yield* latch("€".repeat(939)), /^key: must be at most 2816 bytes/)
      assert.match(yield* latch("k\uD800"), /^key: must be well-formed text/)
    }))
})
