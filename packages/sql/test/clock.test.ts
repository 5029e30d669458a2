/**
 * A jump of the database server's clock under the SQL backend, on MariaDB, by the means MariaDB
 * offers: a session's `SET timestamp = …` sets what `NOW()` returns in that session. The MySQL
 * dialect reads its clock with `SYSDATE(6)`, which ignores that session variable — unless the
 * server runs with `--sysdate-is-now`, which makes `SYSDATE()` an alias of `NOW()`. So:
 *
 * - on the machine's MariaDB (a database of this file's own): a session whose `timestamp` is set
 *   60 s ahead does not move the backend's clock (measured);
 * - on a MariaDB server of this file's own, started with `--sysdate-is-now`: every connection the
 *   backends take sets its session's `timestamp` to the server's time plus the jump, read afresh
 *   for each transaction. Changing the jump moves the clock of every session at once, as a step
 *   of the server's clock would, and the tests measure what that does to leases and fences.
 *
 * Each test prints what it measured; the README's "Clocks" paragraph quotes it.
 */
import { existsSync } from "node:fs"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Clock, Context, Effect, Exit, Fiber, Layer, Option, Scope } from "effect"
import type { Connection } from "@effect/sql/SqlConnection"
import { SqlClient } from "@effect/sql/SqlClient"
import { Lock } from "@lockstep/core"
import type { Lease } from "@lockstep/core/Lease"
import { LockBackend } from "@lockstep/core/LockBackend"
import type { LockLost } from "@lockstep/core/LockError"
import { SqlBackend } from "@lockstep/sql"
import { clientLayer, database, required } from "./fixtures/databases.js"
import { ownMariadbWith } from "./fixtures/servers.js"

/** The server's clock as the test sets it: seconds added to the server's own time. */
interface Jump {
  seconds: number
}

/** Sets `connection`'s session clock: the server's time, plus the jump (none: the server's own). */
const setClock = (connection: Connection, jump: Jump) =>
  Effect.suspend(() => {
    const seconds = jump.seconds
    // DEFAULT first: NOW() in a session whose timestamp is set returns that timestamp
    const reset = connection.executeUnprepared("SET timestamp = DEFAULT", [], undefined)
    return seconds === 0
      ? reset
      : Effect.zipRight(reset, connection.executeUnprepared(`SET timestamp = UNIX_TIMESTAMP(NOW(6)) + ${seconds}`, [], undefined))
  })

/**
 * The client, with every connection it reserves set to the jumped clock first. The backend runs
 * every statement on a reserved connection (a transaction, or a statement of its own), so each
 * reads the clock as the jump stood when it began.
 */
const jumped = (jump: Jump): Layer.Layer<SqlClient, never, SqlClient> =>
  Layer.effect(
    SqlClient,
    Effect.map(SqlClient, (sql) =>
      new Proxy(sql, {
        get: (target, property, receiver) =>
          property === "reserve"
            ? Effect.tap(target.reserve, (connection) => setClock(connection, jump))
            : Reflect.get(target, property, receiver)
      }))
  )

/** A backend (a process of its own: its own pool) on `url`, its sessions on `jump`'s clock. */
const backendOn = (url: string, jump: Jump, options?: SqlBackend.Options) =>
  Layer.build(SqlBackend.layer(options).pipe(Layer.provide(jumped(jump)), Layer.provide(clientLayer("mysql", url)), Layer.orDie))

/** A lock made on `backend`. */
const lockOn = (backend: Context.Context<LockBackend>, key: string, options?: Lock.Options) =>
  Effect.provide(Lock.make(key, options), backend)

/** `lease.lost` in a fiber of its own: the LockLost, and the host's time (ms) when it came. */
const watchLoss = (lease: Lease) => Effect.fork(Effect.flip(lease.lost).pipe(Effect.zip(Clock.currentTimeMillis)))

/** One attempt in `scope` (held until it closes): the lease, or `None`. */
const tryIn = (lock: Lock.Lock, scope: Scope.Scope) => Scope.extend(Lock.tryAcquire(lock), scope)

/** The key's state as `backend` sees it now (ttl on its session's clock). */
const inspect = (backend: Context.Context<LockBackend>, key: string) =>
  Effect.provide(Effect.flatMap(LockBackend, (b) => b.inspect(key)), backend)

