/**
 * The pure reference model of the backend rules that backends are checked against: the rules of
 * `@lockstep/core/Rules`, under the name the test tools use.
 *
 * @since 0.1.0
 */
export * from "@lockstep/core/Rules"
