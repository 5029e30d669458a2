import type { Exit, Scope } from "effect"
import { Effect } from "effect"
import type { Lifecycle, WaiterSignal } from "@lockstep/core/BackendKit"
import type { HandOff, HoldMode, Subscription } from "@lockstep/core/LockBackend"
/**
 * The wake code of a holder: a 52-bit hash of its id, in decimal. Releases name the waiters they
 * wake by it; a number, so that a Redisson listener on the same channel (which reads messages as
 * Java longs and acts on 0 and 1 only) ignores it. Never 0 or 1 (nor 2, which wakes every shared
 * waiter). Only the waiter's own process computes and matches its code, so the hash need not be
 * the same across versions; it is computed on every acquisition, so it is a cheap one (two FNV-1a
 * lanes of 26 bits' worth each), not a cryptographic digest.
 */
export const wakeCode = (holder: string): string => {
  let a = 0x811c9dc5
  let b = 0x050c5d1f
  for (let i = 0; i < holder.length; i++) {
    const c = holder.charCodeAt(i)
    a = Math.imul(a ^ c, 0x01000193)
    b = Math.imul(b ^ c, 0x01000193) ^ (b >>> 15)
  }
  // 26 bits of each lane (their well-mixed high bits): 52 bits, exact in a double
  return String((a >>> 6) * 2 ** 26 + (b >>> 6) + 3)
}

/** One waiting acquisition in this process. */
interface Waiter {
  readonly holder: string
  readonly code: string
  /** `latch`: a latch's waiter; a message on a latch's channel wakes every one of them. */
  readonly mode: HoldMode | "latch"
  /**
   * Its wake-up signal (core's `BackendKit`): a wake-up counts as pending until its fiber resumes
   * (or awaits it), and every signal wakes when the backend closes.
   */
  readonly signal: WaiterSignal
  /** Its entry in the key's waiters set, once an attempt registered it there. */
  member: string | undefined
  /** Its lease (ms), as its attempts ask for it: how long a claim it gives up is remembered as ended. */
  leaseMs: number
  /** Takes its entry out of the waiters set (and hands on a wake-up aimed at it, or releases a claim). */
  readonly abandon: ((member: string, leaseMs: number) => void) | undefined
  /**
   * The fence floor of its last denied attempt (`Infinity` before any): a hand-off whose fence is
   * above it was granted after that attempt was processed (see `denied`).
   */
  floor: number
  /** The claim its attempts ask for (ms; 0: none). */
  claimMs: number
  /** The fence of the last hand-off announced to it, until its waiting loop takes it. */
  claim: number | undefined
}

interface Channel {
  /** In arrival order. */
  readonly waiters: Set<Waiter>
  readonly byCode: Map<string, Set<Waiter>>
  /** Completes when the server confirmed the subscription. */
  readonly ready: Promise<unknown>
  failed: boolean
  /** The next message is the `0` of the release that sent the last one: not a wake-up. */
  skipZero: boolean
  /** The next message is the fence of a hand-off to the waiters with this code. */
  handOffTo: string | undefined
  /** Pending unsubscribe of a channel whose last waiter left. */
  idle: ReturnType<typeof setTimeout> | undefined
}

/** What the hub needs from the subscriber client: its (UN)SUBSCRIBE. */
export interface Subscriber {
  readonly subscribe: (channel: string) => Promise<unknown>
  readonly unsubscribe: (channel: string) => Promise<unknown>
}

/** The length of a hand-off's first message: `1` and a wake code zero-padded to 17 digits. */
const handOffLength = 18

/** How long a channel stays subscribed after its last waiter left: the next wait reuses it. */
export const idleUnsubscribeMs = 1_000

// ---------------------------------------------------------------------------------------------
// the messages of one channel: whom they wake
// ---------------------------------------------------------------------------------------------

const wakeShared = (channel: Channel) => {
  for (const other of channel.waiters) if (!other.signal.pending() && other.mode === "shared") other.signal.wake()
}

const wakeLatch = (channel: Channel) => {
  for (const waiter of channel.waiters) if (!waiter.signal.pending()) waiter.signal.wake()
}

/**
 * Wakes the longest-waiting waiter without a pending wake-up, whatever it asks for. Not every
 * shared waiter: a lockstep release that frees a key no registered waiter waits for sends a
 * bare `0` too, and waiters still subscribing (the only ones it can reach) look again anyway
 * once subscribed; so that `0` would wake a herd for nothing.
 */
const wakeOne = (channel: Channel) => {
  for (const waiter of channel.waiters) {
    if (waiter.signal.pending()) continue
    if (waiter.mode === "latch") return wakeLatch(channel)
    return waiter.signal.wake()
  }
}