/** Tries every 50 ms until granted (held in `scope`), for at most `ms`: the host's time of the grant. */
const retryUntilGranted = (lock: Lock.Lock, scope: Scope.Scope, ms: number) =>
  Effect.gen(function*() {
    const deadline = Date.now() + ms
    while (Option.isNone(yield* tryIn(lock, scope))) {
      assert.isBelow(Date.now(), deadline, "never granted")
      yield* Effect.sleep("50 millis")
    }
    return yield* Clock.currentTimeMillis
  })

const fenceOf = (lease: Option.Option<Lease>): number => Option.getOrThrow(lease).fence

// ---- a session's timestamp on the machine's MariaDB ---------------------------------------------

const shared = await database("mysql")
describe.runIf(shared !== undefined)("SQL backend clock on the machine's MariaDB", () => {
  if (shared === undefined) return
  it.scopedLive("a session whose `timestamp` is 60 s ahead does not move the backend's clock (SYSDATE)", () =>
    Effect.gen(function*() {
      const ahead: Jump = { seconds: 60 }
      const a = yield* backendOn(shared.url, { seconds: 0 })
      const b = yield* backendOn(shared.url, ahead)
      const lease = yield* Lock.acquire(yield* lockOn(a, "session:held", { lease: "30 seconds" }))
      const refused = yield* tryIn(yield* lockOn(b, "session:held"), yield* Effect.scope)

      // what the jumped session reads: NOW() moved, SYSDATE() did not
      const sql = yield* Effect.map(Layer.build(jumped(ahead).pipe(Layer.provide(clientLayer("mysql", shared.url)))), Context.get(SqlClient))
      const connection = yield* sql.reserve
      yield* Effect.orDie(setClock(connection, ahead))
      const [row] = yield* Effect.orDie(connection.executeUnprepared(
        "SELECT UNIX_TIMESTAMP(NOW(6)) * 1000 - UNIX_TIMESTAMP(SYSDATE(6)) * 1000 AS ahead",
        [],
        undefined
      ))
      const nowAhead = Number(row?.["ahead"])
      const ttl = (yield* inspect(b, "session:held")).holders[0]?.ttlMs ?? 0
      console.log(
        `[mysql clock, session timestamp +60 s] NOW() ${Math.round(nowAhead)} ms ahead of SYSDATE(); ` +
          `the backend of that session refused a 30 s lease held (fence ${lease.fence}): ${Option.isNone(refused)}, ttl it sees ${Math.round(ttl)} ms`
      )
      assert.isAbove(nowAhead, 59_000)
      assert.isTrue(Option.isNone(refused))
      assert.isAbove(ttl, 0)
      assert.isAtMost(ttl, 30_000)
    }))
})

// ---- a step of the server's clock (a server of this file's own, --sysdate-is-now) ---------------

const mariadbd = "/usr/sbin/mariadbd"
const canStart = existsSync(mariadbd)
if (!canStart) {
  if (required) throw new Error("the SQL clock tests need mariadbd on this machine")
  console.warn("SQL clock suite NOT RUN: mariadbd not installed")
}

// SYSDATE(), the backend's clock, follows the session's timestamp as NOW() does
const serverScope = Effect.runSync(Scope.make())
afterAll(() => Effect.runPromise(Scope.close(serverScope, Exit.void)))
const own = canStart
  ? (await Effect.runPromise(Scope.extend(ownMariadbWith(["--sysdate-is-now"]), serverScope))).url
  : undefined

