/**
 * The ZooKeeper backend's layers and its layout in ZooKeeper: connecting (and failing to), the
 * namespace, keys that are not plain path names, fences from zxids, a closed backend, and what an
 * error may say.
 */
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, Layer, Option, Redacted, Schedule, Scope } from "effect"
import * as Zk from "node-zookeeper-client"
import { Lock, LockBackend, LockError } from "@lockstep/core"
import { ZooKeeperBackend } from "@lockstep/zookeeper"
import * as Conformance from "@lockstep/testkit/Conformance"
import { deadPort } from "../../redis/test/fixtures/realRedis.js"
import { serverForFile } from "./fixtures/server.js"

const server = await serverForFile("ZooKeeper backend suite")

/**
 * The children of `path`, read with a client of the test's own: none when the node does not exist
 * (NO_NODE); any other error fails the test, so that a read that failed never passes for "empty".
 */
const children = (path: string) =>
  Effect.acquireUseRelease(
    Effect.async<Zk.Client>((resume) => {
      const client = Zk.createClient(server!.connectionString)
      client.once("connected", () => resume(Effect.succeed(client)))
      client.connect()
    }),
    (client) =>
      Effect.async<ReadonlyArray<string>>((resume) =>
        client.getChildren(path, (error, names) => {
          if (error && "code" in error && error.code === Zk.Exception.NO_NODE) resume(Effect.succeed([]))
          else if (error) resume(Effect.die(error))
          else resume(Effect.succeed(names))
        })
      ),
    (client) => Effect.sync(() => client.close())
  )

