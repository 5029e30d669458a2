/**
 * Rows as the drivers answer them, read into what the rules of `@lockstep/core/Rules` decide on:
 * the keys' documents, the database's clock, the ended holders an operation asks about.
 */
import * as Rules from "@lockstep/core/Rules"
import { decode, type Document, emptyDocument } from "./document.js"

/** A statement's rows, as the drivers answer. */
export type Rows = ReadonlyArray<Record<string, unknown>>

export const asNumber = (value: unknown): number => (typeof value === "number" ? value : Number(value))

/** `name` as the driver returns it: MySQL's binary column arrives as a Buffer. */
export const asName = (value: unknown): string =>
  typeof value === "string" ? value : value instanceof Uint8Array ? Buffer.from(value).toString("utf8") : String(value)

/** A row as a transaction found it. */
export interface Loaded {
  readonly text: string
  readonly document: Document
  readonly version: number
}

/** A row's `state` column as text ("" for none). */
const stateText = (row: Record<string, unknown>): string =>
  row["state"] === null || row["state"] === undefined ? "" : String(row["state"])

/** The rows a lock statement returned, by name, and the database's clock as it read them. */
export const loadedOf = (rows: Rows) => {
  const loaded = new Map<string, Loaded>()
  let now = 0
  for (const row of rows) {
    const text = stateText(row)
    loaded.set(asName(row["name"]), { text, document: decode(text), version: asNumber(row["version"]) })
    now = asNumber(row["now"])
  }
  return { loaded, now }
}

/** The one row of a read without a lock (`readRow`), as `loadedOf` answers. */
export const readOf = (rows: Rows, key: string) => {
  const row = rows[0] ?? {}
  const text = stateText(row)
  return { loaded: new Map([[key, { text, document: decode(text), version: 0 }]]), now: asNumber(row["now"]) }
}

/** The ended holders a `readEnded` statement found, with the time each is remembered until. */
export const endedOfRows = (rows: Rows): Map<string, number> =>
  new Map(rows.map((row) => [asName(row["holder"]), asNumber(row["expires_at"])]))

/** The ended holders of `key` an operation asks about (`ids`) and may add to (see `Rules`). */
export interface Remembered {
  readonly key: string
  readonly ids: ReadonlyArray<string>
  /**
   * Acquire and release: the rules ask about `ids` only when this holder holds nothing on the key
   * (a late copy, or a re-entry into a hold that is gone); while it holds, they are not read.
   */
  readonly unlessHolding?: string
}

/** Acquire and release ask whether the holder ended, and whether it ended without holding. */
export const endedOf = (key: string, holder: string): Remembered => ({ key, ids: [holder, Rules.endedUnheld(holder)], unlessHolding: holder })

/** The rules' state of the rows `names`, with the ended holders `ended` of `endedKey`. */
export const stateOf = (
  names: ReadonlyArray<string>,
  loaded: ReadonlyMap<string, Loaded>,
  endedKey?: string,
  ended?: ReadonlyMap<string, number>
): Rules.State => ({
  keys: new Map(names.map((key) => {
    const state = (loaded.get(key)?.document ?? emptyDocument).key
    return [key, key === endedKey && ended !== undefined ? { ...state, ended } : state]
  })),
  latches: new Map(
    names.flatMap((key) => {
      const latch = loaded.get(key)?.document.latch
      return latch === undefined ? [] : [[key, latch] as const]
    })
  )
})
