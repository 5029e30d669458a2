import { assert } from "@effect/vitest"
import type { Duration, Scope } from "effect"
import { Effect } from "effect"
import * as FairLock from "@lockstep/core/FairLock"
import * as Lock from "@lockstep/core/Lock"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import * as Semaphore from "@lockstep/core/Semaphore"
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
