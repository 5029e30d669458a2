import * as net from "node:net"
import { NodeSdk } from "@effect/opentelemetry"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, Fiber, Layer, Logger, Metric, Option, TestClock } from "effect"
import type { MetricLabel } from "effect"
import { PrometheusExporter } from "@opentelemetry/exporter-prometheus"
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Lock, LockBackend, LockError, LockMetrics } from "@lockstep/core"
import { MemoryBackend } from "@lockstep/memory"

const labelled = <T, I, O>(metric: Metric.Metric<T, I, O>, labels: Record<string, string>) =>
  Object.entries(labels).reduce((m, [key, value]) => Metric.tagged(m, key, value), metric)

const count = (metric: Metric.Metric.Counter<number>, labels: Record<string, string>) =>
  Effect.map(Metric.value(labelled(metric, labels)), (state) => state.count)

const held = (labels: Record<string, string>) =>
  Effect.map(Metric.value(labelled(LockMetrics.leasesHeld, labels)), (state) => state.value)

const freePort = Effect.async<number>((resume) => {
  const server = net.createServer()
  server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as net.AddressInfo).port
    server.close(() => resume(Effect.succeed(port)))
  })
})

describe("metrics", () => {
  it.effect("acquisitions by outcome, wait times, held leases, lost leases and renewals", () =>
    Effect.gen(function*() {
      const labels = { kind: "Lock", name: "metrics-test" }
      const lock = yield* Lock.make("metrics:1", { name: "metrics-test", watchdog: "3 seconds" })
      const renewedBefore = yield* count(LockMetrics.renewals, { outcome: "renewed" })

      yield* Lock.withLock(Effect.void, lock)
      const holder = yield* Effect.fork(Lock.withLock(Effect.sleep("5 seconds"), lock))
      yield* Effect.yieldNow()
      assert.strictEqual(yield* held(labels), 1)
      assert.isTrue(Option.isNone(yield* Effect.scoped(Lock.tryAcquire(lock))))
      const timedOut = yield* Effect.fork(Effect.either(Lock.withLock(Effect.void, lock, { timeout: "500 millis" })))
      yield* TestClock.adjust("6 seconds")
      yield* Fiber.join(holder)
      assert.isTrue(Either.isLeft(yield* Fiber.join(timedOut)))
      assert.strictEqual(yield* held(labels), 0)

      assert.strictEqual(yield* count(LockMetrics.acquisitions, { ...labels, outcome: "granted" }), 2)
      assert.strictEqual(yield* count(LockMetrics.acquisitions, { ...labels, outcome: "unavailable" }), 1)
      assert.strictEqual(yield* count(LockMetrics.acquisitions, { ...labels, outcome: "timeout" }), 1)
      const timeoutWait = yield* Metric.value(labelled(LockMetrics.acquireWait, { ...labels, outcome: "timeout" }))
      assert.strictEqual(timeoutWait.count, 1)
      assert.strictEqual(timeoutWait.min, 0.5, "the timeout waited its 500 ms (TestClock)")
      // the 5 s hold under a 3 s watchdog was renewed every second
      assert.isAtLeast((yield* count(LockMetrics.renewals, { outcome: "renewed" })) - renewedBefore, 4)

      const fixed = yield* Lock.make("metrics:2", { name: "metrics-test", lease: "1 second" })
      const lost = yield* Effect.fork(Effect.either(Lock.withLock(Effect.never, fixed)))
      yield* TestClock.adjust("2 seconds")
      const result = yield* Fiber.join(lost)
      assert.isTrue(Either.isLeft(result) && result.left._tag === "LockLost")
      assert.strictEqual(yield* count(LockMetrics.leasesLost, { ...labels, reason: "DeadlinePassed" }), 1)
      assert.strictEqual(yield* held(labels), 0)
    }).pipe(Effect.provide(MemoryBackend.layer)))

  it.effect("a backend failure counts as outcome error; handles without a name carry only their kind", () =>
    Effect.gen(function*() {
      const memory = yield* MemoryBackend.make
      const broken: LockBackend.Service = {
        ...memory,
        acquire: () => Effect.fail(new LockError.BackendError({ operation: "acquire", cause: "refused" }))
      }
      const lock = yield* Effect.provide(Lock.make("metrics:3"), Layer.succeed(LockBackend.LockBackend, broken))
      const before = yield* count(LockMetrics.acquisitions, { kind: "Lock", outcome: "error" })
      const failed = yield* Effect.either(Lock.withLock(Effect.void, lock))
      assert.isTrue(Either.isLeft(failed) && failed.left._tag === "BackendError")
      yield* Effect.either(Effect.scoped(Lock.tryAcquire(lock)))
      assert.strictEqual((yield* count(LockMetrics.acquisitions, { kind: "Lock", outcome: "error" })) - before, 2)
      // no label carries the key
      const keys = (yield* Metric.snapshot).flatMap((pair) => pair.metricKey.tags as ReadonlyArray<MetricLabel.MetricLabel>)
        .filter((tag) => tag.value.startsWith("metrics:"))
      assert.deepStrictEqual(keys, [])
    }))
})

