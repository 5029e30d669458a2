/**
 * The Redis backend (`@lockstep/redis`) on [ioredis-mock](https://github.com/stipsan/ioredis-mock),
 * for fast unit tests without a server: ioredis-mock keeps the data in the process and runs the
 * backend's Lua scripts in a Lua VM of its own. `layer` is a `LockBackend` on a fresh mock;
 * `client` is the mock itself, for a backend with options of your own or to look at the keys.
 *
 * The mock's clock is the wall clock (`Date.now()`, in whole milliseconds), for key expiry as for
 * `TIME`, the clock the scripts judge leases on: Effect's `TestClock` does not move it, so tests
 * on the mock run on the live clock with short leases (`it.live`; for the conformance suite,
 * `clock: "live"`). ioredis-mock's own `TIME` pairs the rounded seconds of the wall clock with the
 * sub-second part of `process.hrtime()`, an unrelated clock; `installClock` makes the two agree
 * for as long as a mock is open (`client` and the layers install it themselves), process-wide,
 * and puts everything back afterwards.
 *
 * This module imports `ioredis-mock` and `@lockstep/redis` (optional peers of the testkit), so it
 * is only on its own subpath, `@lockstep/testkit/RedisMock`, never the root of the testkit.
 *
 * @since 0.1.0
 */
import type { Effect, Layer, Scope } from "effect"
import type { Redis } from "ioredis"
import type { LockBackend } from "@lockstep/core/LockBackend"
import type { DataLoss } from "./FaultyBackend.js"
import * as internal from "./internal/redisMock.js"

/**
 * Makes ioredis-mock's `TIME` read the wall clock, consistently, until the scope closes: the
 * seconds and microseconds it answers then add up to `Date.now()` in microseconds (a whole number
 * of milliseconds; the microseconds field is negative when the seconds were rounded up, as
 * ioredis-mock rounds them), so the server clock never steps back. ioredis-mock's commands are
 * shared by all its instances, so this is process-wide: it replaces `process.hrtime` (its
 * `bigint` is Node's own) and wraps `Date.prototype.getTime` (which answers as before; TIME takes
 * its seconds from a `Date`, and the reading of `process.hrtime()` that follows completes them),
 * and puts both back when the last scope that installed it closes; nested and concurrent scopes
 * share one installation.
 *
 * While it is installed, `process.hrtime()` reads the wall clock in whole milliseconds, and
 * `process.hrtime(time)` measures from such a reading on that clock (and from any earlier reading
 * on Node's clock, as before). `client`, `layer` and `layerDataLoss` install it for their own
 * lifetime: call it yourself only for mocks made in other ways.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import IORedisMock from "ioredis-mock"
 * import * as RedisMock from "@lockstep/testkit/RedisMock"
 *
 * const serverTime = Effect.gen(function* () {
 *   yield* RedisMock.installClock
 *   const [seconds, micros] = yield* Effect.promise(() => new IORedisMock().time())
 *   return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000) // ms, as Date.now()
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category clock
 */
export const installClock: Effect.Effect<void, never, Scope.Scope> = internal.installClock

/**
 * A fresh ioredis-mock client with a dataset of its own (ioredis-mock shares data between
 * instances made with the same host, port and db; each client gets a host name of its own,
 * `ioredis-mock-<n>`), with the clock installed (`installClock`). Closing the scope empties its
 * dataset (FLUSHALL) and disconnects it. Its `duplicate()`s share its data, as connections to one
 * server do.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 * import { RedisBackend } from "@lockstep/redis"
 * import * as RedisMock from "@lockstep/testkit/RedisMock"
 *
 * // a backend with options of its own, and a look at the keys it wrote
 * const program = Effect.gen(function* () {
 *   const client = yield* RedisMock.client
 *   yield* Effect.gen(function* () {
 *     const lock = yield* Lock.make("jobs:nightly")
 *     yield* Lock.withLock(Effect.void, lock)
 *   }).pipe(Effect.provide(RedisBackend.layer({ client, commandTimeout: "500 millis" })))
 *   return yield* Effect.promise(() => client.keys("*")) // the fence counter, ...
 * }).pipe(Effect.scoped)
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const client: Effect.Effect<Redis, never, Scope.Scope> = internal.client

/**
 * `LockBackend` on a fresh `client` (the Redis backend with its defaults): each build of the
 * layer has its own data, and the clock is installed for the layer's lifetime. Expiry follows
 * the wall clock: run the tests that use it on the live clock.
 *
 * @example
 * ```ts
 * import { assert, it } from "@effect/vitest"
 * import { Effect } from "effect"
 * import { Lock } from "@lockstep/core"
 * import * as RedisMock from "@lockstep/testkit/RedisMock"
 *
 * it.live("a lock on the Redis backend", () =>
 *   Effect.gen(function* () {
 *     const lock = yield* Lock.make("orders:42")
 *     const fence = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
 *     assert.isTrue(fence > 0)
 *   }).pipe(Effect.provide(RedisMock.layer)))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<LockBackend> = internal.layer

/**
 * `layer` with `FaultyBackend.DataLoss`, whose `wipe` empties the mock (FLUSHALL) under the
 * running backend, as a Redis server restarted without persistence loses its keys; the
 * conformance suite's `dataLoss` option takes it.
 *
 * @example
 * ```ts
 * import * as Conformance from "@lockstep/testkit/Conformance"
 * import * as RedisMock from "@lockstep/testkit/RedisMock"
 *
 * Conformance.suite({
 *   name: "ioredis-mock",
 *   layer: RedisMock.layer,
 *   dataLoss: RedisMock.layerDataLoss,
 *   clock: "live"
 * })
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layerDataLoss: Layer.Layer<LockBackend | DataLoss> = internal.layerDataLoss
