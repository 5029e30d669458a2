/**
 * @lockstep/redis: the Redis backend (in progress; the package is reserved and exports nothing yet).
 *
 * @since 0.1.0
 */
export {}
