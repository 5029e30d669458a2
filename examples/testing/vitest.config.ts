import { defineConfig } from "vitest/config"

// this example's own tests (the repository's vitest.config.ts runs packages/*/test only)
export default defineConfig({
  test: {
    include: ["*.test.ts"]
  }
})