describe("logs", () => {
  it.effect("a lost lease is logged once, at warning level, with its key, holder and reason", () =>
    Effect.gen(function*() {
      const logs: Array<{ level: string; message: unknown; annotations: Record<string, unknown> }> = []
      const capture = Logger.make(({ annotations, logLevel, message }) => {
        logs.push({ level: logLevel.label, message, annotations: Object.fromEntries(annotations) })
      })
      const run = Effect.gen(function*() {
        const lock = yield* Lock.make("logs:lost", { lease: "1 second" })
        // two bodies under one hold (re-entered), and someone awaiting `lost`: still one line
        const fiber = yield* Effect.fork(Effect.either(Lock.withLock(
          (lease) => Effect.zipRight(Effect.fork(Effect.either(lease.lost)), Lock.withLock(Effect.never, lock)),
          lock
        )))
        yield* TestClock.adjust("3 seconds")
        return yield* Fiber.join(fiber)
      })
      const result = yield* run.pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))
      assert.isTrue(Either.isLeft(result) && result.left._tag === "LockLost")
      const lost = logs.filter((log) => String(log.message).includes("lease lost"))
      assert.strictEqual(lost.length, 1)
      assert.strictEqual(lost[0]!.level, "WARN")
      assert.strictEqual(lost[0]!.annotations["lockstep.key"], "logs:lost")
      assert.strictEqual(lost[0]!.annotations["lockstep.reason"], "DeadlinePassed")
      assert.match(String(lost[0]!.annotations["lockstep.holder"]), /:\d+$/)
    }).pipe(Effect.provide(MemoryBackend.layer)))
})

describe("export through @effect/opentelemetry (the README's setup)", () => {
  it.live("spans carry key, kind, fence, wait and outcome; metrics are scraped by Prometheus", () =>
    Effect.gen(function*() {
      const port = yield* freePort
      const spans = new InMemorySpanExporter()
      const prometheus = new PrometheusExporter({ host: "127.0.0.1", port })
      const Observability = NodeSdk.layer(() => ({
        resource: { serviceName: "lockstep-test" },
        spanProcessor: new SimpleSpanProcessor(spans),
        metricReader: prometheus
      }))
      // read while the SDK is up: closing its layer shuts the exporters down (and empties them)
      yield* Effect.gen(function*() {
        const lock = yield* Lock.make("otel:orders:42", { name: "orders" })
        const fence = yield* Lock.withLock((lease) => Effect.succeed(lease.fence), lock)
        const held = yield* Effect.fork(Lock.withLock(Effect.sleep("200 millis"), lock))
        yield* Effect.sleep("20 millis")
        yield* Effect.either(Lock.withLock(Effect.void, lock, { timeout: "50 millis" }))
        yield* Fiber.join(held)

        const acquires = spans.getFinishedSpans().filter((span) => span.name === "lockstep.acquire")
        assert.strictEqual(acquires.length, 3)
        const first = acquires[0]!.attributes
        assert.strictEqual(first["lockstep.key"], "otel:orders:42")
        assert.strictEqual(first["lockstep.kind"], "Lock")
        assert.strictEqual(first["lockstep.fence"], fence)
        assert.strictEqual(first["lockstep.outcome"], "granted")
        assert.isNumber(first["lockstep.wait_ms"])
        const outcomes = acquires.map((span) => span.attributes["lockstep.outcome"]).sort()
        assert.deepStrictEqual(outcomes, ["granted", "granted", "timeout"])

        const scraped = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text()))
        const lines = scraped.split("\n").filter((line) => line.includes(`name="orders"`))
        if (process.env.LOCKSTEP_PRINT_SCRAPE) console.log(lines.join("\n"))
        const line = (prefix: string, outcome: string) =>
          lines.find((l) => l.startsWith(prefix) && l.includes(`outcome="${outcome}"`))
        assert.match(line("lockstep_acquisitions_total", "granted") ?? "", / 2$/)
        assert.match(line("lockstep_acquisitions_total", "timeout") ?? "", / 1$/)
        assert.isDefined(line("lockstep_acquire_wait_seconds_bucket", "timeout"))
        assert.isTrue(lines.some((l) => l.startsWith("lockstep_leases_held") && l.endsWith(" 0")))
        assert.isFalse(scraped.includes("otel:orders:42"), "the key is not a label")
      }).pipe(Effect.provide(Layer.merge(MemoryBackend.layer, Observability)))
    }))
})
