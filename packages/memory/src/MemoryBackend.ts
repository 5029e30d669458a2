/**
 * The in-process lockstep backend. Locks live in this process's memory and expiry is judged on
 * Effect's `Clock`, so `TestClock` drives lease expiry in tests. Useful for tests, for single-process
 * applications, and as the reference interpreter of the rules in `LockBackend`.
 *
 * @since 0.1.0
 */
import { Effect, Layer } from "effect"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { Service } from "@lockstep/core/LockBackend"
import * as internal from "./internal/memoryBackend.js"

/**
 * Creates a fresh, empty in-memory backend with its own random `clientId`. Two backends made this
 * way share no state: locks taken through one do not exclude holders of the other.
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const program = Effect.gen(function* () {
 *   const backend = yield* MemoryBackend.make
 *   const result = yield* backend.acquire({
 *     key: "orders:42",
 *     holder: `${backend.clientId}:1`,
 *     mode: "exclusive",
 *     permits: 1,
 *     limit: 1,
 *     leaseMs: 30_000,
 *     fair: false,
 *     waiterTtlMs: 5_000,
 *     count: 1
 *   })
 *   console.log(result._tag) // "Granted"
 * })
 * ```
 *
 * @since 0.1.0
 * @category constructors
 */
export const make: Effect.Effect<Service> = Effect.sync(() => internal.unsafeMake(crypto.randomUUID()).service)

/**
 * Provides `LockBackend` with a fresh in-memory backend (one per layer build). When the layer's
 * scope closes, the backend closes with it: its state is dropped, waiters blocked on it fail, and
 * a handle made under it answers every call with a `BackendError` whose cause is
 * `LockError.BackendClosed` (`LockError.isBackendClosed`).
 *
 * @example
 * ```ts
 * import { Effect } from "effect"
 * import { LockBackend } from "@lockstep/core"
 * import { MemoryBackend } from "@lockstep/memory"
 *
 * const program = Effect.gen(function* () {
 *   const backend = yield* LockBackend.LockBackend
 *   return yield* backend.inspect("orders:42")
 * }).pipe(Effect.provide(MemoryBackend.layer))
 * ```
 *
 * @since 0.1.0
 * @category layers
 */
export const layer: Layer.Layer<LockBackend> = Layer.scoped(
  LockBackend,
  Effect.map(
    Effect.acquireRelease(Effect.sync(() => internal.unsafeMake(crypto.randomUUID())), (backend) => Effect.sync(backend.close)),
    (backend) => backend.service
  )
)
