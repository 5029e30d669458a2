/**
 * The lease keeper of one backend: a single fiber that watches the local deadline of every live
 * hold of that backend and renews the watchdog-renewed ones, in batches. A hold costs an entry in
 * a heap, not a fiber; the keeper's fiber runs only while it has entries (started by the first,
 * ended after the last), on the clock of the fiber that started it (so TestClock drives it).
 */
import { Duration, Effect, Either, FiberId, GlobalValue } from "effect"
import type { Fiber } from "effect"
import type { Service } from "../LockBackend.js"
import type { HeapItem } from "./heap.js"
import { Heap } from "./heap.js"
import { recordRenewals } from "./metrics.js"
import { driftMs, liveClock, maxSleepMs, monotonicMillis } from "./time.js"

/** A hold as the keeper sees it. All times are monotonic milliseconds. */
export interface Entry extends HeapItem {
  readonly key: string
  readonly holder: string
  /** The watchdog period, or `undefined` for a fixed lease (never renewed). */
  readonly watchdogMs: number | undefined
  /** The local deadline: past it unconfirmed, the hold is lost. */
  deadline: number
  /** When the last confirmed renewal (or the grant) was sent. */
  confirmedAt: number
  /** The lease (ms) a renewal asks for: the watchdog period, or a fixed lease (renewed only to confirm a claim). */
  readonly leaseMs?: number | undefined
  /**
   * A hand-off's claim (see `HandOff`) not confirmed yet: its deadline is the claim's, and it is
   * renewed to the full lease (once, for a fixed lease) halfway to that deadline, unless it is
   * released first.
   */
  unconfirmed?: boolean | undefined
  /** When the last renewal was sent (-Infinity before any). */
  attemptedAt: number
  /** Set while a renewal of this hold is in flight. */
  renewing: boolean
  /** Set once the keeper must forget the hold (released or lost). */
  done: boolean
  /** Called once, from the keeper, when the deadline passes or a renewal says the hold is gone. */
  readonly onLost: (reason: "DeadlinePassed" | "NotHeld") => Effect.Effect<void>
}

/** The lease a renewal of `entry` asks for. */
const leaseOf = (entry: Entry): number => entry.watchdogMs ?? entry.leaseMs ?? 0

/** When `entry` next needs the keeper: its deadline, or its renewal if that comes first. */
const dueAt = (entry: Entry): number => {
  if (entry.renewing) return entry.deadline
  if (entry.unconfirmed === true) {
    // halfway to the claim's deadline (a short hold is released before); after a failed try,
    // again halfway to what is left
    const from = Math.max(entry.confirmedAt, entry.attemptedAt)
    return Math.min(entry.deadline, from + Math.max(1, (entry.deadline - from) / 2))
  }
  if (entry.watchdogMs === undefined) return entry.deadline
  const intervalMs = entry.watchdogMs / 3
  // renewals fall on a grid shared by all holds with this watchdog, so they leave together
  const quantum = intervalMs / 4
  let next = Math.ceil((entry.confirmedAt + intervalMs * 0.75) / quantum) * quantum
  // after a failed renewal, try again at the next grid point, never in a tight loop
  while (next <= entry.attemptedAt) next += quantum
  return Math.min(next, entry.deadline)
}

/** The keeper of one backend. */
export interface Keeper {
  /**
   * Starts watching `entry` now; what is left to do (start the keeper's fiber, or wake it for an
   * entry due before it looks again) is returned, `undefined` when nothing is (the usual case: a
   * grant costs no step of its own here).
   */
  readonly add: (entry: Entry) => Effect.Effect<void> | undefined
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
    keeper = new BackendKeeper(backend)
    keepers.set(backend, keeper)
  }
  return keeper
}

/**
 * The keeper's state and its loop fiber. Methods are arrow functions: they are handed to Effect
 * as callbacks.
 */
class BackendKeeper implements Keeper {
  readonly heap = new Heap<Entry>()
  live = 0
  /** Whether a loop fiber exists (running, or sleeping in `sleeper`). */
  running = false
  /** The loop fiber while it sleeps, and until when. */
  sleeper: Fiber.RuntimeFiber<unknown, unknown> | undefined = undefined
  sleepingUntil = Infinity
  /** Bumped when a loop is replaced: an older loop stops and leaves the state alone. */
  generation = 0
  /** The loop's timer while it sleeps on the live clock: it keeps the process alive only while holds are live. */
  timer: ReturnType<typeof setTimeout> | undefined = undefined

  constructor(readonly backend: Service) {}

  readonly add = (entry: Entry): Effect.Effect<void> | undefined => {
    this.live++
    this.timer?.ref()
    const at = this.schedule(entry)
    if (!this.running) {
      this.running = true
      this.generation++
      return this.startLoop()
    }
    // the sleeping loop looks again in time for it
    if (this.sleeper === undefined || at >= this.sleepingUntil) return undefined
    return this.replaceSleeper()
  }