describe.runIf(own !== undefined)("SQL backend on MariaDB whose clock steps", () => {
  if (own === undefined) return
  /** The server's clock, as every session of both backends reads it. */
  const server: Jump = { seconds: 0 }

  it.scopedLive("forward 60 s: held leases are over at once and taken; the holders learn it late; fences follow the clock", () =>
    Effect.gen(function*() {
      server.seconds = 0
      const a = yield* backendOn(own, server)
      const b = yield* backendOn(own, server)
      const fixedA = yield* lockOn(a, "forward:fixed", { lease: "5 seconds" })
      const watchedA = yield* lockOn(a, "forward:watched", { watchdog: "6 seconds" })
      // B's lease outlasts the test's wait for A's loss: at its own deadline B would release it
      const fixedB = yield* lockOn(b, "forward:fixed", { lease: "15 seconds" })
      const watchedB = yield* lockOn(b, "forward:watched", { watchdog: "6 seconds" })
      const heldA = yield* Scope.make()
      const fixedLease = yield* Scope.extend(Lock.acquire(fixedA), heldA)
      const watchedLease = yield* Scope.extend(Lock.acquire(watchedA), heldA)
      const acquiredAt = yield* Clock.currentTimeMillis
      const fixedLost = yield* watchLoss(fixedLease)
      const watchedLost = yield* watchLoss(watchedLease)
      const heldB = yield* Scope.make()
      assert.isTrue(Option.isNone(yield* tryIn(fixedB, heldB)), "held before the step")

      server.seconds = 60
      const steppedAt = yield* Clock.currentTimeMillis
      const takenFixed = yield* tryIn(fixedB, heldB)
      const takenWatched = yield* tryIn(watchedB, heldB)
      const takenAt = yield* Clock.currentTimeMillis
      assert.isTrue(Option.isSome(takenFixed), "the fixed lease was taken over")
      assert.isTrue(Option.isSome(takenWatched), "the watched lease was taken over")
      const fenceB = fenceOf(takenFixed)
      const [watchedError, watchedAt]: readonly [LockLost, number] = yield* Fiber.join(watchedLost)
      const [fixedError, fixedAt]: readonly [LockLost, number] = yield* Fiber.join(fixedLost)
      console.log(
        `[mysql clock +60 s] B granted both keys ${takenAt - steppedAt} ms after the step; fixed: fence ${fenceB} ` +
          `= A's ${fixedLease.fence} + ${fenceB - fixedLease.fence}; A learned LockLost(${watchedError.reason}) on the ` +
          `watched key ${watchedAt - steppedAt} ms after the step, LockLost(${fixedError.reason}) on the fixed 5 s key ` +
          `${fixedAt - steppedAt} ms after it (${fixedAt - acquiredAt} ms after its grant): both held it for ${fixedAt - takenAt} ms`
      )
      // the renewal of the watched lease finds it gone; the fixed one runs to its local deadline,
      // on the host's monotonic clock, while B holds the key
      assert.strictEqual(watchedError.reason, "NotHeld")
      assert.strictEqual(fixedError.reason, "DeadlinePassed")
      assert.isAbove(fixedAt, takenAt)
      // the fence is the stepped clock's microseconds
      assert.isAbove(fenceB - fixedLease.fence, 59_000_000)

      // the clock steps back (the jump corrected): B's lease, granted on the clock ahead, lasts
      // 60 s longer, and the key's fence is remembered until the clock passes it again
      server.seconds = 0
      const ttl = (yield* inspect(a, "forward:fixed")).holders[0]?.ttlMs ?? 0
      yield* Scope.close(heldB, Exit.void)
      const again = yield* Effect.scoped(Effect.map(Lock.acquire(fixedA), (lease) => lease.fence))
      console.log(
        `[mysql clock +60 s, then back] B's 15 s lease had ${Math.round(ttl)} ms left after the step back; ` +
          `A's next fence ${again} = B's + ${again - fenceB}`
      )
      // 75 s less the time since B's grant (A's 5 s wait): far above the 15 s it was granted for
      assert.isAbove(ttl, 60_000)
      assert.strictEqual(again, fenceB + 1)
      yield* Scope.close(heldA, Exit.void)
    }), { timeout: 60_000 })

  it.scopedLive("backward 60 s: leases last 60 s longer on the server (a living holder releases at its own deadline); a remembered fence is exceeded, a forgotten key's fence goes back", () =>
    Effect.gen(function*() {
      server.seconds = 0
      // A sweeps expired rows every 200 ms: a key is forgotten soon after nothing of it matters
      const a = yield* backendOn(own, server, { sweepInterval: "200 millis" })
      const b = yield* backendOn(own, server)
      const forgottenA = yield* lockOn(a, "backward:forgotten", { lease: "1 second" })
      const forgottenFence = yield* Effect.scoped(Effect.map(Lock.acquire(forgottenA), (lease) => lease.fence))
      // forgotten: the row is swept once its lease is over (and its fence's millisecond)
      const sql = yield* Effect.map(Layer.build(clientLayer("mysql", own)), Context.get(SqlClient))
      const deadline = Date.now() + 20_000
      while ((yield* Effect.orDie(sql.unsafe("SELECT name FROM lockstep_locks WHERE name = 'backward:forgotten'"))).length > 0) {
        assert.isBelow(Date.now(), deadline, "the row was never swept")
        yield* Effect.sleep("100 millis")
      }

      const fixedA = yield* lockOn(a, "backward:fixed", { lease: "3 seconds" })
      const fencedA = yield* lockOn(a, "backward:fence")
      const fixedLease = yield* Lock.acquire(fixedA)
      const fixedLost = yield* watchLoss(fixedLease)
      const heldFence = yield* Scope.make()
      const fenceA = (yield* Scope.extend(Lock.acquire(fencedA), heldFence)).fence
      // a holder whose process died: a 3 s hold nobody renews or releases
      const service = Context.get(a, LockBackend)
      const crashed = yield* service.acquire({
        key: "backward:crashed",
        holder: `${service.clientId}:crashed`,
        mode: "exclusive",
        permits: 1,
        limit: 1,
        leaseMs: 3_000,
        fair: false,
        waiterTtlMs: 5_000,
        count: 1
      })
      assert.strictEqual(crashed._tag, "Granted")
      const crashedAt = yield* Clock.currentTimeMillis

      server.seconds = -60
      const steppedAt = yield* Clock.currentTimeMillis
      const held = yield* Scope.make()
      const ttl = (yield* inspect(b, "backward:fixed")).holders[0]?.ttlMs ?? 0
      assert.isTrue(Option.isNone(yield* tryIn(yield* lockOn(b, "backward:fixed"), held)), "refused after the step")

      // released after the step: the key remembers its fence while the clock is behind it
      yield* Scope.close(heldFence, Exit.void)
      const fenceB = fenceOf(yield* tryIn(yield* lockOn(b, "backward:fence"), held))

      // forgotten before the step: the fence comes from the clock alone, a minute back
      const forgottenB = fenceOf(yield* tryIn(yield* lockOn(b, "backward:forgotten"), held))

      // A's fixed lease ends on A's side (the host's clock), and A releases what is left of it
      const [error, lostAt] = yield* Fiber.join(fixedLost)
      const freeAt = yield* retryUntilGranted(yield* lockOn(b, "backward:fixed"), held, 20_000)
      // the crashed holder's hold, 3 s long, is past its 3 s and still has a minute on the server
      const sinceCrash = (yield* Clock.currentTimeMillis) - crashedAt
      if (sinceCrash < 3_500) yield* Effect.sleep(3_500 - sinceCrash)
      const crashedLeft = (yield* inspect(b, "backward:crashed")).holders[0]?.ttlMs ?? 0
      const crashedRefused = Option.isNone(yield* tryIn(yield* lockOn(b, "backward:crashed"), held))
      const crashedAfter = (yield* Clock.currentTimeMillis) - crashedAt
      console.log(
        `[mysql clock -60 s] A's fixed 3 s lease had ${Math.round(ttl)} ms left after the step; A learned ` +
          `LockLost(${error.reason}) ${lostAt - steppedAt} ms after the step, released what was left, and B was granted ` +
          `${freeAt - steppedAt} ms after the step. A crashed holder's 3 s hold, ${crashedAfter} ms after its grant: ` +
          `${Math.round(crashedLeft)} ms left, B refused: ${crashedRefused}. Released after the step: B's fence ` +
          `${fenceB} = A's + ${fenceB - fenceA}. Forgotten before the step: B's fence ${forgottenB} is below A's ` +
          `${forgottenFence} by ${forgottenFence - forgottenB} µs`
      )
      assert.isAbove(ttl, 55_000)
      assert.strictEqual(error.reason, "DeadlinePassed")
      assert.isBelow(freeAt - steppedAt, 30_000)
      assert.isAbove(crashedAfter, 3_000)
      assert.isTrue(crashedRefused)
      assert.isAbove(crashedLeft, 30_000)
      assert.strictEqual(fenceB, fenceA + 1)
      // a fence is never below the clock in microseconds, and nothing else holds it up once the
      // key is forgotten: a clock that steps back issues lower fences (the documented assumption)
      assert.isBelow(forgottenB, forgottenFence)
      yield* Scope.close(held, Exit.void)
      server.seconds = 0
    }), { timeout: 60_000 })
})
