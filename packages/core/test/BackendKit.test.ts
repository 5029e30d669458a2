import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import { BackendKit, LockError } from "@lockstep/core"

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E | undefined =>
  Exit.isFailure(exit) && exit.cause._tag === "Fail" ? exit.cause.error : undefined

describe("BackendKit.Lifecycle", () => {
  it.effect("calls run while open; after the close each fails with the closed error naming the backend and endpoint", () =>
    Effect.gen(function*() {
      const lifecycle = BackendKit.makeLifecycle({ backend: "etcd backend", endpoint: "etcd 10.0.0.1:2379" })
      assert.strictEqual(yield* lifecycle.whileOpen("inspect", Effect.succeed(1)), 1)
      const call = lifecycle.whileOpen("inspect", Effect.succeed(2))
      lifecycle.close()
      lifecycle.close()
      assert.isTrue(lifecycle.isClosed())
      const error = failureOf(yield* Effect.exit(call))
      assert.isTrue(error instanceof LockError.BackendError && LockError.isBackendClosed(error))
      assert.strictEqual(
        error?.message,
        "lock backend failed during inspect on etcd 10.0.0.1:2379: the etcd backend is closed (the layer or scope that made it has ended)"
      )
    }))

  it("a failure names the endpoint and says what the cause means; once closed, it is the closed error", () => {
    const lifecycle = BackendKit.makeLifecycle({
      backend: "etcd backend",
      endpoint: "etcd 10.0.0.1:2379",
      detailOf: (cause) => `described: ${String(cause)}`
    })
    const open = lifecycle.failure("acquire")("ECONNRESET")
    assert.isFalse(LockError.isBackendClosed(open))
    assert.strictEqual(open.cause, "ECONNRESET")
    assert.strictEqual(open.message, "lock backend failed during acquire on etcd 10.0.0.1:2379: described: ECONNRESET")
    lifecycle.close()
    const closed = lifecycle.failure("acquire")("ECONNRESET")
    assert.isTrue(LockError.isBackendClosed(closed))
    assert.strictEqual(closed.operation, "acquire")
  })

  it("without detailOf, a failure says the cause's message", () => {
    const lifecycle = BackendKit.makeLifecycle({ backend: "etcd backend" })
    assert.strictEqual(lifecycle.failure("renew")(new Error("timed out")).message, "lock backend failed during renew: timed out")
  })

  it.effect("closeWithScope closes the lifecycle when the scope closes", () =>
    Effect.gen(function*() {
      const lifecycle = BackendKit.makeLifecycle({ backend: "etcd backend" })
      const scope = yield* Scope.make()
      yield* Scope.extend(lifecycle.closeWithScope, scope)
      assert.isFalse(lifecycle.isClosed())
      yield* Scope.close(scope, Exit.void)
      assert.isTrue(lifecycle.isClosed())
    }))
})

describe("BackendKit.WaiterSignal", () => {
  it.effect("a wake-up with nobody waiting stays pending: the next await returns at once and takes it", () =>
    Effect.gen(function*() {
      let taken = 0
      const signal = BackendKit.makeLifecycle({ backend: "b" }).waiterSignal(() => taken++)
      signal.wake()
      signal.wake()
      assert.isTrue(signal.pending())
      yield* signal.subscription.await
      assert.isFalse(signal.pending())
      assert.strictEqual(taken, 1)
      // taken: the next await waits for a new wake-up
      const waiting = yield* Effect.fork(signal.subscription.await)
      yield* Effect.yieldNow()
      assert.isNull(yield* Fiber.poll(waiting).pipe(Effect.map((o) => (o._tag === "Some" ? o.value : null))))
      signal.wake()
      yield* Fiber.join(waiting)
      assert.strictEqual(taken, 2)
    }))

  it.effect("a woken waiter's wake-up counts as pending until its fiber resumes", () =>
    Effect.gen(function*() {
      const signal = BackendKit.makeLifecycle({ backend: "b" }).waiterSignal()
      const waiting = yield* Effect.fork(signal.subscription.await)
      yield* Effect.yieldNow()
      signal.wake()
      assert.isTrue(signal.pending(), "taken before the waiter ran")
      yield* Fiber.join(waiting)
      assert.isFalse(signal.pending())
      assert.isFalse(signal.take())
    }))

  it.effect("closing the signal, or the lifecycle, wakes its waiters; later awaits return at once", () =>
    Effect.gen(function*() {
      const lifecycle = BackendKit.makeLifecycle({ backend: "b" })
      const one = lifecycle.waiterSignal()
      const two = lifecycle.waiterSignal()
      const onOne = yield* Effect.fork(one.subscription.await)
      const onTwo = yield* Effect.fork(two.subscription.await)
      yield* Effect.yieldNow()
      one.close()
      yield* Fiber.join(onOne)
      assert.isTrue(one.isClosed())
      assert.isFalse(two.isClosed())
      lifecycle.close()
      yield* Fiber.join(onTwo)
      assert.isTrue(two.isClosed())
      yield* one.subscription.await
      yield* two.subscription.await
      // made after the close: closed from the start
      yield* lifecycle.waiterSignal().subscription.await
    }))

  it.effect("an interrupted waiter unregisters: a later wake-up stays pending for the next", () =>
    Effect.gen(function*() {
      const signal = BackendKit.makeLifecycle({ backend: "b" }).waiterSignal()
      const waiting = yield* Effect.fork(signal.subscription.await)
      yield* Effect.yieldNow()
      yield* Fiber.interrupt(waiting)
      signal.wake()
      assert.isTrue(signal.pending())
      yield* signal.subscription.await
      assert.isFalse(signal.pending())
    }))
})

describe("BackendKit.endpointName", () => {
  it("names a system, its address and a path when there are", () => {
    assert.strictEqual(BackendKit.endpointName("PostgreSQL", "db:5432", "app"), "PostgreSQL db:5432/app")
    assert.strictEqual(BackendKit.endpointName("Redis", "127.0.0.1:6379"), "Redis 127.0.0.1:6379")
    assert.strictEqual(BackendKit.endpointName("Redis", "127.0.0.1:6379", ""), "Redis 127.0.0.1:6379")
    assert.strictEqual(BackendKit.endpointName("ZooKeeper"), "ZooKeeper")
  })
})
