/**
 * `@lockstep/redis`: the Redis backend of lockstep, on ioredis.
 *
 * @since 0.1.0
 */

/**
 * The Redis backend: a server, a Cluster or Sentinel, through ioredis.
 *
 * @since 0.1.0
 */
export * as RedisBackend from "./RedisBackend.js"
