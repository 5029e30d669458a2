import { describe } from "@effect/vitest"
import * as Conformance from "@lockstep/testkit/Conformance"
import * as RedisMock from "@lockstep/testkit/RedisMock"

describe("Redis backend on ioredis-mock", () => {
  // the mock's Lua VM is slow: fewer model-based runs than on a real server
  Conformance.suite({
    name: "ioredis-mock",
    layer: RedisMock.layer,
    clock: "live",
    dataLoss: RedisMock.layerDataLoss,
    modelRuns: 100
  })
})
