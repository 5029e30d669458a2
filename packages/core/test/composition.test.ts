import { assert, describe, expectTypeOf, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { LockError } from "@lockstep/core"
import { Lock, LockBackend, MultiLock } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"

const OrderLocks = LockBackend.tag("test/OrderLocks")
const BillingLocks = LockBackend.tag("test/BillingLocks")

// three backends of their own: the default one and two named ones (`fresh`: one layer value used
// three times would otherwise be built once)
const backends = Layer.mergeAll(
  MemoryBackend.layer,
  Layer.fresh(MemoryBackend.layer).pipe(LockBackend.layerAs(OrderLocks)),
  LockBackend.layerAs(Layer.fresh(MemoryBackend.layer), BillingLocks)
)

describe("composing backends", () => {
  it.scoped("a handle made with `using` locks on its tag's backend, and only there", () =>
    Effect.gen(function*() {
      const onOrders = yield* Lock.make("k").pipe(LockBackend.using(OrderLocks))
      const onBilling = yield* LockBackend.using(Lock.make("k"), BillingLocks)
      const onDefault = yield* Lock.make("k")
      yield* Lock.acquire(onOrders)
      assert.isTrue(yield* Lock.isLocked(onOrders))
      assert.isFalse(yield* Lock.isLocked(onBilling))
      assert.isFalse(yield* Lock.isLocked(onDefault))
      // a second handle on the same tag meets the first one's hold
      const again = yield* Lock.make("k").pipe(LockBackend.using(OrderLocks))
      assert.isTrue(yield* Lock.isLocked(again))
    }).pipe(Effect.provide(backends)))

  it.scoped("a MultiLock across two backends holds a part on each", () =>
    Effect.gen(function*() {
      const order = yield* Lock.make("order:1").pipe(LockBackend.using(OrderLocks))
      const invoice = yield* Lock.make("invoice:1").pipe(LockBackend.using(BillingLocks))
      const both = yield* MultiLock.make(order, invoice)
      const held = yield* Effect.all([Lock.isLocked(order), Lock.isLocked(invoice)]).pipe(MultiLock.withLock(both))
      assert.deepStrictEqual(held, [true, true])
      assert.deepStrictEqual(yield* Effect.all([Lock.isLocked(order), Lock.isLocked(invoice)]), [false, false])
    }).pipe(Effect.provide(backends)))

  it("`using` replaces the need for LockBackend by the tag's", () => {
    const made = Lock.make("k").pipe(LockBackend.using(OrderLocks))
    expectTypeOf(made).toEqualTypeOf<Effect.Effect<Lock.Lock, LockError.InvalidLockOptions, LockBackend.Named<"test/OrderLocks">>>()
  })
})
