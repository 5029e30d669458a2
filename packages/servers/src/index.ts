/**
 * Real servers for integration tests of lockstep backends, each started in an Effect `Scope` and
 * stopped (its temp dir removed) when the scope closes: `redis-server` (single servers and
 * clusters), Redis Sentinel topologies, ZooKeeper (standalone and ensembles), and a TCP proxy that
 * injects network faults. Importable outside any test runner.
 *
 * @since 0.1.0
 */

/**
 * A Redis primary, replicas behind cuttable proxies, and sentinels, for failover tests.
 *
 * @since 0.1.0
 */
export * as RedisSentinel from "./RedisSentinel.js"

/**
 * Real `redis-server` processes (single servers and 3-master clusters) for tests.
 *
 * @since 0.1.0
 */
export * as RedisServer from "./RedisServer.js"

/**
 * A loopback TCP proxy that resets connections or loses a chosen reply, for network fault tests.
 *
 * @since 0.1.0
 */
export * as TcpProxy from "./TcpProxy.js"

/**
 * Real ZooKeeper servers (standalone and ensembles) for tests.
 *
 * @since 0.1.0
 */
export * as ZooKeeperServer from "./ZooKeeperServer.js"
