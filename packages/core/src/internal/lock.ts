/** Lock handles: the value behind `Lock`, made from a spec and read back by every kind of lock. */
import { pipeArguments } from "effect/Pipeable"
import type * as Lock from "../Lock.js"
import type { LockSpec } from "./spec.js"

export const TypeId: Lock.TypeId = Symbol.for("@lockstep/core/Lock") as Lock.TypeId

class LockImpl implements Lock.Lock {
  readonly [TypeId]: Lock.TypeId = TypeId
  constructor(readonly spec: LockSpec) {}
  get key(): string {
    return this.spec.key
  }
  get kind(): Lock.Lock["kind"] {
    return this.spec.kind as Lock.Lock["kind"]
  }
  pipe() {
    // eslint-disable-next-line prefer-rest-params
    return pipeArguments(this, arguments)
  }
  toString(): string {
    return `${this.spec.kind}(${this.spec.key})`
  }
}

/** A lock handle on `spec` (every kind's `make` ends here). */
export const fromSpec = (spec: LockSpec): Lock.Lock => new LockImpl(spec)

/** The spec behind a lock handle made by `fromSpec`. */
export const specOf = (lock: Lock.Lock): LockSpec => (lock as LockImpl).spec