describe.runIf(server !== undefined)("ZooKeeper backend", () => {
  it.scopedLive("a host that does not answer fails the layer with BackendError(connect) naming it, never the password", () =>
    Effect.gen(function*() {
      const port = yield* deadPort
      const started = Date.now()
      const exit = yield* Effect.exit(Layer.build(
        ZooKeeperBackend.layerFrom(Redacted.make(`zk://app:s3cret-pw@127.0.0.1:${port}/app`), { connectTimeout: "1 second" })
      ))
      assert.isTrue(Exit.isFailure(exit))
      const error = Option.getOrThrow(Cause.failureOption((exit as Exit.Failure<unknown, LockError.BackendError>).cause))
      assert.strictEqual(error._tag, "BackendError")
      assert.strictEqual(error.operation, "connect")
      assert.include(error.message, `127.0.0.1:${port}/app`)
      assert.notInclude(error.message, "s3cret-pw")
      assert.notInclude(JSON.stringify(error), "s3cret-pw")
      assert.isBelow(Date.now() - started, 5_000)
    }))

  it.scopedLive("a connection string with no host fails the layer at once with BackendError(connect)", () =>
    Effect.gen(function*() {
      const started = Date.now()
      const exit = yield* Effect.exit(Layer.build(ZooKeeperBackend.layerFrom("zk://")))
      const took = Date.now() - started
      // a typed failure: a defect (a TypeError, say) is not one
      const error = Option.getOrThrowWith(
        Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none(),
        () => new Error(`expected a typed failure, got ${Exit.isFailure(exit) ? Cause.pretty(exit.cause) : "a backend"}`)
      )
      assert.strictEqual(error._tag, "BackendError")
      assert.strictEqual(error.operation, "connect")
      assert.include(error.message, "names no host")
      // at once: no connection attempt, no connect timeout (the default is seconds)
      assert.isBelow(took, 500, `failed after ${took} ms`)
    }))

  it.scopedLive("nodes live under the namespace, named after the key and the holder; an unused key's node is swept", () =>
    Effect.gen(function*() {
      const namespace = `/ns-${crypto.randomUUID()}`
      const context = yield* Layer.build(
        ZooKeeperBackend.layerFrom(`zk://${server!.connectionString}`, { namespace, sweepInterval: "300 millis" })
      )
      const key = "orders/42 ..é"
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make(key)
        const lease = yield* Effect.scoped(Effect.gen(function*() {
          const lease = yield* Lock.acquire(lock)
          const encoded = encodeURIComponent(key).replace(/\./g, "%2E")
          assert.deepStrictEqual(yield* children(`${namespace}/locks`), [encoded])
          const nodes = yield* children(`${namespace}/locks/${encoded}`)
          assert.strictEqual(nodes.length, 1)
          assert.isTrue(nodes[0]!.startsWith(encodeURIComponent(lease.holder).replace(/\./g, "%2E")))
          return lease
        }))
        assert.isAbove(lease.fence, 0)
        // kept for the next use, then deleted by a sweep once unused
        assert.strictEqual((yield* children(`${namespace}/locks`)).length, 1)
        const swept = yield* Effect.repeat(children(`${namespace}/locks`), {
          until: (names) => names.length === 0,
          schedule: Schedule.spaced("100 millis")
        }).pipe(Effect.timeout("10 seconds"), Effect.option)
        assert.isTrue(Option.isSome(swept), "the unused key's node was never swept")
      }).pipe(Effect.provide(context))
    }))

  it.scopedLive("fences are the ensemble's zxids: they grow with every grant, also across backends", () =>
    Effect.gen(function*() {
      const namespace = `/fences-${crypto.randomUUID()}`
      const one = yield* Layer.build(ZooKeeperBackend.layerFrom(server!.connectionString, { namespace }))
      const two = yield* Layer.build(ZooKeeperBackend.layerFrom(server!.connectionString, { namespace }))
      const fences: Array<number> = []
      for (let i = 0; i < 6; i++) {
        const fence = yield* Effect.flatMap(Lock.make("k"), (lock) => Effect.scoped(Effect.map(Lock.acquire(lock), (l) => l.fence)))
          .pipe(Effect.provide(i % 2 === 0 ? one : two))
        fences.push(fence)
      }
      for (let i = 1; i < fences.length; i++) assert.isAbove(fences[i]!, fences[i - 1]!)
    }))

  it.scopedLive("a node of this backend's that none of its holders has (a lost create whose clean-up failed too) is removed by its next attempt", () =>
    Effect.gen(function*() {
      const namespace = `/orphan-${crypto.randomUUID()}`
      const context = yield* Layer.build(ZooKeeperBackend.layerFrom(server!.connectionString, { namespace }))
      const backend = yield* Effect.provide(LockBackend.LockBackend, context)
      const lock = yield* Effect.provide(Lock.make("k"), context)
      // made as the backend would have made it for a holder of its own it no longer knows
      const prefix = `${encodeURIComponent(`${backend.clientId}:999999`)}~x~0~`
      yield* Effect.acquireUseRelease(
        Effect.async<Zk.Client>((resume) => {
          const client = Zk.createClient(server!.connectionString)
          client.once("connected", () => resume(Effect.succeed(client)))
          client.connect()
        }),
        (client) =>
          Effect.async<void>((resume) =>
            client.mkdirp(`${namespace}/locks/k`, () =>
              client.create(
                `${namespace}/locks/k/${prefix}`,
                Buffer.from(JSON.stringify({ x: 1, s: 0, p: 0, m: 1, l: 60_000, w: 60_000, g: 1 })),
                Zk.CreateMode.PERSISTENT_SEQUENTIAL,
                () => resume(Effect.void)
              ))
          ),
        (client) => Effect.sync(() => client.close())
      )
      assert.strictEqual((yield* children(`${namespace}/locks/k`)).length, 1)
      // a 60 s lease: only the clean-up lets this in at once
      const granted = yield* Effect.provide(Effect.scoped(Lock.tryAcquire(lock)), context)
      assert.isTrue(Option.isSome(granted))
      assert.isFalse((yield* children(`${namespace}/locks/k`)).some((name) => name.startsWith(prefix)))
    }))

  it.scopedLive("a closed backend says so: BackendError caused by BackendClosed", () =>
    Effect.gen(function*() {
      const inner = yield* Scope.make()
      const context = yield* Layer.buildWithScope(ZooKeeperBackend.layerFrom(server!.connectionString), inner)
      const backend = LockBackend.LockBackend.pipe((tag) => Effect.provide(tag, context))
      const service = yield* backend
      yield* Scope.close(inner, Exit.void)
      // what the conformance suite checks of every backend, and here also that it names the ensemble
      for (const { error, operation } of yield* Conformance.callEveryOperation(service, "k")) {
        assert.isTrue(error instanceof LockError.BackendError && LockError.isBackendClosed(error), `${operation}: ${String(error)}`)
        assert.strictEqual((error as LockError.BackendError).endpoint, `ZooKeeper ${server!.connectionString}`)
      }
    }))

  it.scopedLive("a borrowed client: the backend waits for its session and leaves it open", () =>
    Effect.gen(function*() {
      const client = Zk.createClient(server!.connectionString)
      client.connect()
      yield* Effect.addFinalizer(() => Effect.sync(() => client.close()))
      const inner = yield* Scope.make()
      const context = yield* Layer.buildWithScope(ZooKeeperBackend.layer({ client, namespace: `/b-${crypto.randomUUID()}` }), inner)
      const fence = yield* Effect.flatMap(Lock.make("k"), (lock) => Effect.scoped(Effect.map(Lock.acquire(lock), (l) => l.fence)))
        .pipe(Effect.provide(context))
      assert.isAbove(fence, 0)
      yield* Scope.close(inner, Exit.void)
      assert.strictEqual(client.getState(), Zk.State.SYNC_CONNECTED)
    }))
})
