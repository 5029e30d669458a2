/**
 * The lease keeper of one backend: a single fiber that watches the local deadline of every live
 * hold of that backend and renews the watchdog-renewed ones, in batches. A hold costs an entry in
 * a heap, not a fiber; the keeper's fiber runs only while it has entries (started by the first,
 * ended after the last), on the clock of the fiber that started it (so TestClock drives it).
 */
import { Clock, Context, DefaultServices, Duration, Effect, Either, FiberId, GlobalValue } from "effect"
import type { Fiber } from "effect"
import type { Service, Subscription } from "../LockBackend.js"
import { recordRenewals } from "./metrics.js"

/** A hold as the keeper sees it. All times are monotonic milliseconds. */
export interface Entry {
  readonly key: string
  readonly holder: string
  /** The watchdog period, or `undefined` for a fixed lease (never renewed). */
  readonly watchdogMs: number | undefined
  /** The local deadline: past it unconfirmed, the hold is lost. */
  deadline: number
  /** When the last confirmed renewal (or the grant) was sent. */
  confirmedAt: number
  /** When the last renewal was sent (-Infinity before any). */
  attemptedAt: number
  /** Set while a renewal of this hold is in flight. */
  renewing: boolean
  /** Set once the keeper must forget the hold (released or lost). */
  done: boolean
  /** When the keeper looks at it next, and where it sits in the keeper's heap (-1: not there). */
  at: number
  index: number
  /** Called once, from the keeper, when the deadline passes or a renewal says the hold is gone. */
  readonly onLost: (reason: "DeadlinePassed" | "NotHeld") => Effect.Effect<void>
}

/** Monotonic milliseconds from Effect's Clock (hrtime-based live, driven by TestClock in tests). */
export const monotonicMillis = Effect.map(Clock.currentTimeNanos, (nanos) => Number(nanos) / 1_000_000)

/**
 * Time given away on every local deadline: the backend's clock may run faster than ours, and a
 * timer may fire late. 1% of the lease plus 5 ms, as Redisson's RedLock allows for clock drift.
 */
export const driftMs = (leaseMs: number) => Math.floor(leaseMs / 100) + 5

/** The live clock: timers of our own run only on it (a TestClock drives the others). */
const liveClock = Context.get(DefaultServices.liveServices, Clock.Clock)

/** Longest single sleep: Effect's clock never fires a timer set further out than 2^31 - 1 ms. */
export const maxSleepMs = 2 ** 31 - 1

/**
 * Waits for the subscription's next wake-up, or at most the least of `bounds` (ms; at least 1,
 * at most `maxSleepMs`): what every waiter does between two looks at the backend. Interruptible
 * as the caller's region is. Where it races two fibers (a subscription without a callback, or a
 * clock other than the live one), both sides are interruptible whatever that region is: the race
 * ends only once the loser is interrupted, and an uninterruptible sleep would hold a woken waiter
 * until the bound.
 */
export const awaitWakeUp = (subscription: Subscription, ...bounds: ReadonlyArray<number>): Effect.Effect<void> => {
  const ms = Math.max(1, Math.ceil(Math.min(...bounds, maxSleepMs)))
  const onWake = subscription.unsafeOnWake
  return Effect.clockWith((clock) =>
    onWake === undefined || clock !== liveClock
      ? Effect.raceFirst(Effect.interruptible(subscription.await), Effect.interruptible(Effect.sleep(ms)))
      // on the live clock, a callback and a timer of our own: a race would fork a fiber for each
      // side (every waiter's every wake-up)
      : Effect.async<void>((resume) => {
        // the callback may run at once (a wake-up was pending), before the timer exists
        const wait: { done: boolean; timer?: ReturnType<typeof setTimeout> } = { done: false }
        const unregister = onWake((resumed) => {
          if (wait.done) return
          wait.done = true
          clearTimeout(wait.timer)
          resume(resumed)
        })
        if (wait.done) return
        wait.timer = setTimeout(() => {
          wait.done = true
          unregister()
          resume(Effect.void)
        }, ms)
        return Effect.sync(() => {
          wait.done = true
          clearTimeout(wait.timer)
          unregister()
        })
      })
  )
}

