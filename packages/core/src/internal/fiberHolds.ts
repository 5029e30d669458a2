/**
 * The per-fiber record of holds: which holds the current fiber has, which it re-enters, and which
 * requests it could never be granted while it keeps them (self-deadlock).
 */
import { Effect, FiberRef, GlobalValue, Option } from "effect"
import { SelfDeadlock } from "../LockError.js"
import * as HeldSet from "./heldSet.js"
import type { Held } from "./holdRecord.js"
import { countIn, isLive } from "./holdRecord.js"
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
export interface HeldLeases {
  readonly all: HeldSet.HeldSet
  readonly taken: HeldSet.HeldSet
}

const noLeases: HeldLeases = { all: HeldSet.empty, taken: HeldSet.empty }

/** `leases` with `held` among the holds and among those taken. */
export const withHeld = (leases: HeldLeases, held: Held): HeldLeases => ({
  all: HeldSet.add(leases.all, held),
  taken: HeldSet.add(leases.taken, held)
})

export const heldLeases = GlobalValue.globalValue(
  Symbol.for("@lockstep/core/heldLeases/perFiber"),
  () =>
    FiberRef.unsafeMake<HeldLeases>(noLeases, {
      fork: () => noLeases,
      join: (parent, child) => {
        let joined = parent
        HeldSet.forEach(child.taken, (held) => {
          const onKey = HeldSet.on(joined.all, held.key)
          // a parent's own live re-entrant hold wins over a child's
          if (
            !isLive(held) || onKey.includes(held) ||
            (held.reentrant && onKey.some((h) => h.reentrant && isLive(h) && h.backend === held.backend))
          ) {
            return
          }
          joined = withHeld(joined, held)
        })
        return joined
      }
    })
)

/** The live holds among `holds` on the lock's key, of every kind. */
export const liveOn = (holds: HeldLeases, spec: LockSpec): ReadonlyArray<Held> => {
  const onKey = HeldSet.on(holds.all, spec.key)
  return onKey.length === 0 ? onKey : onKey.filter((h) => isLive(h) && h.backend === spec.backend)
}

/** The current fiber's live holds on the lock's key, of every kind. */
const liveHolds = (spec: LockSpec): Effect.Effect<ReadonlyArray<Held>> => Effect.map(FiberRef.get(heldLeases), (holds) => liveOn(holds, spec))

/** The holder identity of the current fiber for this lock, if it holds it. */
export const currentHolder = (spec: LockSpec): Effect.Effect<Option.Option<string>> =>
  Effect.map(liveHolds(spec), (helds) =>
    Option.map(Option.fromNullable(helds.find((h) => h.reentrant === spec.reentrant && spec.reentrant)), (h) => h.holder))

/**
 * Whether the current fiber holds the handle in its mode with a lease whose local deadline has not
 * passed: answered from the fiber's own records, without asking the backend.
 */
export const isHeldByCurrentFiber = (spec: LockSpec): Effect.Effect<boolean> =>
  Effect.withFiberRuntime((fiber) => {
    const helds = liveOn(fiber.getFiberRef(heldLeases), spec)
    if (helds.length === 0) return Effect.succeed(false)
    return Effect.map(monotonicMillis, (now) =>
      helds.some((h) => countIn(h, spec.mode) > 0 && (spec.reentrant || !h.reentrant) && now < h.deadline))
  })

/**
 * A request that could only be granted once the current fiber released a hold of its own on the
 * key (other than the one it re-enters) would wait forever: say so instead.
 */
export const selfDeadlock = (spec: LockSpec, permits: number, mine: ReadonlyArray<Held>, reentered: Held | undefined) => {
  const others = mine.filter((h) => h !== reentered)
  if (others.length === 0) return undefined
  const describe = (h: Held) => (h.counts.exclusive > 0 ? "exclusively" : `with ${h.permits} shared permit(s)`)
  if (spec.mode === "exclusive") {
    return new SelfDeadlock({ key: spec.key, reason: `it holds the key ${describe(others[0]!)} under another lock handle` })
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
