/**
 * `@lockstep/memory`: the in-process backend of lockstep.
 *
 * @since 0.1.0
 */

/**
 * The in-process lockstep backend, driven by Effect's `Clock`.
 *
 * @since 0.1.0
 */
export * as MemoryBackend from "./MemoryBackend.js"
