/**
 * lockstep on the command line: `lockstep run KEY -- COMMAND`, `status`, `release --force`, `latch`.
 *
 * @since 0.1.0
 */

/**
 * The `lockstep` command line as an effect.
 *
 * @since 0.1.0
 */
export * as Cli from "./Cli.js"
