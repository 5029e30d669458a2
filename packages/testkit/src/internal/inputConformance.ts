import { assert } from "@effect/vitest"
import type { Duration, Scope } from "effect"
import { Effect } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import * as Lock from "@lockstep/core/Lock"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import * as Semaphore from "@lockstep/core/Semaphore"
import * as CountDownLatch from "@lockstep/core/CountDownLatch"
import { LockBackend as LockBackendTag } from "@lockstep/core/LockBackend"
import type { LockBackend } from "@lockstep/core/LockBackend"
import type { Kit } from "./conformanceKit.js"
import { counting } from "./conformanceKit.js"

// Bad input is refused with InvalidLockOptions before anything reaches the backend.

export const invalidOptions = ({ harness, everyKind, freshKey }: Kit): void =>
  everyKind("bad input fails with InvalidLockOptions naming the field, before any backend call", () =>
    Effect.gen(function*() {
      const backend = counting(harness.layer)
      const key = yield* freshKey("invalid")
      const field = <A, E extends { readonly _tag: string }, R>(self: Effect.Effect<A, E, R>) =>
        Effect.map(Effect.flip(self), (e) => (e._tag === "InvalidLockOptions" ? (e as unknown as { field: string }).field : e._tag))
      const bad = (input: unknown) => input as number
      const cases: Array<readonly [Effect.Effect<unknown, { readonly _tag: string }, LockBackend | Scope.Scope>, string]> = [
        [Lock.make(""), "key"],
        [Lock.make("a{b}"), "key"],
        [Lock.make(42 as unknown as string), "key"],
        [Lock.make(key, { lease: 0 }), "lease"],
        [Lock.make(key, { lease: -5 }), "lease"],
        [Lock.make(key, { lease: NaN }), "lease"],
        [Lock.make(key, { lease: Infinity }), "lease"],
        [Lock.make(key, { lease: "0 millis" }), "lease"],
        [Lock.make(key, { lease: bad("soon") }), "lease"],
        [Lock.make(key, { lease: "30 days" }), "lease"],
        [Lock.make(key, { watchdog: 0 }), "watchdog"],
        [Lock.make(key, { watchdog: NaN }), "watchdog"],
        [Lock.make(key, { watchdog: Infinity }), "watchdog"],
        [Lock.make(key, { lease: "10 seconds", watchdog: "10 seconds" }), "watchdog"],
        [Lock.make(key, { lease: "5 millis" }), "lease"],
        [Lock.make(key, { watchdog: 10 }), "watchdog"],
        [FairLock.make(key, { waiterTimeout: -1 }), "waiterTimeout"],
        [ReadWriteLock.make("", {}), "key"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l, { timeout: 0 })), "timeout"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l, { timeout: -1 })), "timeout"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.acquire(l, { timeout: NaN })), "timeout"],
        [Effect.flatMap(Lock.make(key), (l) => Lock.withLock(Effect.void, l, { timeout: 0 })), "timeout"],
        [Semaphore.make(key, { limit: 0 }), "limit"],
        [Semaphore.make(key, { limit: 1.5 }), "limit"],
        [Semaphore.make(key, { limit: NaN }), "limit"],
        [Semaphore.make(key, { limit: Infinity }), "limit"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.acquire(s, { permits: 0 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.acquire(s, { permits: 4 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.acquire(s, { permits: 1.5 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.tryAcquire(s, { permits: -1 })), "permits"],
        [Effect.flatMap(Semaphore.make(key, { limit: 3 }), (s) => Semaphore.withPermits(Effect.void, s, { permits: 9 })), "permits"]
      ]
      for (const [program, expected] of cases) {
        assert.strictEqual(yield* field(Effect.scoped(program)).pipe(Effect.provide(backend.layer)), expected)
      }
      // a negative duration is reported as given, not as the zero it decodes to
      for (const negative of ["-5 seconds", [-1, 0], -5n]) {
        const lease = negative as Duration.DurationInput
        const error = yield* Effect.flip(Lock.make(key, { lease })).pipe(Effect.provide(backend.layer))
        assert.strictEqual(error._tag, "InvalidLockOptions")
        assert.match(error.message, /must be positive, got \[?-/)
      }
      assert.strictEqual(backend.total(), 0, "bad input reached the backend")
    }))

// Keys and names at the limits: each either names a lock of its own on the backend (a round trip
// works, and no two of them are one lock) or is refused with InvalidLockOptions before any I/O.

/** Keys every backend must take, each a lock of its own: pairs of them differ in one way only. */
const hostileKeys: ReadonlyArray<string> = [
  "k".repeat(1024), // the longest key
  "k".repeat(1023), // and one shorter: not truncated to a common prefix
  "€".repeat(938), // 2814 bytes of UTF-8: near the longest
  "€".repeat(937) + "k", // the same but its last character
  "😀".repeat(512), // astral characters (surrogate pairs): 1024 UTF-16 units
  "😀".repeat(511) + "😁",
  "e\u0301", // "é" decomposed
  "\u00e9", // and composed: the same text once normalized, two keys here
  "Key",
  "key", // case matters
  "key ",
  " key", // spaces are part of the key
  "'; DROP TABLE locks; --",
  "\"quoted\" \\ back\\slash",
  "%_*?[]^$.|:",
  "\uFEFF\u200D\u2028\u2029\u00A0\uFFFD", // BOM, joiner, separators, no-break space, replacement
  "lockstep|m|x", // the backends' own separators
  "redisson_lock_token:x"
]

/** Keys every backend refuses before any I/O. */
const refusedKeys: ReadonlyArray<string> = [
  "",
  "k".repeat(1025),
  "k".repeat(1024 * 1024), // 1 MB
  "€".repeat(939), // 939 characters but 2817 bytes of UTF-8
  "😀".repeat(513),
  "\u0000",
  "k\u0000",
  "k\u0000x",
  "k\t",
  "k\n",
  "k\r",
  "k\u001b[31m",
  "k\u007f",
  "k\u0085",
  "k\u009f",
  "k\uD800",
  "k\uDC00",
  "\uDC00\uD800", // a reversed pair
  "{",
  "}",
  "a{b",
  "a}b",
  "{a}"
]

/** Names (the `name` option) refused before any I/O. */
const refusedNames: ReadonlyArray<string> = ["", "n".repeat(129), "n\u0000", "n\n", "n\u009b", "n\uD800", "n\uDFFF"]

/** The failure's field if it is InvalidLockOptions, else its tag (or "succeeded"). */
const fieldOf = <A, E extends { readonly _tag: string }, R>(self: Effect.Effect<A, E, R>) =>
  Effect.map(
    Effect.either(self),
    (result) =>
      result._tag === "Right"
        ? "succeeded"
        : result.left._tag === "InvalidLockOptions"
        ? (result.left as unknown as { readonly field: string }).field
        : result.left._tag
  )

/** A readable form of a hostile string for assertion messages. */
const shown = (text: string) =>
  JSON.stringify(text.length > 40 ? `${text.slice(0, 20)}...(${text.length} units)` : text)

export const hostileInput = ({ everyKind, harness, test }: Kit): void => {
  test("hostile keys: each is a lock of its own, or is refused with InvalidLockOptions before any I/O", () =>
    Effect.gen(function*() {
      const backend = counting(harness.layer)
      yield* Effect.gen(function*() {
        for (const key of refusedKeys) {
          assert.strictEqual(yield* fieldOf(Lock.make(key)), "key", `Lock.make(${shown(key)})`)
        }
        for (const name of refusedNames) {
          assert.strictEqual(yield* fieldOf(Lock.make("ok", { name })), "name", `name ${shown(name)}`)
        }
        assert.strictEqual(backend.total(), 0, "a refused key or name reached the backend")

        // every accepted key at once, each by a holder of its own: a second key that the backend
        // stored as the same lock (truncated, normalized, case-folded, trimmed) would be denied
        yield* Effect.scoped(Effect.gen(function*() {
          const holders = new Map<string, string>()
          for (const key of hostileKeys) {
            const lock = yield* Lock.make(key)
            const lease = yield* Lock.tryAcquire(lock)
            assert.isTrue(lease._tag === "Some", `${shown(key)} was not granted: another key is the same lock`)
            if (lease._tag === "Some") holders.set(key, lease.value.holder)
          }
          for (const key of hostileKeys) {
            const state = yield* inspectOf(key)
            assert.deepStrictEqual(state.holders.map((h) => h.holder), [holders.get(key)], `holders of ${shown(key)}`)
          }
        }))
        // released, each of them
        for (const key of hostileKeys) {
          assert.deepStrictEqual((yield* inspectOf(key)).holders, [], `${shown(key)} left held`)
        }
      }).pipe(Effect.provide(backend.layer))
    }))

  everyKind("hostile keys are refused by every kind of handle, and accepted ones are distinct semaphores and latches", () =>
    Effect.gen(function*() {
      const backend = counting(harness.layer)
      yield* Effect.gen(function*() {
        for (const key of refusedKeys) {
          const kinds: ReadonlyArray<readonly [string, Effect.Effect<unknown, { readonly _tag: string }, LockBackend>]> = [
            ["FairLock", FairLock.make(key)],
            ["ReadWriteLock", ReadWriteLock.make(key)],
            ["Semaphore", Semaphore.make(key, { limit: 2 })],
            ["CountDownLatch", CountDownLatch.make(key)]
          ]
          for (const [kind, make] of kinds) assert.strictEqual(yield* fieldOf(make), "key", `${kind}.make(${shown(key)})`)
        }
        assert.strictEqual(backend.total(), 0, "a refused key reached the backend")

        // a permit of each semaphore at once, and a count on every other latch only
        yield* Effect.scoped(Effect.gen(function*() {
          for (const key of hostileKeys) {
            const semaphore = yield* Semaphore.make(key, { limit: 1 })
            const lease = yield* Semaphore.tryAcquire(semaphore)
            assert.isTrue(lease._tag === "Some", `semaphore ${shown(key)} was not granted: another key is the same one`)
          }
        }))
        // keys of their own (a lock's key may not be taken for a latch at once): the first
        // character of the long ones replaced, the others prefixed
        const latchKeys = hostileKeys.map((key) => key.length > 900 ? `L${[...key].slice(1).join("")}` : `latch ${key}`)
        assert.strictEqual(new Set(latchKeys).size, latchKeys.length)
        for (const [i, key] of latchKeys.entries()) {
          if (i % 2 === 0) assert.isTrue(yield* CountDownLatch.trySetCount(yield* CountDownLatch.make(key), i + 1))
        }
        for (const [i, key] of latchKeys.entries()) {
          const latch = yield* CountDownLatch.make(key)
          assert.strictEqual(yield* CountDownLatch.count(latch), i % 2 === 0 ? i + 1 : 0, `count of latch ${shown(key)}`)
        }
        for (const [i, key] of latchKeys.entries()) {
          const latch = yield* CountDownLatch.make(key)
          for (let n = i % 2 === 0 ? i + 1 : 0; n > 0; n--) yield* CountDownLatch.countDown(latch)
        }
      }).pipe(Effect.provide(backend.layer))
    }))
}

const inspectOf = (key: string) => Effect.flatMap(LockBackendTag, (backend) => backend.inspect(key))
