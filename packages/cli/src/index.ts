/**
 * lockstep on the command line: `lockstep run KEY -- COMMAND`, `status`, `release --force`, `latch`.
 *
 * @since 0.1.0
 */

/**
 * @since 0.1.0
 */
export * as Cli from "./Cli.js"
