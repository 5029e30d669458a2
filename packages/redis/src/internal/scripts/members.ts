/**
 * The entries of waiting holders in a lock's wait structures (see scripts/lock.ts), in one place
 * for both languages that write and read them: the TypeScript builders (the backend notes the
 * entry an attempt registers, and a cancel names the entries it takes out) and the Lua helpers
 * the scripts build and parse them with (part of `base` in shared.ts).
 *
 * - unfair waiters (`lockstep_waiters`, `lockstep_woken`): `<code>|<x|s>|<permits>|<limit>|<claimMs>|<holder>`;
 * - the fair queue (`lockstep_fair`, `lockstep_fair_ttl`): `<code>|<claimMs>|<holder>`.
 *
 * `code` is the holder's wake code, `limit` -1 for an unlimited one, `claimMs` the claim a release
 * may grant the waiter (0: wake it only). Older lockstep versions wrote `<code>|<x|s>|<permits>|<limit>`
 * and `<code>|<holder>`, which the parsers still read. A change to either form must change both
 * languages: the test `members.test.ts` runs the Lua on entries the TypeScript built.
 */
import type * as LockBackend from "@lockstep/core/LockBackend"
import { wakeCode } from "../wakeups.js"

/** `mode` as the scripts write it. */
export const modeOf = (mode: LockBackend.HoldMode): "x" | "s" => mode === "exclusive" ? "x" : "s"

/** A limit as the scripts take it (-1: unlimited). */
export const limitOf = (limit: number): number => limit === Infinity ? -1 : limit

/**
 * The entry of a subscribed unfair waiter in the waiters set, as acquire writes it on a denial
 * (`unfair_member`): a release that wakes it takes it out (and grants it a claim of `claimMs`,
 * unless 0: see `wake` in shared.ts), and so does leave.
 */
export const waiterMember = (request: LockBackend.AcquireRequest, code: string, claimMs: number): string =>
  `${code}|${modeOf(request.mode)}|${request.permits}|${limitOf(request.limit)}|${claimMs}|${request.holder}`

/**
 * The entry of `holder` in the fair queue, as acquire writes it (`fair_member`): with claimMs 0
 * until the waiter waits on a subscription, then with its claim.
 */
export const fairMember = (holder: string, claimMs: number): string => `${wakeCode(holder)}|${claimMs}|${holder}`

/** The Lua side: builders and parsers of the same entries (`fmt` is the prelude's). */
export const lua = `
-- The wait entries (members.ts builds them the same way in TypeScript): unfair
-- '<code>|<x|s>|<permits>|<limit>|<claimMs>|<holder>', fair '<code>|<claimMs>|<holder>'. claimMs
-- 0 (or an entry of the older forms '<code>|<x|s>|<permits>|<limit>' / '<code>|<holder>'): the
-- waiter is only woken, and tries again itself.
local function unfair_member(c, excl, permits, limit, claimMs, holder)
  return c .. '|' .. (excl and 'x' or 's') .. '|' .. fmt(permits) .. '|' .. fmt(limit) .. '|' .. claimMs .. '|' .. holder
end
local function fair_member(c, claimMs, holder)
  return c .. '|' .. claimMs .. '|' .. holder
end

-- The code of a fair-queue member '<code>|<holder>' or a waiter member '<code>|...'.
local function code_of(member)
  return string.sub(member, 1, string.find(member, '|', 1, true) - 1)
end

local function unfair_entry(m)
  local c, mode, p, l, rest = string.match(m, '^(%d+)|(%a)|(%d+)|(%-?%d+)(.*)$')
  if c == nil then return nil end
  local ms, h = string.match(rest, '^|(%d+)|(.+)$')
  return c, mode, tonumber(p), tonumber(l), tonumber(ms or '0'), h
end
-- The mode and permits (a string) of an unfair entry, as the places of woken waiters count them.
local function unfair_hold(m)
  return string.match(m, '^%d+|(%a)|(%d+)|')
end

local function fair_entry(m)
  local c, ms, h = string.match(m, '^(%d+)|(%d+)|(.+)$')
  if c == nil then return code_of(m), 0, nil end
  return c, tonumber(ms), h
end
-- The holder of a fair entry, of either form.
local function fair_holder(m)
  return string.match(m, '^%d+|%d+|(.+)$') or string.sub(m, string.find(m, '|', 1, true) + 1)
end
`
