/**
 * A LockBackend that is the Model itself (state in a Ref, time from Effect's Clock): the driver is
 * checked against it independently of any real backend.
 */
import { Clock, Effect, Layer, Ref } from "effect"
import type { Service } from "@lockstep/core/LockBackend"
import { LockBackend } from "@lockstep/core/LockBackend"
import { Model } from "@lockstep/testkit"

export const make: Effect.Effect<Service> = Effect.gen(function*() {
  const state = yield* Ref.make(Model.empty)
  const step = <A>(f: (s: Model.State, now: number) => Model.Step<A>) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Ref.modify(state, (s) => {
        const next = f(s, now)
        return [next.result, next.state]
      }))
  return {
    clientId: "model",
    acquire: (request) => Effect.flatMap(step((s, now) => Model.acquire(s, request, now)), (e) => e),
    release: (request) => Effect.flatMap(step((s, now) => Model.release(s, request, now)), (e) => e),
    renew: (requests) => step((s, now) => Model.renew(s, requests, now)),
    inspect: (key) => step((s, now) => Model.inspect(s, key, now)),
    forceRelease: (request) => step((s, now) => Model.forceRelease(s, request, now)),
    raiseFence: (request) => step((s, now) => Model.raiseFence(s, request, now)),
    cancel: (request) => step((s, now) => Model.cancel(s, request, now)),
    subscribe: () => Effect.succeed({ await: Effect.never }),
    latchSetCount: (request) => Effect.flatMap(step((s, now) => Model.latchSetCount(s, request, now)), (e) => e),
    latchCountDown: (request) => Effect.flatMap(step((s, now) => Model.latchCountDown(s, request, now)), (e) => e),
    latchCount: (key) => Effect.flatMap(step((s, now) => Model.latchCount(s, key, now)), (e) => e),
    latchSubscribe: () => Effect.succeed({ await: Effect.never })
  }
})

export const layer: Layer.Layer<LockBackend> = Layer.effect(LockBackend, make)
