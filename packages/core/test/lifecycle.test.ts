import { assert, describe, it } from "@effect/vitest"
import {
  Context,
  Duration,
  Effect,
  Exit,
  Fiber,
  FiberRef,
  HashMap,
  Layer,
  Option,
  RuntimeFlags,
  RuntimeFlagsPatch,
  Scope,
  TestClock
} from "effect"
import { Lock, LockError, MultiLock } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"

const waiterTimeout = "20 seconds"

describe("a lease after its scope closed", () => {
  it.effect("reports no time left and that it was released", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("handoff:released")
      const scope = yield* Scope.make()
      const lease = yield* Scope.extend(Lock.acquire(lock), scope)
      assert.strictEqual(yield* lease.state, "Held")
      assert.isAbove(Duration.toMillis(yield* lease.expiresIn), 0)
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(Duration.toMillis(yield* lease.expiresIn), 0)
      assert.strictEqual(yield* lease.state, "Released")
      // a released lease was not lost: `lost` does not fail, and does not complete
      const lost = yield* Effect.fork(Effect.either(lease.lost))
      yield* TestClock.adjust("1 minute")
      assert.isTrue(Option.isNone(yield* Fiber.poll(lost)))
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a multi-lease reports Released once every part was released", () =>
    Effect.gen(function*() {
      const both = yield* MultiLock.make(yield* Lock.make("lifecycle:multi:a"), yield* Lock.make("lifecycle:multi:b"))
      const scope = yield* Scope.make()
      const lease = yield* Scope.extend(MultiLock.acquire(both), scope)
      assert.strictEqual(yield* lease.state, "Held")
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(yield* lease.state, "Released")
      assert.strictEqual(Duration.toMillis(yield* lease.expiresIn), 0)
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a lost lease reports Lost and no time left", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("lifecycle:lost", { lease: "1 second" })
      const lease = yield* Lock.acquire(lock)
      yield* TestClock.adjust("2 seconds")
      assert.strictEqual(yield* lease.state, "Lost")
      assert.strictEqual(Duration.toMillis(yield* lease.expiresIn), 0)
      const lost = yield* Effect.flip(lease.lost)
      assert.strictEqual(lost.reason, "DeadlinePassed")
      // a fixed lease is never renewed: the message says it ran out, not that a renewal failed
      assert.strictEqual(
        lost.message,
        `lease on "lifecycle:lost" held by ${lease.holder} was lost: its fixed lease of 1s ran out (a fixed lease is never renewed; use \`watchdog\` for one that is)`
      )
    }).pipe(Effect.scoped, Effect.provide(MemoryBackend.layer)))

  it.effect("an inner re-entrant lease is released while the outer one is held", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("handoff:reentered")
      const outer = yield* Lock.acquire(lock)
      const inner = yield* Effect.scoped(Lock.acquire(lock))
      assert.strictEqual(yield* inner.state, "Released")
      assert.strictEqual(Duration.toMillis(yield* inner.expiresIn), 0)
      assert.strictEqual(yield* outer.state, "Held")
      assert.isAbove(Duration.toMillis(yield* outer.expiresIn), 0)
    }).pipe(Effect.scoped, Effect.provide(MemoryBackend.layer)))
})

describe("a handle used after its memory backend closed", () => {
  it.live("fails with a typed closed-backend error; a waiter blocked at the close fails at once", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(MemoryBackend.layer, scope)
      const lock = yield* Lock.make("handoff:closed", { waiterTimeout }).pipe(Effect.provide(context))
      const holder = yield* Effect.fork(Lock.withLock(Effect.never, lock))
      yield* Effect.sleep("20 millis")
      const waiter = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
      yield* Effect.sleep("20 millis")
      const closedAt = performance.now()
      yield* Scope.close(scope, Exit.void)
      const waited = yield* Effect.flip(Fiber.join(waiter))
      const took = performance.now() - closedAt
      assert.strictEqual(waited._tag, "BackendError")
      assert.isTrue(waited._tag === "BackendError" && LockError.isBackendClosed(waited), waited.message)
      assert.isBelow(took, 250, `the waiter failed ${took.toFixed(1)} ms after the close`)
      const tried = yield* Effect.flip(Effect.scoped(Lock.tryAcquire(lock)))
      assert.strictEqual(
        tried.message,
        "lock backend failed during acquire: the memory backend is closed (the layer or scope that made it has ended)"
      )
      yield* Fiber.interrupt(holder)
    }), 30_000)
})

