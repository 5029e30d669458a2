/**
 * The examples' Redis: the machine's own (`REDIS_URL`, default `redis://127.0.0.1:6379`), with
 * every key and channel of a run under a namespace no other run uses (the client's `keyPrefix`),
 * deleted once the run's backend has closed. Nothing here is needed in an application: it keeps
 * the examples from touching, or leaving behind, anything of yours.
 */
import { Console, Effect, Layer } from "effect"
import { Redis } from "ioredis"
import type { LockBackend, LockError } from "@lockstep/core"
import { RedisBackend } from "@lockstep/redis"

export const redisUrl = process.env["REDIS_URL"] ?? "redis://127.0.0.1:6379"

/** A namespace of the run's own: `lockstep-example:<example>:<random>:`. */
export const runNamespace = (example: string): string =>
  `lockstep-example:${example}:${crypto.randomUUID().slice(0, 8)}:`

/** The Redis backend with every key and channel under `namespace`. */
export const redisBackend = (namespace: string): Layer.Layer<LockBackend.LockBackend, LockError.BackendError> =>
  RedisBackend.layerFrom({ url: redisUrl, options: { keyPrefix: namespace } })

/** Deletes every key under `namespace` (SCAN and DEL) and says how many there were. */
export const deleteKeys = (namespace: string): Effect.Effect<void> =>
  Effect.promise(async () => {
    const client = new Redis(redisUrl)
    try {
      let deleted = 0
      for await (const keys of client.scanStream({ match: `${namespace}*`, count: 500 })) {
        if ((keys as Array<string>).length > 0) deleted += await client.del(...(keys as Array<string>))
      }
      return deleted
    } finally {
      client.disconnect()
    }
  }).pipe(Effect.flatMap((deleted) => Console.log(`(deleted the run's ${deleted} Redis keys under ${namespace})`)))

/**
 * `redisBackend(namespace)`, and once it has closed (every lock released), the namespace's keys
 * deleted: built before the backend, the cleanup's finalizer runs after the backend's.
 */
export const redisLocks = (namespace: string): Layer.Layer<LockBackend.LockBackend, LockError.BackendError> =>
  redisBackend(namespace).pipe(Layer.provide(Layer.scopedDiscard(Effect.addFinalizer(() => deleteKeys(namespace)))))
