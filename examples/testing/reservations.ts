/**
 * The code under test: reserving a seat of a show takes the seat's lock with a fixed lease (a
 * checkout holds the seat for 10 minutes, renewed by nobody), and confirming a reservation must
 * happen while that lease lasts.
 */
import { Effect } from "effect"
import type { Duration, Option, Scope } from "effect"
import { Lock } from "@lockstep/core"
import type { Lease, LockBackend, LockError } from "@lockstep/core"

export const holdFor = "10 minutes"

const seatLock = (seat: string) => Lock.make(`seats:${seat}`, { lease: holdFor })

/** Holds the seat for a checkout: `Some(lease)` if it was free, `None` if someone holds it. */
export const reserve = (
  seat: string
): Effect.Effect<Option.Option<Lease.Lease>, LockError.AcquireError, LockBackend.LockBackend | Scope.Scope> =>
  Effect.flatMap(seatLock(seat), (lock) => Lock.tryAcquire(lock))

/** Is the seat held by a checkout? */
export const isReserved = (seat: string): Effect.Effect<boolean, LockError.LockError, LockBackend.LockBackend> =>
  Effect.flatMap(seatLock(seat), Lock.isLocked)

/**
 * Payment for the seat, under its lock: waits for the seat up to `timeout`, and is interrupted
 * with `LockLost` if the lease runs out while paying.
 */
export const payForSeat = <A, E, R>(seat: string, payment: Effect.Effect<A, E, R>, timeout: Duration.DurationInput) =>
  Effect.flatMap(seatLock(seat), (lock) => Lock.withLock(payment, lock, { timeout }))