describe("the caller's scope after withLock", () => {
  it.effect("is still the caller's: a finalizer added after the body runs when the caller's scope closes", () =>
    Effect.gen(function*() {
      const lock = yield* Lock.make("lifecycle:scope")
      const order: Array<string> = []
      yield* Effect.scoped(Effect.gen(function*() {
        // a body that changes a fiber ref of its own: its refs are inherited by the caller
        yield* Lock.withLock(Effect.annotateLogsScoped({ inside: "yes" }), lock)
        yield* Effect.addFinalizer(() => Effect.sync(() => order.push("finalizer")))
        order.push("after withLock")
      }))
      order.push("scope closed")
      assert.deepStrictEqual(order, ["after withLock", "finalizer", "scope closed"])
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("the caller's fiber refs after withLock", () => {
  const plain = FiberRef.unsafeMake("initial")
  const forked = FiberRef.unsafeMake(0, { fork: (n) => n + 1 })
  const summed = FiberRef.unsafeMake(1, { join: (a, b) => a + b })
  class Service extends Context.Tag("Service")<Service, string>() {}
  const cooperative = Effect.map(Effect.getRuntimeFlags, RuntimeFlags.cooperativeYielding)
  const noCooperation = RuntimeFlagsPatch.disable(RuntimeFlags.CooperativeYielding)
  const annotations = Effect.map(FiberRef.get(FiberRef.currentLogAnnotations), HashMap.size)
  const cases: ReadonlyArray<readonly [string, Effect.Effect<unknown, never, Scope.Scope>, Effect.Effect<unknown>]> = [
    ["a ref set", FiberRef.set(plain, "changed"), FiberRef.get(plain)],
    ["nothing set (a ref whose fork changes it)", Effect.void, FiberRef.get(forked)],
    ["a ref with a join of its own, set to the value it had", FiberRef.set(summed, 5), FiberRef.get(summed)],
    ["runtime flags patched", Effect.patchRuntimeFlags(noCooperation), cooperative],
    ["runtime flags patched for the body's scope", Effect.withRuntimeFlagsPatchScoped(noCooperation), cooperative],
    ["log annotations for the body's scope", Effect.annotateLogsScoped({ inside: "yes" }), annotations],
    ["log annotations around an effect", Effect.annotateLogs(Effect.void, { inside: "yes" }), annotations],
    ["a ref set for an effect", Effect.locally(Effect.void, plain, "inside"), FiberRef.get(plain)],
    [
      "a service added to the context",
      FiberRef.update(FiberRef.currentContext, Context.add(Service, "inside")),
      Effect.map(FiberRef.get(FiberRef.currentContext), (context) => Option.isSome(Context.getOption(context, Service)))
    ]
  ]
  /** `effect` on a fiber of its own (whose refs the test's fiber does not inherit), `summed` set to 5 there. */
  const apart = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.flatMap(Effect.flatMap(Effect.fork(Effect.zipRight(FiberRef.set(summed, 5), effect)), Fiber.await), (exit) => exit)
  for (const [name, body, read] of cases) {
    it.effect(`are those of a scoped fork and join of the body: ${name}`, () =>
      Effect.gen(function*() {
        const lock = yield* Lock.make("lifecycle:refs")
        const underLock = yield* apart(Effect.zipRight(Lock.withLock(body, lock), read))
        const joined = yield* apart(Effect.zipRight(Effect.scoped(Effect.flatMap(Effect.fork(body), Fiber.join)), read))
        assert.deepStrictEqual(underLock, joined)
      }).pipe(Effect.provide(MemoryBackend.layer)))
  }
})
