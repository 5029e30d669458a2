import { Duration, Effect, Option } from "effect"
import { InvalidLockOptions } from "../LockError.js"

/** Effect's clock never fires a timer set further out than 2^31 - 1 ms. */
const maxMillis = 2 ** 31 - 1

const invalid = (field: string, reason: string) => Effect.fail(new InvalidLockOptions({ field, reason }))

/** A high surrogate not followed by a low one, or a low one not preceded by a high one. */
const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/** A control character (Unicode's Cc: C0, DEL and C1). */
const controlCharacter = /[\u0000-\u001F\u007F-\u009F]/

/** Longest key accepted: keeps keys cheap to hash and to log. */
const maxKeyLength = 1024

/**
 * Longest key accepted in UTF-8 bytes, as servers store it: MySQL's key column (the longest InnoDB
 * index, less the holder id's share), which a longer key would overflow or be truncated to.
 */
const maxKeyBytes = 2816

const utf8 = new TextEncoder()

/** The length of `text` in UTF-8 (only long keys are measured: it copies them). */
const utf8Length = (text: string): number => utf8.encode(text).length

/**
 * Why `input` cannot name anything on a backend (`undefined`: it can). A lone surrogate is no
 * character: UTF-8 (Redis, every SQL driver) writes it as U+FFFD, so "k\uD800" and "k\uDC00"
 * would name one lock on the server and two in the client. A control character is refused: NUL
 * ends a string for C drivers and PostgreSQL's text refuses it, and the others make keys that
 * logs, metrics and terminals show wrongly.
 */
const textProblem = (input: string): string | undefined => {
  if (loneSurrogate.test(input)) return "must be well-formed text (it has a lone UTF-16 surrogate)"
  const control = controlCharacter.exec(input)
  if (control !== null) {
    const code = control[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")
    return `must not contain control characters (U+${code} at ${control.index})`
  }
  return undefined
}

/**
 * A key names a lock on every backend. Braces are refused because the Redis backend wraps the key
 * in a `{key}` hash tag so all of a lock's Redis keys share one cluster slot.
 */
export const key = (input: unknown): Effect.Effect<string, InvalidLockOptions> => {
  if (typeof input !== "string") return invalid("key", "must be a string")
  if (input.length === 0) return invalid("key", "must not be empty")
  if (input.length > maxKeyLength) return invalid("key", `must be at most ${maxKeyLength} characters`)
  if (input.includes("{") || input.includes("}")) return invalid("key", "must not contain '{' or '}'")
  const problem = textProblem(input)
  if (problem !== undefined) return invalid("key", problem)
  // every UTF-16 unit is at most 3 bytes of UTF-8: only long keys need counting
  if (input.length * 3 > maxKeyBytes && utf8Length(input) > maxKeyBytes) {
    return invalid("key", `must be at most ${maxKeyBytes} bytes in UTF-8, got ${utf8Length(input)}`)
  }
  return Effect.succeed(input)
}

/** A handle's metric name: a short label value, the same for every handle of one purpose. */
export const name = (input: unknown): Effect.Effect<string | undefined, InvalidLockOptions> => {
  if (input === undefined) return Effect.succeed(undefined)
  if (typeof input !== "string" || input.length === 0 || input.length > 128) {
    return invalid("name", "must be a non-empty string of at most 128 characters")
  }
  const problem = textProblem(input)
  if (problem !== undefined) return invalid("name", problem)
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
