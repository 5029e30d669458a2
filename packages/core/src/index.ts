/**
 * lockstep: distributed locks for Effect.
 *
 * @since 0.1.0
 */

/**
 * @since 0.1.0
 */
export * as BackendKit from "./BackendKit.js"

/**
 * @since 0.1.0
 */
export * as CountDownLatch from "./CountDownLatch.js"

/**
 * @since 0.1.0
 */
export * as FairLock from "./FairLock.js"

/**
 * @since 0.1.0
 */
export * as Lease from "./Lease.js"

/**
 * @since 0.1.0
 */
export * as Lock from "./Lock.js"

/**
 * @since 0.1.0
 */
export * as LockBackend from "./LockBackend.js"

/**
 * @since 0.1.0
 */
export * as LockError from "./LockError.js"

/**
 * @since 0.1.0
 */
export * as LockMetrics from "./LockMetrics.js"

/**
 * @since 0.1.0
 */
export * as MultiLock from "./MultiLock.js"

/**
 * @since 0.1.0
 */
export * as ReadWriteLock from "./ReadWriteLock.js"

/**
 * @since 0.1.0
 */
export * as Semaphore from "./Semaphore.js"

/**
 * @since 0.1.0
 */
export * as RedLock from "./RedLock.js"

/**
 * The backend rules as pure functions over immutable state.
 *
 * @since 0.1.0
 */
export * as Rules from "./Rules.js"
