/**
 * Deadlines of the calls in flight on one backend, all with the same timeout, kept by one timer.
 * A timer per call (set, then cleared when the reply comes, as almost all do) costs more client
 * CPU than the rest of the call's own code; here a call costs an entry in an ordered set, and the
 * one timer fires only when the oldest call in flight reaches its deadline (or, once, after a
 * call that has since ended would have).
 */

/** A call in flight: when it started, and what to do if it reaches its deadline first. */
export interface Pending {
  readonly startedAt: number
  readonly expire: () => void
}

export interface Deadlines {
  /** Starts the clock of a call; `expire` runs once if it is still in flight after the timeout. */
  readonly start: (expire: () => void) => Pending
  /** The call ended (answered, failed or interrupted): it can no longer expire. */
  readonly end: (pending: Pending) => void
  /** Calls in flight. */
  readonly size: () => number
}

export const makeDeadlines = (timeoutMs: number, now: () => number = () => performance.now()): Deadlines => {
  // in start order, which is deadline order: every call has the same timeout
  const inFlight = new Set<Pending>()
  let timer: ReturnType<typeof setTimeout> | undefined

  const arm = () => {
    const oldest = inFlight.values().next()
    if (oldest.done === true) return
    // it does not keep the process alive: while a call can still be answered, its connection does
    timer = setTimeout(sweep, Math.max(0, oldest.value.startedAt + timeoutMs - now())).unref()
  }

  const sweep = () => {
    timer = undefined
    const at = now()
    for (const pending of inFlight) {
      if (at - pending.startedAt < timeoutMs) break
      inFlight.delete(pending)
      pending.expire()
    }
    arm()
  }

  return {
    start: (expire) => {
      const pending: Pending = { startedAt: now(), expire }
      inFlight.add(pending)
      if (timer === undefined) arm()
      return pending
    },
    // the timer stays set: when it fires, it sets itself for the oldest call then in flight, if any
    end: (pending) => {
      inFlight.delete(pending)
    },
    size: () => inFlight.size
  }
}
