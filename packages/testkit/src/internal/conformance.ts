import type { Harness } from "../Conformance.js"
import * as Kit from "./conformanceKit.js"
import type { TestFn } from "./conformanceKit.js"
import * as ClosedConformance from "./closedConformance.js"
import * as FairLockConformance from "./fairLockConformance.js"
import * as FaultConformance from "./faultConformance.js"
import * as InputConformance from "./inputConformance.js"
import * as LatchConformance from "./latchConformance.js"
import * as LeaseConformance from "./leaseConformance.js"
import * as LockConformance from "./lockConformance.js"
import * as ModelConformance from "./modelConformance.js"
import * as MultiLockConformance from "./multiLockConformance.js"
import * as ReadWriteConformance from "./readWriteConformance.js"
import * as SemaphoreConformance from "./semaphoreConformance.js"

/**
 * Every scenario, in the order the suite registers them. That is the order of the test titles in
 * CI output, which readers compare between runs: it does not change when a scenario moves file.
 */
const scenarios: ReadonlyArray<(kit: Kit.Kit) => void> = [
  LockConformance.waiterHandOff,
  FairLockConformance.waiterHandOff,
  ReadWriteConformance.readAfterWrite,
  ReadWriteConformance.writeAfterRead,
  SemaphoreConformance.waiterHandOff,
  LockConformance.mutualExclusion,
  LockConformance.fenceFloor,
  FairLockConformance.arrivalOrder,
  ReadWriteConformance.readersShare,
  SemaphoreConformance.permitLimit,
  LockConformance.wakeUp,
  LeaseConformance.fixedLeaseExpires,
  LeaseConformance.watchdog,
  LeaseConformance.lossInterruptsBody,
  LeaseConformance.deadlineInterruptsBody,
  LockConformance.interruptionAtEveryStep,
  LockConformance.timeout,
  LockConformance.reentrancy,
  LockConformance.children,
  LockConformance.heldByLayer,
  ReadWriteConformance.downgrade,
  InputConformance.invalidOptions,
  SemaphoreConformance.limitMismatch,
  LockConformance.releasedOnce,
  LockConformance.scopedBody,
  LockConformance.fiberRefs,
  LeaseConformance.timeLeft,
  ModelConformance.referenceModel,
  LockConformance.childFiberLease,
  LeaseConformance.lostHoldReentered,
  LeaseConformance.dyingRenewal,
  SemaphoreConformance.freedCapacity,
  FairLockConformance.deadWaiter,
  FaultConformance.fairLostReply,
  FaultConformance.releaseTwice,
  FaultConformance.acquireTwice,
  FaultConformance.lateCopy,
  FaultConformance.lostGrant,
  FaultConformance.inFlightInterruption,
  FaultConformance.deadLease,
  LockConformance.selfDeadlock,
  FaultConformance.dataLoss,
  ModelConformance.duplicatedDelivery,
  FaultConformance.faultyContention,
  FaultConformance.lossyContention,
  MultiLockConformance.register,
  LatchConformance.register,
  InputConformance.hostileInput,
  ClosedConformance.closedBackend
]

export const register = (harness: Harness, test: TestFn): void => {
  const kit = Kit.make(harness, test)
  for (const scenario of scenarios) scenario(kit)
}