/** When `entry` next needs the keeper: its deadline, or its renewal if that comes first. */
const dueAt = (entry: Entry): number => {
  if (entry.watchdogMs === undefined || entry.renewing) return entry.deadline
  const intervalMs = entry.watchdogMs / 3
  // renewals fall on a grid shared by all holds with this watchdog, so they leave together
  const quantum = intervalMs / 4
  let next = Math.ceil((entry.confirmedAt + intervalMs * 0.75) / quantum) * quantum
  // after a failed renewal, try again at the next grid point, never in a tight loop
  while (next <= entry.attemptedAt) next += quantum
  return Math.min(next, entry.deadline)
}


/** A binary min-heap of entries by `at`; each entry knows its index, so it can be moved or removed. */
export class Heap {
  private readonly entries: Array<Entry> = []
  get size() {
    return this.entries.length
  }
  peek(): Entry | undefined {
    return this.entries[0]
  }
  /** Puts `entry` at time `at`, or moves it there if it is in already. */
  set(entry: Entry, at: number) {
    if (entry.index < 0) {
      entry.at = at
      entry.index = this.entries.length
      this.entries.push(entry)
      this.up(entry.index)
    } else {
      const earlier = at < entry.at
      entry.at = at
      if (earlier) this.up(entry.index)
      else this.down(entry.index)
    }
  }
  remove(entry: Entry) {
    const i = entry.index
    if (i < 0) return
    entry.index = -1
    const last = this.entries.pop()!
    if (last === entry) return
    this.entries[i] = last
    last.index = i
    this.up(i)
    this.down(last.index)
  }
  private up(i: number) {
    const entries = this.entries
    const entry = entries[i]!
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (entries[parent]!.at <= entry.at) break
      const moved = entries[parent]!
      entries[i] = moved
      moved.index = i
      i = parent
    }
    entries[i] = entry
    entry.index = i
  }
  private down(i: number) {
    const entries = this.entries
    const entry = entries[i]!
    while (true) {
      const left = 2 * i + 1
      if (left >= entries.length) break
      const right = left + 1
      const child = right < entries.length && entries[right]!.at < entries[left]!.at ? right : left
      if (entries[child]!.at >= entry.at) break
      const moved = entries[child]!
      entries[i] = moved
      moved.index = i
      i = child
    }
    entries[i] = entry
    entry.index = i
  }
}

/** The keeper of one backend. */
export interface Keeper {
  /** Starts watching `entry` (and the keeper's fiber, if it is not running). */
  readonly add: (entry: Entry) => Effect.Effect<void>
  /** Forgets `entry`: no more renewals, no deadline. */
  readonly remove: (entry: Entry) => void
}

const keepers = GlobalValue.globalValue(
  Symbol.for("@lockstep/core/keepers"),
  () => new WeakMap<Service, Keeper>()
)

/** The keeper of `backend` (one per backend instance). */
export const keeperOf = (backend: Service): Keeper => {
  let keeper = keepers.get(backend)
  if (keeper === undefined) {
    keeper = makeKeeper(backend)
    keepers.set(backend, keeper)
  }
  return keeper
}

