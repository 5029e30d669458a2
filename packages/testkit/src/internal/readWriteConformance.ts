import { assert } from "@effect/vitest"
import { Deferred, Effect, Either, Exit, Fiber, Option, Scope } from "effect"
import * as Lock from "@lockstep/core/Lock"
import * as ReadWriteLock from "@lockstep/core/ReadWriteLock"
import type { Kit } from "./conformanceKit.js"

// ReadWriteLock: readers share, writers exclude, a writer may downgrade.

export const readAfterWrite = ({ everyKind, freshKey, waiterTimeout, handOff }: Kit): void =>
  everyKind("hand-off: a reader waiting for a writer is let in at the writer's release", () =>
    handOff("ReadWriteLock read after write", Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("hand-off-read"), { waiterTimeout })
      return { hold: (body) => Lock.withLock(body, rw.write), wait: (body) => Lock.withLock(body, rw.read) }
    })), 60_000)

export const writeAfterRead = ({ everyKind, freshKey, waiterTimeout, handOff }: Kit): void =>
  everyKind("hand-off: a writer waiting for a reader is let in at the reader's release", () =>
    handOff("ReadWriteLock write after read", Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("hand-off-write"), { waiterTimeout })
      return { hold: (body) => Lock.withLock(body, rw.read), wait: (body) => Lock.withLock(body, rw.write) }
    })), 60_000)

export const readersShare = ({ everyKind, freshKey, withHistory, contend }: Kit): void =>
  everyKind("ReadWriteLock: readers share, writers exclude everyone", () =>
    withHistory(Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("rw"))
      const seen = yield* contend(30, Infinity, (i) => Lock.acquire(i % 5 === 0 ? rw.write : rw.read))
      assert.isAbove(seen.maxHolders, 1, "readers never shared the lock")
      assert.isFalse(yield* Lock.isLocked(rw.read))
      assert.isFalse(yield* Lock.isLocked(rw.write))
    })))

export const downgrade = ({ everyKind, freshKey, withBackend }: Kit): void =>
  everyKind("ReadWriteLock: a writer may downgrade, a reader may not upgrade", () =>
    withBackend(Effect.gen(function*() {
      const rw = yield* ReadWriteLock.make(yield* freshKey("downgrade"))
      /** What a fiber with no holds of its own gets: [read granted, write granted]. */
      const outsider = Effect.gen(function*() {
        const go = yield* Deferred.make<void>()
        const fiber = yield* Effect.forkDaemon(Effect.zipRight(
          Deferred.await(go),
          Effect.all([
            Effect.scoped(Effect.map(Lock.tryAcquire(rw.read), Option.isSome)),
            Effect.scoped(Effect.map(Lock.tryAcquire(rw.write), Option.isSome))
          ])
        ))
        return Effect.zipRight(Deferred.succeed(go, undefined), Fiber.join(fiber))
      })
      const whileWriting = yield* outsider
      const afterDowngrade = yield* outsider
      yield* Effect.scoped(Effect.gen(function*() {
        const writeScope = yield* Scope.make()
        const write = yield* Scope.extend(Lock.acquire(rw.write), writeScope)
        const read = yield* Lock.acquire(rw.read)
        assert.strictEqual(read.fence, write.fence)
        assert.deepStrictEqual(yield* whileWriting, [false, false])
        yield* Scope.close(writeScope, Exit.void)
        // downgraded: still a reader, so other readers may enter and writers may not
        assert.strictEqual(yield* Lock.holdCount(rw.read), 1)
        assert.strictEqual(yield* Lock.holdCount(rw.write), 0)
        assert.deepStrictEqual(yield* afterDowngrade, [true, false])
      }))
      // upgrade fails fast instead of waiting for itself
      const upgrade = yield* Effect.scoped(Effect.gen(function*() {
        yield* Lock.acquire(rw.read)
        return yield* Effect.either(Lock.acquire(rw.write))
      }))
      assert.isTrue(Either.isLeft(upgrade) && upgrade.left._tag === "LockUpgradeNotSupported")
      assert.isFalse(yield* Lock.isLocked(rw.read))
      assert.isFalse(yield* Lock.isLocked(rw.write))
    })))
