/**
 * The signals `lockstep` handles itself (SIGINT, SIGTERM, SIGHUP): while a command runs they are
 * queued here instead of ending the process, so that `run` forwards them to its child and releases
 * the lock only once the child has exited, and a wait (for a lock, for a latch) ends cleanly.
 */
import { constants } from "node:os"
import { Context, Effect, Layer, Queue } from "effect"

/** A signal `lockstep` forwards. */
export type Signal = "SIGINT" | "SIGTERM" | "SIGHUP"

const handled: ReadonlyArray<Signal> = ["SIGINT", "SIGTERM", "SIGHUP"]

/** The signals received, in order. */
export class Signals extends Context.Tag("@lockstep/cli/Signals")<Signals, {
  /** The next signal received (one taker gets each). */
  readonly next: Effect.Effect<Signal>
}>() {}

/** Listens for the signals while the layer is open (the process's default handling is off meanwhile). */
export const layer: Layer.Layer<Signals> = Layer.scoped(
  Signals,
  Effect.gen(function*() {
    const queue = yield* Queue.unbounded<Signal>()
    const listener = (signal: NodeJS.Signals) => {
      Queue.unsafeOffer(queue, signal as Signal)
    }
    yield* Effect.acquireRelease(
      Effect.sync(() => handled.forEach((signal) => process.on(signal, listener))),
      () => Effect.sync(() => handled.forEach((signal) => process.off(signal, listener)))
    )
    return { next: Queue.take(queue) }
  })
)

/** The shell's exit code for a process ended by `signal`: 128 + its number. */
export const exitCode = (signal: string): number => 128 + (constants.signals[signal as NodeJS.Signals] ?? 0)
