/**
 * The per-fiber record of holds: which holds the current fiber has, which it re-enters, and which
 * requests it could never be granted while it keeps them (self-deadlock).
 */
import { Effect, FiberRef, GlobalValue, Option } from "effect"
import { SelfDeadlock } from "../LockError.js"
import type { Hold } from "./hold.js"
import { countIn, isLive } from "./hold.js"
import * as HoldSet from "./holdSet.js"
import type { LockSpec } from "./spec.js"
import { monotonicMillis } from "./time.js"

/**
 * Holds of the current fiber, by backend instance and key (`all`). Holds are per fiber: a forked
 * fiber starts with none, so concurrent children of a holder never enter its critical section
 * together (they wait like any other fiber), and fibers started on a runtime built by a layer
 * that acquired a lock do not inherit it. A joining child (`Effect.timeout`, `Effect.all`,
 * `Fiber.join`) hands the holds it took itself (`taken`, so a join costs what the child took) to
 * the fiber that joins it, whose scope usually owns them.
 */
export interface FiberHolds {
  readonly all: HoldSet.HoldSet
  readonly taken: HoldSet.HoldSet
}

const noHolds: FiberHolds = { all: HoldSet.empty, taken: HoldSet.empty }

/** `holds` with `hold` among all of them and among those taken. */
export const withHold = (holds: FiberHolds, hold: Hold): FiberHolds => ({
  all: HoldSet.add(holds.all, hold),
  taken: HoldSet.add(holds.taken, hold)
})

export const fiberHolds = GlobalValue.globalValue(
  Symbol.for("@lockstep/core/heldLeases/perFiber"),
  () =>
    FiberRef.unsafeMake<FiberHolds>(noHolds, {
      fork: () => noHolds,
      join: (parent, child) => {
        let joined = parent
        HoldSet.forEach(child.taken, (hold) => {
          const onKey = HoldSet.on(joined.all, hold.key)
          // a parent's own live re-entrant hold wins over a child's
          if (
            !isLive(hold) || onKey.includes(hold) ||
            (hold.reentrant && onKey.some((h) => h.reentrant && isLive(h) && h.backend === hold.backend))
          ) {
            return
          }
          joined = withHold(joined, hold)
        })
        return joined
      }
    })
)

/** The live holds among `holds` on the lock's key, of every kind. */
export const liveOn = (holds: FiberHolds, spec: LockSpec): ReadonlyArray<Hold> => {
  const onKey = HoldSet.on(holds.all, spec.key)
  return onKey.length === 0 ? onKey : onKey.filter((h) => isLive(h) && h.backend === spec.backend)
}

/** The current fiber's live holds on the lock's key, of every kind. */
const liveHolds = (spec: LockSpec): Effect.Effect<ReadonlyArray<Hold>> => Effect.map(FiberRef.get(fiberHolds), (holds) => liveOn(holds, spec))

/** The holder identity of the current fiber for this lock, if it holds it. */
export const currentHolder = (spec: LockSpec): Effect.Effect<Option.Option<string>> =>
  Effect.map(liveHolds(spec), (holds) =>
    Option.map(Option.fromNullable(holds.find((h) => h.reentrant === spec.reentrant && spec.reentrant)), (h) => h.holder))

/**
 * Whether the current fiber holds the handle in its mode with a lease whose local deadline has not
 * passed: answered from the fiber's own records, without asking the backend.
 */
export const isHeldByCurrentFiber = (spec: LockSpec): Effect.Effect<boolean> =>
  Effect.withFiberRuntime((fiber) => {
    const holds = liveOn(fiber.getFiberRef(fiberHolds), spec)
    if (holds.length === 0) return Effect.succeed(false)
    return Effect.map(monotonicMillis, (now) =>
      holds.some((h) => countIn(h, spec.mode) > 0 && (spec.reentrant || !h.reentrant) && now < h.deadline))
  })

/** How a hold holds its key, as a self-deadlock explains it. */
const holdsAs = (hold: Hold): string => (hold.counts.exclusive > 0 ? "exclusively" : `with ${hold.permits} shared permit(s)`)

/**
 * A request that could only be granted once the current fiber released a hold of its own on the
 * key (other than the one it re-enters) would wait forever: say so instead.
 */
export const selfDeadlock = (spec: LockSpec, permits: number, mine: ReadonlyArray<Hold>, reentered: Hold | undefined) => {
  const others = mine.filter((h) => h !== reentered)
  if (others.length === 0) return undefined
  if (spec.mode === "exclusive") {
    return new SelfDeadlock({ key: spec.key, reason: `it holds the key ${holdsAs(others[0]!)} under another lock handle` })
  }
  const writer = others.find((h) => h.counts.exclusive > 0)
  if (writer !== undefined) {
    return new SelfDeadlock({ key: spec.key, reason: "it holds the key exclusively under another lock handle" })
  }
  const taken = others.filter((h) => h.limit === spec.limit).reduce((sum, h) => sum + h.permits, 0)
  if (taken + permits > spec.limit) {
    return new SelfDeadlock({
      key: spec.key,
      reason: `it holds ${taken} of the ${spec.limit} permits itself and asks for ${permits} more`
    })
  }
  return undefined
}
