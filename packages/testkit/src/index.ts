/**
 * Test tools for lockstep backends, importable outside any test runner. The conformance suite,
 * which registers vitest tests, is on its own subpath: `@lockstep/testkit/Conformance`.
 *
 * @since 0.1.0
 */

/**
 * Deliberately broken backends for negative tests.
 *
 * @since 0.1.0
 */
export * as FaultyBackend from "./FaultyBackend.js"

/**
 * A history checker for lock tests: mutual exclusion, permits, fences, well-formedness.
 *
 * @since 0.1.0
 */
export * as History from "./History.js"

/**
 * A pure reference model of the backend rules.
 *
 * @since 0.1.0
 */
export * as Model from "./Model.js"

/**
 * Model-based property tests of a backend against `Model`.
 *
 * @since 0.1.0
 */
export * as ModelCheck from "./ModelCheck.js"
