/**
 * Durations as a command line spells them: `500ms`, `10s`, `2m`, `1h`, `1.5s`, or a bare number of
 * seconds (as `flock -w` takes them); Effect's own spelling (`"10 seconds"`) is accepted too.
 */
import { Duration, Either } from "effect"

const units: Record<string, number> = {
  ms: 1,
  millis: 1,
  millisecond: 1,
  milliseconds: 1,
  s: 1000,
  sec: 1000,
  second: 1000,
  seconds: 1000,
  m: 60_000,
  min: 60_000,
  minute: 60_000,
  minutes: 60_000,
  h: 3_600_000,
  hour: 3_600_000,
  hours: 3_600_000
}

/** The duration `text` spells, or why it is none. Zero is refused unless `allowZero`. */
export const parse = (flag: string, text: string, allowZero = false): Either.Either<Duration.Duration, string> => {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text)
  const bad = `${flag}: "${text}" is not a duration (examples: 500ms, 10s, 2m, 1h; a bare number is seconds)`
  if (match === null) return Either.left(bad)
  const factor = match[2] === "" ? 1000 : units[match[2]!.toLowerCase()]
  if (factor === undefined) return Either.left(bad)
  const millis = Number(match[1]) * factor
  if (!Number.isFinite(millis) || (!allowZero && millis <= 0)) return Either.left(`${flag}: the duration must be positive, not "${text}"`)
  return Either.right(Duration.millis(millis))
}