const makeKeeper = (backend: Service): Keeper => {
  const heap = new Heap()
  let live = 0
  /** Whether a loop fiber exists (running, or sleeping in `sleeper`). */
  let running = false
  /** The loop fiber while it sleeps, and until when. */
  let sleeper: Fiber.RuntimeFiber<unknown, unknown> | undefined
  let sleepingUntil = Infinity
  /** Bumped when a loop is replaced: an older loop stops and leaves the state alone. */
  let generation = 0
  /** The loop's timer while it sleeps on the live clock: it keeps the process alive only while holds are live. */
  let timer: ReturnType<typeof setTimeout> | undefined

  /**
   * The loop's sleep. On the live clock it is a timer of its own, so that once the last hold is
   * gone (the loop sleeps on, for the next hold) the timer stops keeping the process alive: a
   * program that released its locks exits at once, not at the next renewal time.
   */
  const sleep = (ms: number): Effect.Effect<void> =>
    Effect.clockWith((clock) =>
      clock !== liveClock
        ? Effect.sleep(Duration.millis(ms))
        : Effect.async<void>((resume) => {
          const own = setTimeout(() => {
            if (timer === own) timer = undefined
            resume(Effect.void)
          }, ms)
          timer = own
          if (live === 0) own.unref()
          return Effect.sync(() => {
            clearTimeout(own)
            if (timer === own) timer = undefined
          })
        })
    )

  const schedule = (entry: Entry): number => {
    const at = dueAt(entry)
    heap.set(entry, at)
    return at
  }

  /**
   * Something is due before the sleeping loop would look again: replace it. (The loop sleeps in a
   * plain `Effect.sleep` taken right after reading the clock: a race against a wake-up signal
   * would fork fibers, and a TestClock moved in between would be read late.)
   */
  const wakeAt = (at: number): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (sleeper === undefined || at >= sleepingUntil) return Effect.void
      const old = sleeper
      sleeper = undefined
      sleepingUntil = Infinity
      generation++
      old.unsafeInterruptAsFork(FiberId.none)
      return startLoop()
    })

  /**
   * A new loop fiber. Interruptible, whoever starts it (a grant runs uninterruptibly): replacing a
   * sleeping loop interrupts it, which must cancel its timer rather than leave it running.
   */
  const startLoop = () => Effect.asVoid(Effect.forkDaemon(Effect.interruptible(loop(generation))))

  const renew = (batch: ReadonlyArray<Entry>, sentAt: number) =>
    backend.renew(batch.map((entry) => ({ key: entry.key, holder: entry.holder, leaseMs: entry.watchdogMs! }))).pipe(
      Effect.either,
      Effect.zip(monotonicMillis),
      Effect.flatMap(([answers, answeredAt]) => {
        let earliest = Infinity
        const counts = { renewed: 0, notHeld: 0, failed: 0 }
        return Effect.zipRight(
          Effect.forEach(batch, (entry, i) => {
            entry.renewing = false
            const answer = Either.isLeft(answers) ? undefined : answers.right[i]
            if (answer === undefined || Either.isLeft(answer)) counts.failed++
            else if (answer.right) counts.renewed++
            else counts.notHeld++
            // a renewal that arrives after the deadline passed must not bring the hold back
            if (entry.done) return Effect.void
            if (answer !== undefined && Either.isRight(answer)) {
              if (!answer.right) return entry.onLost("NotHeld")
              entry.confirmedAt = sentAt
              entry.deadline = Math.max(entry.deadline, sentAt + entry.watchdogMs! - driftMs(entry.watchdogMs!))
            }
            // any other failure is retried at the next grid point, until the deadline decides
            earliest = Math.min(earliest, schedule(entry))
            return Effect.void
          }, { discard: true }),
          Effect.suspend(() => {
            recordRenewals((answeredAt - sentAt) / 1000, counts)
            return wakeAt(earliest)
          })
        )
      })
    )

  const loop = (self: number): Effect.Effect<void> =>
    Effect.gen(function*() {
      while (live > 0 && self === generation) {
        const now = yield* monotonicMillis
        const batch: Array<Entry> = []
        while (heap.size > 0 && heap.peek()!.at <= now) {
          const entry = heap.peek()!
          if (now >= entry.deadline) {
            heap.remove(entry)
            // forked: a lost hold's release must not hold up the others' deadlines
            yield* Effect.forkDaemon(entry.onLost("DeadlinePassed"))
            continue
          }
          entry.renewing = true
          entry.attemptedAt = now
          schedule(entry)
          batch.push(entry)
        }
        // forked: deadlines keep being watched while a renewal is in flight
        if (batch.length > 0) yield* Effect.forkDaemon(renew(batch, now))
        if (live === 0 || self !== generation) break
        const next = heap.size > 0 ? heap.peek()!.at : Infinity
        yield* Effect.withFiberRuntime((fiber) => {
          sleeper = fiber
          sleepingUntil = next
          return Effect.void
        })
        yield* sleep(Math.min(maxSleepMs, Math.max(0, next - now)))
        sleeper = undefined
        sleepingUntil = Infinity
      }
    }).pipe(Effect.ensuring(Effect.sync(() => {
      if (self !== generation) return
      running = false
      sleeper = undefined
      sleepingUntil = Infinity
    })))

  return {
    add: (entry) =>
      Effect.suspend(() => {
        live++
        timer?.ref()
        const at = schedule(entry)
        if (!running) {
          running = true
          generation++
          return startLoop()
        }
        return wakeAt(at)
      }),
    remove: (entry) => {
      if (entry.done) return
      entry.done = true
      heap.remove(entry)
      // the loop is left to its sleep: it ends there if nothing came since, and a hold taken
      // meanwhile (a lock taken again and again) needs no new fiber
      live--
      if (live === 0) timer?.unref()
    }
  }
}
