import { assert, describe, it } from "@effect/vitest"
import * as Rules from "@lockstep/core/Rules"
import { Model } from "@lockstep/testkit"
import * as ModelModule from "@lockstep/testkit/Model"

// The rules themselves are tested where they live: packages/core/test/Rules.test.ts.
describe("testkit's Model", () => {
  it("is core's Rules under the test tools' name: every export, the very same value", () => {
    assert.deepStrictEqual(Object.keys(ModelModule).sort(), Object.keys(Rules).sort())
    for (const [name, value] of Object.entries(Rules)) {
      assert.strictEqual((ModelModule as Record<string, unknown>)[name], value, name)
    }
    assert.strictEqual(Model.acquire, Rules.acquire)
  })
})