  readonly remove = (entry: Entry): void => {
    if (entry.done) return
    entry.done = true
    this.heap.remove(entry)
    // the loop is left to its sleep: it ends there if nothing came since, and a hold taken
    // meanwhile (a lock taken again and again) needs no new fiber
    this.live--
    if (this.live > 0) return
    if (this.timer !== undefined) {
      this.timer.unref()
    } else if (this.sleeper !== undefined) {
      // a sleep on another clock (a TestClock, or the live clock of another copy of effect,
      // as where each package has its own): its timer cannot be unreffed and would keep the
      // process alive until the next renewal, so the loop ends now; the next hold starts one
      const idle = this.sleeper
      this.sleeper = undefined
      this.sleepingUntil = Infinity
      this.generation++
      this.running = false
      idle.unsafeInterruptAsFork(FiberId.none)
    }
  }

  /**
   * The loop's sleep. On the live clock it is a timer of its own, so that once the last hold is
   * gone (the loop sleeps on, for the next hold) the timer stops keeping the process alive: a
   * program that released its locks exits at once, not at the next renewal time.
   */
  private readonly sleep = (ms: number): Effect.Effect<void> =>
    Effect.clockWith((clock) =>
      clock !== liveClock
        ? Effect.sleep(Duration.millis(ms))
        : Effect.async<void>((resume) => {
          const own = setTimeout(() => {
            if (this.timer === own) this.timer = undefined
            resume(Effect.void)
          }, ms)
          this.timer = own
          if (this.live === 0) own.unref()
          return Effect.sync(() => {
            clearTimeout(own)
            if (this.timer === own) this.timer = undefined
          })
        })
    )

  private readonly schedule = (entry: Entry): number => {
    const at = dueAt(entry)
    this.heap.set(entry, at)
    return at
  }

  /**
   * Something is due before the sleeping loop would look again: replace it. (The loop sleeps in a
   * plain `Effect.sleep` taken right after reading the clock: a race against a wake-up signal
   * would fork fibers, and a TestClock moved in between would be read late.)
   */
  private readonly wakeAt = (at: number): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (this.sleeper === undefined || at >= this.sleepingUntil) return Effect.void
      return this.replaceSleeper()
    })

  /** Interrupts the sleeping loop and starts another. */
  private readonly replaceSleeper = (): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (this.sleeper === undefined) return Effect.void
      const old = this.sleeper
      this.sleeper = undefined
      this.sleepingUntil = Infinity
      this.generation++
      old.unsafeInterruptAsFork(FiberId.none)
      return this.startLoop()
    })

  /**
   * A new loop fiber. Interruptible, whoever starts it (a grant runs uninterruptibly): replacing a
   * sleeping loop interrupts it, which must cancel its timer rather than leave it running.
   */
  private readonly startLoop = () => Effect.asVoid(Effect.forkDaemon(Effect.interruptible(this.loop(this.generation))))

  /** One batch of renewals, sent at `sentAt`; each answer moves its entry's deadline or loses it. */
  private readonly renew = (batch: ReadonlyArray<Entry>, sentAt: number) =>
    this.backend.renew(batch.map((entry) => ({ key: entry.key, holder: entry.holder, leaseMs: leaseOf(entry) }))).pipe(
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
              const leaseMs = leaseOf(entry)
              entry.confirmedAt = sentAt
              entry.unconfirmed = false
              entry.deadline = Math.max(entry.deadline, sentAt + leaseMs - driftMs(leaseMs))
            }
            // any other failure is retried at the next grid point, until the deadline decides
            earliest = Math.min(earliest, this.schedule(entry))
            return Effect.void
          }, { discard: true }),
          Effect.suspend(() => {
            recordRenewals((answeredAt - sentAt) / 1000, counts)
            return this.wakeAt(earliest)
          })
        )
      })
    )

  /** The loop of generation `self`: loses what is past its deadline, renews what is due, sleeps. */
  private readonly loop = (self: number): Effect.Effect<void> =>
    Effect.gen(this, function*() {
      while (this.live > 0 && self === this.generation) {
        const now = yield* monotonicMillis
        const batch: Array<Entry> = []
        while (this.heap.size > 0 && this.heap.peek()!.at <= now) {
          const entry = this.heap.peek()!
          if (now >= entry.deadline) {
            this.heap.remove(entry)
            // forked: a lost hold's release must not hold up the others' deadlines
            yield* Effect.forkDaemon(entry.onLost("DeadlinePassed"))
            continue
          }
          entry.renewing = true
          entry.attemptedAt = now
          this.schedule(entry)
          batch.push(entry)
        }
        // forked: deadlines keep being watched while a renewal is in flight
        if (batch.length > 0) yield* Effect.forkDaemon(this.renew(batch, now))
        if (this.live === 0 || self !== this.generation) break
        const next = this.heap.size > 0 ? this.heap.peek()!.at : Infinity
        yield* Effect.withFiberRuntime((fiber) => {
          this.sleeper = fiber
          this.sleepingUntil = next
          return Effect.void
        })
        yield* this.sleep(Math.min(maxSleepMs, Math.max(0, next - now)))
        this.sleeper = undefined
        this.sleepingUntil = Infinity
      }
    }).pipe(Effect.ensuring(Effect.sync(() => {
      if (self !== this.generation) return
      this.running = false
      this.sleeper = undefined
      this.sleepingUntil = Infinity
    })))
}