/** Wakes the waiters of `channel` that `message` is for (see `makeWakeups`). */
const route = (channel: Channel, message: string) => {
  const handOffTo = channel.handOffTo
  if (handOffTo !== undefined) {
    // the second message of a hand-off (the release's two PUBLISHes are delivered in order,
    // nothing between them): its fence
    channel.handOffTo = undefined
    const fence = Number(message)
    if (Number.isSafeInteger(fence) && fence > 1) {
      const named = channel.byCode.get(handOffTo)
      if (named !== undefined) {
        for (const waiter of named) {
          waiter.claim = fence
          waiter.signal.wake()
        }
      }
      return
    }
  }
  if (message.length === handOffLength && message.startsWith("1")) {
    // the first message of a hand-off: whose it is
    channel.handOffTo = String(Number(message.slice(1)))
    return
  }
  if (message === "0" || message === "1") {
    if (channel.skipZero) {
      channel.skipZero = false
      return
    }
    return wakeOne(channel)
  }
  let body = message
  if (body.startsWith("-")) {
    channel.skipZero = true
    body = body.slice(1)
  }
  if (body === "1") return
  if (body === "2") return wakeShared(channel)
  const named = channel.byCode.get(body)
  if (named !== undefined) {
    for (const waiter of named) waiter.signal.wake()
    return
  }
  // an older lockstep names a fair queue's head; a code of no waiter here is for another process
  for (const waiter of channel.waiters) {
    if (waiter.holder === body) return waiter.signal.wake()
  }
}

/**
 * The hand-off announced to `waiter`, if it is one it may rely on: its fence is above the fence
 * floor of the waiter's last denied attempt, so the claim was granted after that attempt was
 * processed on the server, which was after the waiter sent it (the claim's lease starts no
 * earlier than that send: what the waiting loop measures its deadline from). A claim announced
 * before a later denial (one that expired, its message late) is below that denial's floor.
 */
const takeHandOff = (waiter: Waiter): HandOff | undefined => {
  const fence = waiter.claim
  waiter.claim = undefined
  return fence !== undefined && fence > waiter.floor && waiter.claimMs > 0 ? { fence, claimMs: waiter.claimMs } : undefined
}

// ---------------------------------------------------------------------------------------------
// the hub: channels, and the waiters on them
// ---------------------------------------------------------------------------------------------

/** A channel whose SUBSCRIBE is `ready`, with no waiter yet. */
const subscribed = (ready: Promise<unknown>): Channel => {
  const channel: Channel = {
    waiters: new Set(),
    byCode: new Map(),
    ready,
    failed: false,
    skipZero: false,
    handOffTo: undefined,
    idle: undefined
  }
  // the failure is reported to the subscribing waiter
  ready.catch(() => {
    channel.failed = true
  })
  return channel
}

/** A new waiter of `holder`, woken through `signal`. */
const newWaiter = (
  holder: string,
  mode: HoldMode | "latch",
  signal: WaiterSignal,
  abandon: ((member: string, leaseMs: number) => void) | undefined
): Waiter => ({
  holder,
  code: wakeCode(holder),
  mode,
  signal,
  member: undefined,
  leaseMs: 0,
  abandon,
  floor: Infinity,
  claimMs: 0,
  claim: undefined
})

const addWaiter = (channel: Channel, waiter: Waiter): void => {
  channel.waiters.add(waiter)
  let named = channel.byCode.get(waiter.code)
  if (named === undefined) {
    named = new Set()
    channel.byCode.set(waiter.code, named)
  }
  named.add(waiter)
}

/** Takes `waiter` off `channel`: whether it was on it. */
const removeWaiter = (channel: Channel, waiter: Waiter): boolean => {
  if (!channel.waiters.delete(waiter)) return false
  const named = channel.byCode.get(waiter.code)
  named?.delete(waiter)
  if (named?.size === 0) channel.byCode.delete(waiter.code)
  return true
}

/**
 * Routes wake-ups from the backend's single subscriber connection to the waiters of this
 * process. Channels are reference-counted: subscribed for the first waiter of a key, and
 * unsubscribed once no waiter has used them for `idleMs` (a key that is waited on again and
 * again keeps its subscription instead of a SUBSCRIBE / UNSUBSCRIBE per wait). Each waiter's
 * signal comes from the backend's `lifecycle`, which wakes them all when it closes.
 *
 * Messages (see scripts/lock.ts): a wake code wakes the waiter it names (`-<code>`: and the `0`
 * that follows belongs to the same release; `-1`: only that); `1` and the code zero-padded to 17
 * digits, then a fence: a hand-off, the release granted that waiter a claim with that fence (see
 * `wake` in scripts/shared.ts), and wakes it; `2` every shared waiter; `0`
 * (Redisson's unlock message, or a release that knew of no registered waiter) the longest-waiting
 * one without a pending wake-up (on a latch's channel, where `0` and `1` say the count changed:
 * every waiter). A name (an older lockstep telling a fair queue's head) wakes the waiter with that
 * holder id.
 */
