/**
 * The metrics every lock records, in Effect's `Metric` registry: export them with whatever the
 * application installs (e.g. `@effect/opentelemetry`'s `NodeSdk` with a Prometheus or OTLP
 * reader), or read them with `Metric.value`.
 *
 * Labels: `kind` (`Lock`, `FairLock`, `ReadLock`, `WriteLock`, `Semaphore`), `name` when the
 * handle was made with one (`Lock.make(key, { name })`), and per metric `outcome` or `reason`.
 * The key is never a label: keys are unbounded (`orders:<id>`). Spans (`lockstep.acquire`) carry
 * the key, kind, fence, wait and outcome; a lost lease is also logged once, at warning level.
 *
 * @since 0.1.0
 */
import type { Metric, MetricKeyType, MetricState } from "effect"
import * as internal from "./internal/metrics.js"

/**
 * `lockstep_acquire_wait_seconds`: how long each acquisition took from its first attempt to its
 * end, labelled with its `outcome`.
 *
 * @example
 * ```ts
 * import { Effect, Metric } from "effect"
 * import { LockMetrics } from "@lockstep/core"
 *
 * const granted = Metric.value(LockMetrics.acquireWait.pipe(Metric.tagged("kind", "Lock"), Metric.tagged("outcome", "granted")))
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const acquireWait: Metric.Metric.Histogram<number> = internal.acquireWait

/**
 * `lockstep_acquisitions_total`: acquisitions by `outcome` — `granted`, `unavailable` (a try that
 * found the lock taken), `timeout`, `error`. Interrupted acquisitions are not counted.
 *
 * @example
 * ```ts
 * import { Metric } from "effect"
 * import { LockMetrics } from "@lockstep/core"
 *
 * const timeouts = Metric.value(LockMetrics.acquisitions.pipe(Metric.tagged("kind", "Lock"), Metric.tagged("outcome", "timeout")))
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const acquisitions: Metric.Metric.Counter<number> = internal.acquisitions

/**
 * `lockstep_leases_held`: holds this process keeps now (a re-entered hold counts once).
 *
 * @example
 * ```ts
 * import { Metric } from "effect"
 * import { LockMetrics } from "@lockstep/core"
 *
 * const held = Metric.value(LockMetrics.leasesHeld.pipe(Metric.tagged("kind", "Lock")))
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const leasesHeld: Metric.Metric<MetricKeyType.MetricKeyType.Gauge<number>, number, MetricState.MetricState.Gauge<number>> =
  internal.leasesHeld

/**
 * `lockstep_leases_lost_total`: leases lost before their release, by `reason` (`DeadlinePassed`,
 * `NotHeld`).
 *
 * @example
 * ```ts
 * import { Metric } from "effect"
 * import { LockMetrics } from "@lockstep/core"
 *
 * const lost = Metric.value(LockMetrics.leasesLost.pipe(Metric.tagged("kind", "Lock"), Metric.tagged("reason", "NotHeld")))
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const leasesLost: Metric.Metric.Counter<number> = internal.leasesLost

/**
 * `lockstep_renewals_total`: watchdog renewals by `outcome` — `renewed`, `not_held` (the lease
 * was gone: it is lost), `failed` (no answer; retried until the lease's deadline).
 *
 * @example
 * ```ts
 * import { Metric } from "effect"
 * import { LockMetrics } from "@lockstep/core"
 *
 * const renewed = Metric.value(LockMetrics.renewals.pipe(Metric.tagged("outcome", "renewed")))
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const renewals: Metric.Metric.Counter<number> = internal.renewals

/**
 * `lockstep_renewal_seconds`: the round trip of each batched renewal call (one call renews every
 * due lease of a backend).
 *
 * @example
 * ```ts
 * import { Metric } from "effect"
 * import { LockMetrics } from "@lockstep/core"
 *
 * const latency = Metric.value(LockMetrics.renewalLatency)
 * ```
 *
 * @since 0.1.0
 * @category metrics
 */
export const renewalLatency: Metric.Metric.Histogram<number> = internal.renewalLatency
