/**
 * The scripts of the Redis backend as one Redis Functions library (Redis 7.0+), loaded once per
 * server with `FUNCTION LOAD` and called with `FCALL`; the EVALSHA scripts stay for servers that
 * refuse it (calls.ts).
 *
 * Each script's source as EVAL runs it is its helpers (shared.ts: `prelude`, `fence`, `quarantine`,
 * `base`) followed by its own code; here the helpers are defined once, at library level, and each
 * script's own code is the body of a function that takes KEYS and ARGV as its parameters, so that a
 * call runs only its own code. The helpers are the library chunk's locals, which the functions use
 * as upvalues: Lua 5.1 allows a function 60 of them (a test keeps their count well below).
 *
 * Versions: the library's name and every function's name carry a hash of the library's code, so
 * that two versions of lockstep on one server (a rolling upgrade) each load and call their own; a
 * library is never loaded with REPLACE, and one that exists already is the same code.
 */
import { createHash } from "node:crypto"
import type { Script } from "./descriptor.js"
import * as latch from "./latch.js"
import * as lock from "./lock.js"
import { base, fence, prelude, quarantine } from "./shared.js"

/** The helpers defined at library level, in the order they build on each other. */
const helpers = [prelude, fence, quarantine, base] as const

/**
 * After the helpers: the write that changes nothing, which lets an EVAL script through on a full
 * server (prelude's `writes_when_full`), is none here: the functions that must run there say so by
 * their `allow-oom` flag, and the others do not call it.
 */
const functionsOnly = `
local function writes_when_full(key)
end
`

/**
 * Function flags (Redis 7): a function without flags is refused as a whole on a server at its
 * maxmemory (`noeviction`), as an EVAL script is at its first write that may take memory: new grants,
 * fence raises and latch changes. The scripts that keep or end holds must run there too (`allow-oom`:
 * their EVAL form starts with a write that changes nothing for that), and the reads write nothing.
 */
const flagsOf: Readonly<Record<string, ReadonlyArray<string>>> = {
  release: ["allow-oom"],
  renew: ["allow-oom"],
  cancel: ["allow-oom"],
  leave: ["allow-oom"],
  forceRelease: ["allow-oom"],
  inspect: ["no-writes"],
  latchCount: ["no-writes"]
}

/** Every script of the backend. */
export const scripts: ReadonlyArray<Script> = [
  lock.acquire,
  lock.release,
  lock.renew,
  lock.inspect,
  lock.forceRelease,
  lock.raiseFence,
  lock.cancel,
  lock.leave,
  latch.setCount,
  latch.countDown,
  latch.count
]

/** A script's own code: its EVAL source without the helpers the library defines once. */
export const bodyOf = (s: Script): string => helpers.reduce((lua, helper) => lua.replace(helper, "\n"), s.lua)

/** The library's bodies and helpers, hashed: the version in its name and in its functions' names. */
const version = (() => {
  const hash = createHash("sha1")
  for (const helper of helpers) hash.update(helper)
  hash.update(functionsOnly)
  for (const s of scripts) hash.update(`\0${s.name}\0${(flagsOf[s.name] ?? []).join(",")}\0${bodyOf(s)}`)
  return hash.digest("hex").slice(0, 16)
})()

/** The library's name on the server. */
export const libraryName = `lockstep_${version}`

const functionNames = new Map<Script, string>(scripts.map((s) => [s, `${libraryName}_${s.name}`]))

/** The name of script `s`'s function in the library. */
export const functionOf = (s: Script): string => functionNames.get(s)!

/** The library's source, as `FUNCTION LOAD` takes it. */
export const source = [
  `#!lua name=${libraryName}`,
  ...helpers,
  functionsOnly,
  ...scripts.map((s) => {
    const flags = flagsOf[s.name] ?? []
    return `redis.register_function{function_name='${functionOf(s)}', flags={${
      flags.map((f) => `'${f}'`).join(", ")
    }}, callback=function(KEYS, ARGV)\n${bodyOf(s)}\nend}`
  })
].join("\n")

/** The library's source, line by line: a function's error names its line (`@user_function:N`). */
export const lines: ReadonlyArray<string> = source.split("\n")
