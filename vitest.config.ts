import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["packages/*/test/**/*.test.ts"],
    // two test files at a time: the suites mostly wait on servers and timers, and one at a time
    // (the default on two cores) keeps CI far longer than the work it does
    maxWorkers: 2,
    minWorkers: 1,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ["default"]
  }
})
