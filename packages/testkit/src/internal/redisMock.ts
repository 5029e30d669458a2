import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import type { Redis } from "ioredis"
import IORedisMock from "ioredis-mock"
import { LockBackend } from "@lockstep/core/LockBackend"
import * as RedisBackend from "@lockstep/redis/RedisBackend"
import { DataLoss } from "../FaultyBackend.js"

// ---------------------------------------------------------------------------------------------
// the clock of TIME
// ---------------------------------------------------------------------------------------------

// ioredis-mock (8.x) answers TIME with
//   [Math.round(new Date().getTime() / 1000), Math.round(process.hrtime()[1] / 1000)]:
// the wall clock's seconds, rounded, beside the sub-second part of an unrelated monotonic clock.
// Its command table is module-level (scripts reach TIME through it, not through the client), so
// the way in is process.hrtime: while the clock is installed, `process.hrtime()` reads the wall
// clock as a pair whose nanoseconds complete the rounded seconds, and TIME then adds up to the
// wall clock in microseconds (whole milliseconds; the microseconds field is negative when the
// seconds were rounded up: seconds * 1e6 + microseconds is the time).
//
// The two halves of TIME are two readings. When the clock passes the half second between them
// (where the rounding of the seconds flips), they would disagree by a second. So
// Date.prototype.getTime is wrapped too (it answers as before) to keep its last answer, and a
// reading of process.hrtime() right after it completes the seconds of that Date.

type HrtimeReading = [number, number]

interface Hrtime {
  (time?: HrtimeReading): HrtimeReading
  bigint(): bigint
}

interface ClockState {
  readonly hrtime: Hrtime
  readonly getTime: (this: Date) => number
  readonly installedHrtime: Hrtime
  readonly installedGetTime: (this: Date) => number
  users: number
}

// on globalThis: every copy of this module (ES module and CommonJS builds) counts the same users
const stateKey = Symbol.for("@lockstep/testkit/RedisMock/clock")
const registry = globalThis as unknown as { [stateKey]?: ClockState | undefined }
const host = process as unknown as { hrtime: Hrtime }

const makeClock = (hrtime: Hrtime, getTime: (this: Date) => number): ClockState => {
  // the last answer of getTime, until the next reading of process.hrtime()
  let lastDate: number | undefined
  const installedGetTime = function(this: Date): number {
    const value = getTime.call(this)
    lastDate = value
    return value
  }
  // the readings this clock gave: `process.hrtime(reading)` measures from them on this clock, and
  // from any other value (taken before the clock was installed) on the original one
  const readings = new WeakSet<HrtimeReading>()
  const read = (): HrtimeReading => {
    const now = Date.now()
    const date = lastDate
    lastDate = undefined
    // the seconds ioredis-mock took from the Date it read just before (a Date of the last second),
    // and the nanoseconds that complete them to now: the pair adds up to now in any case
    const seconds = Math.round(date !== undefined && now - date >= 0 && now - date < 1000 ? date / 1000 : now / 1000)
    const reading: HrtimeReading = [seconds, (now - seconds * 1000) * 1_000_000]
    readings.add(reading)
    return reading
  }
  const installedHrtime = Object.assign(
    (time?: HrtimeReading): HrtimeReading => {
      if (time === undefined) return read()
      if (!readings.has(time)) return hrtime(time)
      const [seconds, nanos] = read()
      const elapsed = (seconds - time[0]) * 1e9 + (nanos - time[1])
      const whole = Math.floor(elapsed / 1e9)
      return [whole, elapsed - whole * 1e9]
    },
    { bigint: () => hrtime.bigint() }
  )
  return { hrtime, getTime, installedHrtime, installedGetTime, users: 0 }
}

const installClockNow = (): void => {
  let state = registry[stateKey]
  if (state === undefined) {
    state = makeClock(host.hrtime, Date.prototype.getTime)
    registry[stateKey] = state
    host.hrtime = state.installedHrtime
    Date.prototype.getTime = state.installedGetTime
  }
  state.users += 1
}

const uninstallClockNow = (): void => {
  const state = registry[stateKey]
  if (state === undefined) return
  state.users -= 1
  if (state.users > 0) return
  registry[stateKey] = undefined
  // replaced since by someone else: theirs stays
  if (host.hrtime === state.installedHrtime) host.hrtime = state.hrtime
  if (Date.prototype.getTime === state.installedGetTime) Date.prototype.getTime = state.getTime
}

/** @internal */
export const installClock: Effect.Effect<void, never, Scope.Scope> = Effect.acquireRelease(
  Effect.sync(installClockNow),
  () => Effect.sync(uninstallClockNow)
)

// ---------------------------------------------------------------------------------------------
// clients and layers
// ---------------------------------------------------------------------------------------------

// ioredis-mock keeps one dataset per `host:port/db` for the life of the process, shared by every
// instance made with the same three: a host name of its own gives each client a dataset of its own
// (numbered on globalThis: ioredis-mock is loaded once, whichever copies of this module use it)
const clientsKey = Symbol.for("@lockstep/testkit/RedisMock/clients")
const counters = globalThis as unknown as { [clientsKey]?: number | undefined }
const nextHost = (): string => {
  const n = (counters[clientsKey] ?? 0) + 1
  counters[clientsKey] = n
  return `ioredis-mock-${n}`
}

/** @internal */
export const client: Effect.Effect<Redis, never, Scope.Scope> = Effect.zipRight(
  installClock,
  Effect.acquireRelease(
    Effect.sync(() => new IORedisMock({ host: nextHost() })),
    (mock) =>
      Effect.promise(() => mock.flushall()).pipe(
        Effect.ensuring(Effect.sync(() => mock.disconnect()))
      )
  )
)

/** @internal */
export const layer: Layer.Layer<LockBackend> = Layer.scoped(
  LockBackend,
  // the mock has no maxmemory: its eviction check cannot refuse it
  Effect.flatMap(client, (mock) => Effect.orDie(RedisBackend.make({ client: mock })))
)

/** @internal */
export const layerDataLoss: Layer.Layer<LockBackend | DataLoss> = Layer.scopedContext(Effect.gen(function*() {
  const mock = yield* client
  const backend = yield* Effect.orDie(RedisBackend.make({ client: mock }))
  const wipe = Effect.asVoid(Effect.promise(() => mock.flushall()))
  return Context.make(LockBackend, backend).pipe(Context.add(DataLoss, { wipe }))
}))
