/**
 * RedLock over independent redis-servers (3 and 5, each started by the test on a free loopback
 * port): the conformance scenarios that apply to a quorum, what an acquire and a release cost,
 * the kinds it refuses, and what it does when nodes die, pause, lose their data or run their
 * fence counters ahead.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, Exit, Fiber, Layer, Option, Scope } from "effect"
import { CountDownLatch, FairLock, Lock, ReadWriteLock, RedLock, Semaphore } from "@lockstep/core"
import { QuorumNotReached } from "@lockstep/core/LockError"
import { RedisBackend } from "@lockstep/redis"
import { RedisServer } from "@lockstep/servers"
import * as Conformance from "@lockstep/testkit/Conformance"
import { backendOn, call, counted, eventually, nowMs, rawClient, runnable, typedFailure, warnIfNotRun, withBackend } from "./fixtures/realRedis.js"

warnIfNotRun("RedLock over real redis-servers (redLock.test.ts)")

/** `n` servers, a counted backend on each, and a RedLock over them. */
const quorumOf = (n: number, options?: RedLock.Options) =>
  Effect.gen(function*() {
    const servers = yield* Effect.forEach(Array.from({ length: n }), () => RedisServer.make(), { concurrency: "unbounded" })
    const nodes = yield* Effect.forEach(servers, (server) => Effect.map(backendOn(server.url), counted))
    const redLock = yield* RedLock.make(nodes.map((node) => node.service), options)
    return { servers, nodes, redLock }
  })

const isQuorumNotReached = (error: unknown): error is { readonly cause: QuorumNotReached } =>
  typeof error === "object" && error !== null && "cause" in error && error.cause instanceof QuorumNotReached

