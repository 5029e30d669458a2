import { Duration, Effect, Option } from "effect"
import { InvalidLockOptions } from "../LockError.js"

/** Effect's clock never fires a timer set further out than 2^31 - 1 ms. */
const maxMillis = 2 ** 31 - 1

const invalid = (field: string, reason: string) => Effect.fail(new InvalidLockOptions({ field, reason }))

/** A high surrogate not followed by a low one, or a low one not preceded by a high one. */
const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/** Longest key accepted: keeps keys cheap to hash and to log. */
const maxKeyLength = 1024

/**
 * A key names a lock on every backend. Braces are refused because the Redis backend wraps the key
 * in a `{key}` hash tag so all of a lock's Redis keys share one cluster slot.
 */
export const key = (input: unknown): Effect.Effect<string, InvalidLockOptions> => {
  if (typeof input !== "string") return invalid("key", "must be a string")
  if (input.length === 0) return invalid("key", "must not be empty")
  if (input.length > maxKeyLength) return invalid("key", `must be at most ${maxKeyLength} characters`)
  if (input.includes("{") || input.includes("}")) return invalid("key", "must not contain '{' or '}'")
  // a lone surrogate is no character: UTF-8 (Redis, every SQL driver) writes it as U+FFFD, so
  // "k\uD800" and "k\uDC00" would name one lock on the server and two in the client
  if (loneSurrogate.test(input)) return invalid("key", "must be well-formed text (it has a lone UTF-16 surrogate)")
  return Effect.succeed(input)
}

/** A handle's metric name: a short label value, the same for every handle of one purpose. */
export const name = (input: unknown): Effect.Effect<string | undefined, InvalidLockOptions> => {
  if (input === undefined) return Effect.succeed(undefined)
  if (typeof input !== "string" || input.length === 0 || input.length > 128) {
    return invalid("name", "must be a non-empty string of at most 128 characters")
  }
  return Effect.succeed(input)
}

/**
 * A positive duration in whole milliseconds. `Duration.decode` silently clamps NaN and negative
 * numbers to zero, so raw numbers are checked before decoding.
 */
export const millis = (
  field: string,
  input: unknown,
  options?: { readonly allowInfinite?: boolean; readonly minMillis?: number }
): Effect.Effect<number, InvalidLockOptions> => {
  if (typeof input === "number" && Number.isNaN(input)) return invalid(field, "must not be NaN")
  if (typeof input === "number" && input <= 0) return invalid(field, `must be positive, got ${input}`)
  // decoding clamps negative input to zero: say what was given
  if (isNegative(input)) return invalid(field, `must be positive, got ${formatInput(input)}`)
  const decoded = Duration.decodeUnknown(input)
  if (Option.isNone(decoded)) return invalid(field, `is not a duration: ${String(input)}`)
  const ms = Duration.toMillis(decoded.value)
  if (Number.isNaN(ms)) return invalid(field, "must not be NaN")
  if (ms === Infinity) {
    return options?.allowInfinite === true ? Effect.succeed(Infinity) : invalid(field, "must be finite")
  }
  const whole = Math.floor(ms)
  if (whole < 1) return invalid(field, `must be at least 1 millisecond, got ${Duration.format(decoded.value)}`)
  const min = options?.minMillis ?? 1
  if (whole < min) {
    return invalid(
      field,
      `must be at least ${min} ms, got ${whole} ms: the allowance for clock drift (1% + 5 ms) would leave the lease next to nothing`
    )
  }
  // timers further out than this never fire
  if (whole > maxMillis) return invalid(field, `must be at most ${maxMillis} ms (about 24.8 days)`)
  return Effect.succeed(whole)
}

const isNegative = (input: unknown): boolean => {
  if (typeof input === "bigint") return input < 0n
  if (typeof input === "string") return /^\s*-/.test(input)
  if (Array.isArray(input)) return input.some((part) => typeof part === "number" && part < 0)
  return false
}

const formatInput = (input: unknown): string => (Array.isArray(input) ? `[${input.join(", ")}]` : String(input))

/**
 * The shortest lease or watchdog accepted. Every local deadline gives away 1% + 5 ms for clock
 * drift; below this, a lease would be lost almost as soon as it was granted.
 */
export const minLeaseMillis = 20

/** A whole number of permits, from 1 to `max`. */
export const count = (field: string, input: unknown, max: number): Effect.Effect<number, InvalidLockOptions> => {
  if (typeof input !== "number" || !Number.isInteger(input)) return invalid(field, `must be a whole number, got ${String(input)}`)
  if (input < 1) return invalid(field, `must be at least 1, got ${input}`)
  if (input > max) return invalid(field, `must be at most ${max}, got ${input}`)
  return Effect.succeed(input)
}

/** Optional duration: `undefined` passes through. */
export const optionalMillis = (
  field: string,
  input: unknown,
  options?: { readonly allowInfinite?: boolean; readonly minMillis?: number }
): Effect.Effect<number | undefined, InvalidLockOptions> =>
  input === undefined ? Effect.succeed(undefined) : millis(field, input, options)