export const makeWakeups = (
  subscriber: Subscriber,
  subscribeTimeout: (p: Promise<unknown>) => Effect.Effect<void, unknown>,
  lifecycle: Pick<Lifecycle, "waiterSignal">,
  idleMs: number = idleUnsubscribeMs
) => {
  const channels = new Map<string, Channel>()

  /** After a reconnect, notifications may have been missed: every waiter retries. */
  const wakeAll = () => {
    for (const channel of channels.values()) {
      channel.skipZero = false
      channel.handOffTo = undefined
      for (const waiter of channel.waiters) waiter.signal.wake()
    }
  }

  const waiterOf = (name: string, holder: string, code: string): Waiter | undefined => {
    const channel = channels.get(name)
    if (channel === undefined) return undefined
    for (const waiter of channel.byCode.get(code) ?? []) if (waiter.holder === holder) return waiter
    return undefined
  }

  /** The channel `name`, subscribed (again, if the last SUBSCRIBE failed) and kept from going idle. */
  const channelFor = (name: string): Channel => {
    let channel = channels.get(name)
    if (channel !== undefined && channel.failed) {
      channels.delete(name)
      channel = undefined
    }
    if (channel === undefined) {
      channel = subscribed(subscriber.subscribe(name))
      channels.set(name, channel)
    }
    if (channel.idle !== undefined) {
      clearTimeout(channel.idle)
      channel.idle = undefined
    }
    return channel
  }

  const unsubscribe = (name: string, channel: Channel) => {
    channel.idle = undefined
    if (channel.waiters.size === 0 && channels.get(name) === channel) {
      channels.delete(name)
      subscriber.unsubscribe(name).catch(() => undefined)
    }
  }

  /** `waiter` leaves `channel` (its signal ends); the channel goes idle with its last waiter. */
  const leave = (name: string, channel: Channel, waiter: Waiter) => {
    waiter.signal.close()
    if (!removeWaiter(channel, waiter)) return
    if (channel.waiters.size === 0 && channels.get(name) === channel && channel.idle === undefined) {
      if (channel.failed || idleMs <= 0) return unsubscribe(name, channel)
      const timer = setTimeout(() => unsubscribe(name, channel), idleMs)
      timer.unref?.()
      channel.idle = timer
    }
  }

  const subscribe = (
    name: string,
    holder: string,
    mode: HoldMode | "latch",
    abandon?: (member: string, leaseMs: number) => void
  ): Effect.Effect<Subscription, unknown, Scope.Scope> =>
    Effect.acquireRelease(
      Effect.suspend(() => {
        const channel = channelFor(name)
        const waiter = newWaiter(holder, mode, lifecycle.waiterSignal(), abandon)
        addWaiter(channel, waiter)
        return Effect.as(
          Effect.onError(subscribeTimeout(channel.ready), () => Effect.sync(() => leave(name, channel, waiter))),
          { channel, waiter }
        )
      }),
      ({ channel, waiter }, exit: Exit.Exit<unknown, unknown>) =>
        Effect.sync(() => {
          leave(name, channel, waiter)
          if (exit._tag === "Failure") {
            // a waiter leaving without a grant passes any wake-up on: here, and (if a release
            // had already aimed one at it) on the server
            wakeOne(channel)
            if (waiter.member !== undefined && waiter.abandon !== undefined) waiter.abandon(waiter.member, waiter.leaseMs)
          }
        })
    ).pipe(
      Effect.map(({ waiter }): Subscription => ({
        ...waiter.signal.subscription,
        takeHandOff: Effect.sync(() => takeHandOff(waiter))
      }))
    )

  return {
    subscribe,
    onMessage: (name: string, message: string): void => {
      const channel = channels.get(name)
      if (channel !== undefined) route(channel, message)
    },
    wakeAll,
    /** Whether `holder` (wake code `code`) waits on a subscription to `name`: its denied attempts then register it. */
    isWaiting: (name: string, holder: string, code: string): boolean => waiterOf(name, holder, code) !== undefined,
    /** An attempt of `holder` (with a lease of `leaseMs`) registered it in the key's waiters set as `member`. */
    registered: (name: string, holder: string, code: string, member: string, leaseMs = 0): void => {
      const waiter = waiterOf(name, holder, code)
      if (waiter !== undefined) {
        waiter.member = member
        waiter.leaseMs = leaseMs
      }
    },
    /**
     * An attempt of `holder` that asked for claims of `claimMs` was denied, with fence floor
     * `floor` (`undefined`: the reply had none, so no hand-off is relied on until the next one).
     */
    denied: (name: string, holder: string, code: string, floor: number | undefined, claimMs: number): void => {
      const waiter = waiterOf(name, holder, code)
      if (waiter !== undefined) {
        waiter.floor = floor ?? Infinity
        waiter.claimMs = claimMs
      }
    },
    /** Channels subscribed (or still kept after their last waiter left). */
    channelCount: () => channels.size,
    /**
     * The backend is closing: stops the pending unsubscribes and forgets the channels. The
     * lifecycle's close wakes the waiters (their next call then fails as closed instead of
     * waiting for a wake-up that will not come).
     */
    close: () => {
      for (const channel of channels.values()) if (channel.idle !== undefined) clearTimeout(channel.idle)
      channels.clear()
    }
  }
}