describe.runIf(runnable)("RedLock over independent redis-servers", () => {
  // each test gets three servers of its own
  const three = Layer.unwrapScoped(Effect.gen(function*() {
    const servers = yield* Effect.forEach([0, 1, 2], () => RedisServer.make(), { concurrency: "unbounded" })
    return RedLock.layer(servers.map((server) => RedisBackend.layerFrom(server.url)))
  })).pipe(Layer.orDie)
  Conformance.suite({ name: "RedLock over three redis-servers", layer: three, clock: "live", kinds: "exclusive" })

  it.scopedLive("an uncontended acquire is two parallel rounds (acquire, then the fence floor), a release one", () =>
    Effect.gen(function*() {
      const { nodes, redLock } = yield* quorumOf(3)
      const lock = yield* Lock.make("redlock-trips").pipe(withBackend(redLock))
      const fence = yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence))
      assert.isAbove(fence, 0)
      assert.deepStrictEqual(nodes.map((n) => n.calls), [0, 1, 2].map(() => ({ acquire: 1, raiseFence: 1, release: 1, renew: 0, other: 0 })))
      assert.isFalse(yield* Lock.isLocked(lock))
    }))

  it.scopedLive("kinds a quorum cannot make sound are refused at make, with InvalidLockOptions(kind); fewer than 3 nodes too", () =>
    Effect.gen(function*() {
      const { nodes, redLock } = yield* quorumOf(3)
      const refused = [
        ["FairLock", Effect.asVoid(FairLock.make("redlock-kinds"))],
        ["ReadWriteLock", Effect.asVoid(ReadWriteLock.make("redlock-kinds"))],
        ["Semaphore", Effect.asVoid(Semaphore.make("redlock-kinds", { limit: 2 }))],
        ["CountDownLatch", Effect.asVoid(CountDownLatch.make("redlock-kinds"))]
      ] as const
      for (const [kind, make] of refused) {
        const error = yield* Effect.flip(make.pipe(withBackend(redLock)))
        assert.strictEqual(error._tag, "InvalidLockOptions", kind)
        assert.strictEqual(error.field, "kind", kind)
      }
      // a plain lock is made and works
      const lock = yield* Lock.make("redlock-kinds").pipe(withBackend(redLock))
      assert.isTrue(Option.isSome(yield* Effect.scoped(Lock.tryAcquire(lock))))
      assert.deepStrictEqual(nodes.map((n) => n.calls.acquire), [1, 1, 1])
      const few = yield* Effect.flip(RedLock.make(nodes.slice(0, 2).map((n) => n.service)))
      assert.strictEqual(few.field, "nodes")
    }))

  it.scopedLive("one node of three killed: still granted; a second killed: the holder loses its lease and nobody is granted (QuorumNotReached)", () =>
    Effect.gen(function*() {
      const { nodes, redLock, servers } = yield* quorumOf(3)
      const lock = yield* Lock.make("redlock-killed", { watchdog: "1200 millis" }).pipe(withBackend(redLock))
      yield* servers[2]!.kill
      const startedAt = nowMs()
      const body = yield* Effect.fork(Lock.withLock(Effect.never, lock))
      yield* eventually("granted with one node dead", Effect.orDie(Lock.isLocked(lock)), 2_000)
      const grantedAfter = nowMs() - startedAt
      // renewals go on with two nodes: still held after several watchdog periods
      yield* Effect.sleep("1500 millis")
      assert.isTrue(Option.isNone(yield* Fiber.poll(body)), "the holder lost its lease with a majority alive")
      yield* servers[1]!.kill
      const killedAt = nowMs()
      const exit = yield* Fiber.await(body)
      const lostAfter = nowMs() - killedAt
      const lost = typedFailure(exit)
      assert.isTrue(Option.isSome(lost) && lost.value._tag === "LockLost", `the body ended with ${String(exit)}`)
      assert.isBelow(lostAfter, 1_200 + 500, "LockLost came after the lease")
      const refused = yield* Effect.flip(Effect.scoped(Lock.tryAcquire(lock)))
      assert.isTrue(isQuorumNotReached(refused), `tryAcquire failed with ${refused._tag}: ${refused.message}`)
      const answers = (refused as unknown as { readonly cause: QuorumNotReached }).cause.answers
      // node 0 grants, or denies while the lost hold's release is still on its way
      assert.include(["granted", "denied"], answers[0]!.outcome)
      assert.deepStrictEqual(answers.slice(1).map((a) => a.outcome), ["failed", "failed"])
      // the lost holder gives back what was left of its hold on the live node; the failed attempt too
      const node0Free = Effect.map(Effect.orDie(nodes[0]!.service.inspect("redlock-killed")), (state) => state.holders.length === 0)
      yield* eventually("nothing left held on the live node", node0Free, 3_000)
      console.log(
        `[redlock] 1 of 3 killed: granted after ${grantedAfter.toFixed(0)} ms; 2 of 3 killed: LockLost(${
          Option.isSome(lost) && lost.value._tag === "LockLost" ? lost.value.reason : "?"
        }) ${lostAfter.toFixed(0)} ms after the kill (watchdog 1200 ms); then: ${refused.message}`
      )
    }), 30_000)

  it.scopedLive("a paused node: granted within the node time limit, and its late copy of the attempt is released", () =>
    Effect.gen(function*() {
      const { nodes, redLock, servers } = yield* quorumOf(3, { nodeTimeout: "200 millis" })
      const lock = yield* Lock.make("redlock-paused").pipe(withBackend(redLock))
      yield* servers[0]!.pause
      const startedAt = nowMs()
      const fence = yield* Effect.scoped(Effect.map(Lock.acquire(lock, { timeout: "5 seconds" }), (lease) => lease.fence))
      const took = nowMs() - startedAt
      assert.isAbove(fence, 0)
      assert.isBelow(took, 200 * 2 + 300, "the paused node held the acquisition up past its time limit")
      yield* servers[0]!.resume
      // the paused server runs the acquisition and the release it received, in that order
      const inspectNode0 = Effect.map(Effect.orDie(nodes[0]!.service.inspect("redlock-paused")), (state) => state.holders.length === 0)
      yield* eventually("nothing left held on the paused node", inspectNode0, 3_000)
      console.log(`[redlock] 1 of 3 paused: acquired and released in ${took.toFixed(0)} ms (node time limit 200 ms)`)
    }), 30_000)

  it.scopedLive("two nodes that lose their data (FLUSHALL, as a restart without persistence) while a lease is held let a second holder in", () =>
    Effect.gen(function*() {
      const { redLock, servers } = yield* quorumOf(3)
      const raw = yield* Effect.forEach(servers, (server) => rawClient(server.url))
      const key = "redlock-dataloss"
      const lock = yield* Lock.make(key, { watchdog: "3 seconds" }).pipe(withBackend(redLock))
      const holderScope = yield* Scope.make()
      const held = yield* Lock.acquire(lock).pipe(Effect.provideService(Scope.Scope, holderScope))
      const lostFiber = yield* Effect.fork(Effect.flip(held.lost))
      /** Another fiber (another holder) tries once. */
      const contender = Effect.flatMap(
        Effect.fork(Effect.scoped(Effect.map(Lock.tryAcquire(lock), Option.map((lease) => lease.fence)))),
        Fiber.join
      )
      yield* call(raw[0]!, "FLUSHALL")
      assert.isTrue(Option.isNone(yield* contender), "granted with one node emptied: two still hold")
      yield* call(raw[1]!, "FLUSHALL")
      const flushedAt = nowMs()
      const second = yield* contender
      // the algorithm's known limit: two of three nodes emptied within a lease is a majority for
      // anyone; the first holder learns it at its next renewal (every watchdog / 3)
      assert.isTrue(Option.isSome(second), "not granted with two of three nodes emptied")
      const lost = yield* Fiber.join(lostFiber)
      const lostAfter = nowMs() - flushedAt
      assert.strictEqual(lost.reason, "NotHeld")
      assert.isBelow(lostAfter, 3_000 / 3 + 500)
      // fences are taken from the servers' clocks, so the second holder's is still the greater:
      // a resource that checks fences refuses the first holder
      assert.isAbove(Option.getOrThrow(second), held.fence)
      yield* Scope.close(holderScope, Exit.void)
      console.log(
        `[redlock] 2 of 3 nodes emptied while held: a second holder was granted while the first still held; ` +
          `the first got LockLost(NotHeld) ${lostAfter.toFixed(0)} ms later (watchdog 3 s); fences ${held.fence} then ${
            Option.getOrThrow(second)
          }`
      )
    }), 30_000)

  it.scopedLive("fences keep increasing when a node's counter runs ahead and that node then dies; without the floor they go back", () =>
    Effect.gen(function*() {
      const { nodes, redLock, servers } = yield* quorumOf(3)
      const raw = yield* rawClient(servers[0]!.url)
      // the same quorum with nodes that ignore the fence floor: what the test must catch
      const floorless = yield* RedLock.make(nodes.map((n) => ({ ...n.service, raiseFence: () => Effect.void })))
      const cases = [["redlock-fence", redLock], ["redlock-fence-floorless", floorless]] as const
      const first: Array<number> = []
      for (const [key, backend] of cases) {
        // node 0 issued fences a minute ahead of the others (a clock that ran fast)
        const time = (yield* call(raw, "TIME")) as [string, string]
        const ahead = Number(time[0]) * 1e6 + Number(time[1]) + 60e6
        yield* call(raw, "SET", `redisson_lock_token:{${key}}`, String(ahead), "PX", "120000")
        const lock = yield* Lock.make(key).pipe(withBackend(backend))
        first.push(yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
        assert.isAtLeast(first[first.length - 1]!, ahead)
      }
      yield* servers[0]!.kill
      const second: Array<number> = []
      for (const [key, backend] of cases) {
        const lock = yield* Lock.make(key).pipe(withBackend(backend))
        second.push(yield* Effect.scoped(Effect.map(Lock.acquire(lock), (lease) => lease.fence)))
      }
      assert.isAbove(second[0]!, first[0]!, "a later fence of the quorum went below an earlier one")
      assert.isBelow(second[1]!, first[1]!, "without the floor the fence should have gone back (the test has no teeth)")
      console.log(`[redlock] node 0 a minute ahead, then killed: fences ${first[0]} -> ${second[0]}; without the floor ${first[1]} -> ${second[1]}`)
    }), 30_000)

  it.scopedLive("five nodes: two killed, still granted; a third killed, no grant (QuorumNotReached)", () =>
    Effect.gen(function*() {
      const { redLock, servers } = yield* quorumOf(5)
      const lock = yield* Lock.make("redlock-five").pipe(withBackend(redLock))
      yield* servers[0]!.kill
      yield* servers[3]!.kill
      assert.isTrue(Option.isSome(yield* Effect.scoped(Lock.tryAcquire(lock))), "not granted with 3 of 5 alive")
      yield* servers[4]!.kill
      const refused = yield* Effect.either(Effect.scoped(Lock.tryAcquire(lock)))
      assert.isTrue(Either.isLeft(refused) && isQuorumNotReached(refused.left), `granted or another error with 2 of 5 alive: ${String(refused)}`)
    }), 30_000)
})
