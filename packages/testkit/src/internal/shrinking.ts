/**
 * Generation and shrinking of fast-check values driven from Effect, so that properties whose
 * checks are Effects (against a real backend) shrink without leaving Effect.
 *
 * @since 0.1.0
 * @internal
 */
import { Effect, Either, FastCheck as fc } from "effect"

/** An arbitrary producing the inner arbitrary's `Value`s (value and shrinking context). */
class WithContext<T> extends fc.Arbitrary<fc.Value<T>> {
  constructor(private readonly inner: fc.Arbitrary<T>) {
    super()
  }
  generate(mrng: fc.Random, biasFactor: number | undefined): fc.Value<fc.Value<T>> {
    return new fc.Value(this.inner.generate(mrng, biasFactor), undefined)
  }
  canShrinkWithoutContext(_value: unknown): _value is fc.Value<T> {
    return false
  }
  shrink(): fc.Stream<fc.Value<fc.Value<T>>> {
    return fc.Stream.nil()
  }
}

/** `numRuns` values of `arbitrary` for `seed`, with their shrinking contexts (same bias as `fc.assert`). */
export const sample = <T>(arbitrary: fc.Arbitrary<T>, seed: number, numRuns: number): ReadonlyArray<fc.Value<T>> =>
  fc.sample(new WithContext(arbitrary), { seed, numRuns })

/** The smallest failing value found. */
export interface Shrunk<T, E> {
  readonly value: T
  readonly error: E
  /** Successful shrink steps. */
  readonly shrinks: number
  /** Candidates tried. */
  readonly attempts: number
}

/**
 * Shrinks a failing value the way fast-check does: walk its shrink candidates, move to the first
 * one that still fails, repeat until no candidate fails (or `maxAttempts` candidates were tried).
 */
export const shrink = <T, E, R>(
  arbitrary: fc.Arbitrary<T>,
  failing: fc.Value<T>,
  error: E,
  test: (value: T) => Effect.Effect<void, E, R>,
  maxAttempts: number
): Effect.Effect<Shrunk<T, E>, never, R> =>
  Effect.gen(function*() {
    let current = failing
    let currentError = error
    let shrinks = 0
    let attempts = 0
    let improved = true
    while (improved && attempts < maxAttempts) {
      improved = false
      for (const candidate of arbitrary.shrink(current.value_, current.context)) {
        if (attempts >= maxAttempts) break
        attempts++
        const outcome = yield* Effect.either(test(candidate.value))
        if (Either.isLeft(outcome)) {
          current = candidate
          currentError = outcome.left
          shrinks++
          improved = true
          break
        }
      }
    }
    return { value: current.value, error: currentError, shrinks, attempts }
  })
