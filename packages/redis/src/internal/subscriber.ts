/**
 * The connection that carries a backend's subscriptions, and the wake-up hub (wakeups.ts) it
 * feeds: one duplicate of the backend's client for all its waiters, connected on the first
 * subscription and closed with the backend's scope.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import type { Client } from "../RedisBackend.js"
import { keepOpen, subscriberFor, whenNotHandshaking } from "./clients.js"
import type { ClientTracker } from "./tracker.js"
import { makeWakeups } from "./wakeups.js"

/** The wake-up hub of a backend, on its subscriber connection. */
export type Wakeups = ReturnType<typeof makeWakeups>

/**
 * The hub of a backend on `client` (whose channels are in `namespace`), on a subscriber
 * connection of its own that `tracker` follows. Its waiters' signals come from the tracker's
 * lifecycle; after a reconnection every waiter looks again (a release in between may have gone
 * unheard). The hub stops and the connection closes with the scope.
 */
export const openWakeups = (
  client: Client,
  tracker: ClientTracker,
  namespace: string
): Effect.Effect<Wakeups, never, Scope.Scope> =>
  Effect.gen(function*() {
    const subscriber = subscriberFor(client)
    // our own connection: it never prints "Unhandled error event", even after the tracker
    // stops listening; connection errors surface through the calls that need it
    subscriber.on("error", () => undefined)
    const closeSubscriber = keepOpen(subscriber)
    // removed after the disconnect below (finalizers run in reverse order)
    yield* tracker.watch(subscriber, "subscriber")
    // the hub names channels as the scripts' callers do; on the server they are in the namespace,
    // where the scripts publish (a lock's channel is one of its KEYS, which ioredis prefixes)
    const wakeups = makeWakeups(
      {
        subscribe: (channel) => whenNotHandshaking(subscriber, () => subscriber.subscribe(namespace + channel)),
        unsubscribe: (channel) => whenNotHandshaking(subscriber, () => subscriber.unsubscribe(namespace + channel))
      },
      (ready) => Effect.asVoid(tracker.call("subscribe", () => ready, "subscriber")),
      tracker.lifecycle
    )
    subscriber.on("message", (channel: string, message: string) =>
      wakeups.onMessage(namespace === "" ? channel : channel.slice(namespace.length), message))
    let connectedOnce = false
    subscriber.on("ready", () => {
      if (connectedOnce) wakeups.wakeAll()
      connectedOnce = true
    })
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        wakeups.close()
        closeSubscriber()
      })
    )
    return wakeups
  })
