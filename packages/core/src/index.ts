/**
 * lockstep: distributed locks for Effect.
 *
 * @since 0.1.0
 */

/**
 * Parts for writing a `LockBackend`: the lifecycle and the waiter signals every backend keeps.
 *
 * @since 0.1.0
 */
export * as BackendKit from "./BackendKit.js"

/**
 * `CountDownLatch`: a distributed countdown that parties await until it reaches 0.
 *
 * @since 0.1.0
 */
export * as CountDownLatch from "./CountDownLatch.js"

/**
 * `FairLock`: a re-entrant mutex that grants in arrival order.
 *
 * @since 0.1.0
 */
export * as FairLock from "./FairLock.js"

/**
 * `Lease`: a granted hold on a lock, released when its scope closes.
 *
 * @since 0.1.0
 */
export * as Lease from "./Lease.js"

/**
 * `Lock`: a re-entrant distributed mutex, and the functions of every lock handle.
 *
 * @since 0.1.0
 */
export * as Lock from "./Lock.js"

/**
 * `LockBackend`: the interface every backend implements, and its rules.
 *
 * @since 0.1.0
 */
export * as LockBackend from "./LockBackend.js"

/**
 * The typed errors of lockstep.
 *
 * @since 0.1.0
 */
export * as LockError from "./LockError.js"

/**
 * The metrics every lock records.
 *
 * @since 0.1.0
 */
export * as LockMetrics from "./LockMetrics.js"

/**
 * `MultiLock`: all of several locks at once, or none.
 *
 * @since 0.1.0
 */
export * as MultiLock from "./MultiLock.js"

/**
 * `ReadWriteLock`: many readers or one writer on one key.
 *
 * @since 0.1.0
 */
export * as ReadWriteLock from "./ReadWriteLock.js"

/**
 * `Semaphore`: `limit` leased permits on one key.
 *
 * @since 0.1.0
 */
export * as Semaphore from "./Semaphore.js"

/**
 * `RedLock`: a lock backend made of N independent backends, for locks that outlive a minority of them.
 *
 * @since 0.1.0
 */
export * as RedLock from "./RedLock.js"

/**
 * The backend rules as pure functions over immutable state.
 *
 * @since 0.1.0
 */
export * as Rules from "./Rules.js"
