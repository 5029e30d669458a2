import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"

const fixture = fileURLToPath(new URL("./fixtures/lockThenExit.ts", import.meta.url))
const root = fileURLToPath(new URL("../../..", import.meta.url))

describe("process exit", () => {
  it.live("a program that released its locks exits at once, not when the next renewal would be due", () =>
    Effect.gen(function*() {
      const { doneAt, exitedAt, stdout } = yield* Effect.async<{ doneAt: number; exitedAt: number; stdout: string }, Error>((resume) => {
        execFile(process.execPath, ["--import", "tsx", fixture], { cwd: root, timeout: 30_000 }, (error, stdout) => {
          const exitedAt = Date.now()
          if (error) return resume(Effect.fail(error))
          const doneAt = Number(/done at (\d+)/.exec(stdout)?.[1])
          resume(Effect.succeed({ doneAt, exitedAt, stdout }))
        })
      })
      assert.include(stdout, "released")
      // the default watchdog (30 s) would renew 7.5 s after the grant: the keeper must not wait for it
      assert.isBelow(exitedAt - doneAt, 2_000, `exited ${exitedAt - doneAt} ms after the program ended`)
    }), 40_000)
})
