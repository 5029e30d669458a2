/**
 * `@lockstep/zookeeper`: the ZooKeeper backend of lockstep.
 *
 * @since 0.1.0
 */

/**
 * The ZooKeeper backend: ephemeral sequential nodes, fences from the ensemble's zxids.
 *
 * @since 0.1.0
 */
export * as ZooKeeperBackend from "./ZooKeeperBackend.js"
