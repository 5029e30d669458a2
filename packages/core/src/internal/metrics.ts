/**
 * lockstep's metrics, in Effect's global metric registry (exported from there by whatever the
 * application installs, e.g. @effect/opentelemetry). Updates go straight to the metric's hook with
 * label arrays made once per lock handle: Effect caches a hook per label array, so an update costs
 * a lookup, not a new metric key.
 */
import { Metric, MetricBoundaries, MetricLabel } from "effect"

/** How an acquisition ended. */
export type Outcome = "granted" | "unavailable" | "timeout" | "error"

/** Why a lease was lost (`LockLost["reason"]`). */
export type LostReason = "DeadlinePassed" | "NotHeld"

export const acquireWait = Metric.histogram(
  "lockstep_acquire_wait_seconds",
  MetricBoundaries.exponential({ start: 0.0005, factor: 2, count: 16 }),
  "Time from the first attempt of an acquisition to its end (grant, no grant, timeout or error)"
)

export const acquisitions = Metric.counter("lockstep_acquisitions_total", {
  description: "Acquisitions by outcome: granted, unavailable (a try that found the lock taken), timeout, error",
  incremental: true
})

export const leasesHeld = Metric.gauge("lockstep_leases_held", {
  description: "Holds currently kept by this process (a re-entered hold counts once)"
})

export const leasesLost = Metric.counter("lockstep_leases_lost_total", {
  description: "Leases lost before their release, by reason",
  incremental: true
})

export const renewals = Metric.counter("lockstep_renewals_total", {
  description: "Lease renewals by outcome: renewed, not_held (the lease was gone), failed (retried)",
  incremental: true
})

export const renewalLatency = Metric.histogram(
  "lockstep_renewal_seconds",
  MetricBoundaries.exponential({ start: 0.0005, factor: 2, count: 12 }),
  "Round trip of one batched renewal call"
)

/** The label arrays of one lock handle, made once at `make`. */
export interface HandleLabels {
  readonly handle: ReadonlyArray<MetricLabel.MetricLabel>
  readonly outcome: Readonly<Record<Outcome, ReadonlyArray<MetricLabel.MetricLabel>>>
  readonly lost: Readonly<Record<LostReason, ReadonlyArray<MetricLabel.MetricLabel>>>
}

/**
 * The label arrays of each kind and name, shared by every handle that has them: Effect caches a
 * metric hook per label array, and finding one for a new array (a new key with labels in the
 * global registry) costs far more than an update, so a process that makes a handle per key must
 * not make new arrays per handle. Names are few (they label metrics, as kinds do).
 */
const labelsByName = new Map<string, HandleLabels>()

/** Labels: the kind, and the handle's `name` when it has one (never the raw key: keys are unbounded). */
export const handleLabels = (kind: string, name: string | undefined): HandleLabels => {
  const id = name === undefined ? kind : `${kind}\u0000${name}`
  let labels = labelsByName.get(id)
  if (labels === undefined) {
    labels = makeHandleLabels(kind, name)
    labelsByName.set(id, labels)
  }
  return labels
}

const makeHandleLabels = (kind: string, name: string | undefined): HandleLabels => {
  const handle = [MetricLabel.make("kind", kind)]
  if (name !== undefined) handle.push(MetricLabel.make("name", name))
  const withLabel = (key: string, value: string) => [...handle, MetricLabel.make(key, value)]
  return {
    handle,
    outcome: {
      granted: withLabel("outcome", "granted"),
      unavailable: withLabel("outcome", "unavailable"),
      timeout: withLabel("outcome", "timeout"),
      error: withLabel("outcome", "error")
    },
    lost: {
      DeadlinePassed: withLabel("reason", "DeadlinePassed"),
      NotHeld: withLabel("reason", "NotHeld")
    }
  }
}

const renewalOutcome = {
  renewed: [MetricLabel.make("outcome", "renewed")],
  not_held: [MetricLabel.make("outcome", "not_held")],
  failed: [MetricLabel.make("outcome", "failed")]
} as const

const noLabels: ReadonlyArray<MetricLabel.MetricLabel> = []

/** Records the end of an acquisition that waited `seconds`. */
export const recordAcquisition = (labels: HandleLabels, outcome: Outcome, seconds: number): void => {
  const tags = labels.outcome[outcome]
  acquireWait.unsafeUpdate(seconds, tags)
  acquisitions.unsafeUpdate(1, tags)
}

/** A hold started (+1) or ended (-1). */
export const recordHeld = (labels: HandleLabels, delta: 1 | -1): void => leasesHeld.unsafeModify(delta, labels.handle)

export const recordLost = (labels: HandleLabels, reason: LostReason): void =>
  leasesLost.unsafeUpdate(1, labels.lost[reason])

/** One batched renewal call: its latency and what it said of each hold. */
export const recordRenewals = (
  seconds: number,
  counts: { readonly renewed: number; readonly notHeld: number; readonly failed: number }
): void => {
  renewalLatency.unsafeUpdate(seconds, noLabels)
  if (counts.renewed > 0) renewals.unsafeUpdate(counts.renewed, renewalOutcome.renewed)
  if (counts.notHeld > 0) renewals.unsafeUpdate(counts.notHeld, renewalOutcome.not_held)
  if (counts.failed > 0) renewals.unsafeUpdate(counts.failed, renewalOutcome.failed)
}
