/**
 * The ensemble's clock as last seen in a write's answer (a node's `mtime`), carried forward on the
 * local clock. Only for what `inspect` and `forceRelease` judge by: every grant and every
 * expiry an attempt decides uses the time of its own write.
 */
export interface ServerClock {
  /** A write's answer said the ensemble's time was `mtime`. */
  readonly saw: (mtime: number) => void
  /** The ensemble's time now, as far as this process can tell. */
  readonly now: () => number
}

export const makeServerClock = (): ServerClock => {
  let offset = 0
  return {
    saw: (mtime) => {
      offset = mtime - Date.now()
    },
    now: () => Date.now() + offset
  }
}
