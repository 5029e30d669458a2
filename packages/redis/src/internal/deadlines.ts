/**
 * Deadlines of the calls in flight on one backend, all with the same timeout, kept by one timer.
 * A timer per call (set, then cleared when the reply comes, as almost all do) costs more client
 * CPU than the rest of the call's own code; here a call costs an entry in an ordered set, and the
 * one timer fires only when the oldest call in flight reaches its deadline (or, once, after a
 * call that has since ended would have).
 *
 * The timeout bounds how long a server stays silent, not how long a call waits in line: a
 * connection answers in order, so while replies keep coming on a call's route, the calls behind
 * them are answered in their turn, however many there are (a burst of thousands of calls at once,
 * which the client takes a while to get through). A call expires once its route has been silent
 * for the whole timeout since the call started, or since the last reply on it, whichever came
 * later. Before it expires a call, the timer lets the event loop read what the sockets hold: a
 * process that was busy for longer than the timeout finds the replies that came meanwhile first.
 */

/** A call in flight: when it started, on which route, and what to do if it reaches its deadline first. */
export interface Pending {
  readonly startedAt: number
  readonly route: string
  /** When it expires unless a reply on its route comes first. */
  due: number
  readonly expire: () => void
}

export interface Deadlines {
  /** Starts the clock of a call on `route`; `expire` runs once if it is still in flight after the timeout. */
  readonly start: (route: string, expire: () => void) => Pending
  /** The call ended (answered, failed or interrupted): it can no longer expire. */
  readonly end: (pending: Pending) => void
  /** A reply came on `route`: it is not silent, and the calls waiting on it are not either. */
  readonly heard: (route: string) => void
  /** Calls in flight. */
  readonly size: () => number
}

/**
 * Runs `f` once the event loop has read what the sockets hold (setImmediate runs after the poll
 * phase). Not unref'd: an unref'd immediate lets the poll phase block until something else wakes
 * the loop, and it keeps the process alive no longer than it takes to run.
 */
const afterPoll = (f: () => void): void => {
  setImmediate(f)
}

export const makeDeadlines = (
  timeoutMs: number,
  now: () => number = () => performance.now(),
  defer: (f: () => void) => void = afterPoll
): Deadlines => {
  // in start order, which is deadline order but for calls whose deadline a reply moved on
  const inFlight = new Set<Pending>()
  /** When each route last answered. */
  const lastHeard = new Map<string, number>()
  let timer: ReturnType<typeof setTimeout> | undefined
  /** Set while a sweep waits for the event loop to read the sockets first. */
  let sweeping = false

  const arm = () => {
    const oldest = inFlight.values().next()
    if (oldest.done === true) return
    // it does not keep the process alive: while a call can still be answered, its connection does
    timer = setTimeout(sweep, Math.max(0, oldest.value.due - now())).unref()
  }

  // the replies that came while the process was busy are read in the poll phase, which comes
  // after timers: the calls are judged once it ran
  const sweep = () => {
    timer = undefined
    if (sweeping) return
    sweeping = true
    defer(judge)
  }

  const judge = () => {
    sweeping = false
    const at = now()
    const moved: Array<Pending> = []
    for (const pending of inFlight) {
      if (at < pending.due) break
      inFlight.delete(pending)
      const heardAt = lastHeard.get(pending.route)
      if (heardAt !== undefined && heardAt + timeoutMs > at && heardAt > pending.due - timeoutMs) {
        // its route answered since its clock started: it waits in line, not on a silent server
        pending.due = heardAt + timeoutMs
        moved.push(pending)
      } else {
        pending.expire()
      }
    }
    for (const pending of moved) inFlight.add(pending)
    if (timer === undefined) arm()
  }

  return {
    start: (route, expire) => {
      const startedAt = now()
      const pending: Pending = { startedAt, route, due: startedAt + timeoutMs, expire }
      inFlight.add(pending)
      if (timer === undefined && !sweeping) arm()
      return pending
    },
    // the timer stays set: when it fires, it sets itself for the oldest call then in flight, if any
    end: (pending) => {
      inFlight.delete(pending)
    },
    heard: (route) => {
      // only calls that wait long enough to reach a deadline ask: skip the clock when none can
      if (inFlight.size > 0) lastHeard.set(route, now())
    },
    size: () => inFlight.size
  }
}
