/**
 * RedLock over memory nodes: it passes the conformance suite (exclusive kinds) over three of
 * them; and when they answer slowly, an interruption at any point of an acquisition whose node
 * calls are in flight leaves nothing held on any node.
 */
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Fiber, Layer } from "effect"
import { Lock, RedLock } from "@lockstep/core"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import { MemoryBackend } from "@lockstep/memory"
import * as Conformance from "@lockstep/testkit/Conformance"

describe("RedLock over memory nodes", () => {
  it.scopedLive("an interruption while node calls are in flight leaves nothing held on any node", () =>
    Effect.gen(function*() {
      const nodes = yield* Effect.forEach([0, 1, 2], () => Effect.map(Layer.build(MemoryBackend.layer), Context.get(LockBackend)))
      // node i answers an acquisition after 20 + 40 * i ms: the grant reaches the nodes one by one
      const slow = nodes.map((node, i): Service => ({ ...node, acquire: (request) => Effect.zipRight(Effect.sleep(20 + 40 * i), node.acquire(request)) }))
      const redLock = yield* RedLock.make(slow)
      const left: Array<ReadonlyArray<number>> = []
      for (const at of [5, 25, 45, 65, 85, 105, 150]) {
        const key = `interrupted-at-${at}`
        const lock = yield* Lock.make(key).pipe(Effect.provideService(LockBackend, redLock))
        const attempt = yield* Effect.fork(Effect.scoped(Lock.acquire(lock)))
        yield* Effect.sleep(at)
        yield* Fiber.interrupt(attempt)
        left.push(yield* Effect.forEach(nodes, (node) => Effect.map(Effect.orDie(node.inspect(key)), (state) => state.holders.length)))
      }
      assert.deepStrictEqual(left, left.map(() => [0, 0, 0]))
    }))
})

Conformance.suite({
  name: "RedLock over three memory backends",
  layer: Layer.orDie(RedLock.layer([MemoryBackend.layer, MemoryBackend.layer, MemoryBackend.layer])),
  clock: "live",
  kinds: "exclusive"
})
