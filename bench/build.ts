/**
 * Compiles the benchmarks, lockstep's packages with them, to plain JavaScript in `bench/.build/`,
 * so that lockstep is measured as its users run it: compiled, like the peers it is compared with
 * (loaded from their published builds). Running the sources through a TypeScript loader would add
 * its own cost to lockstep alone (a name-keeping call on every function it creates, source maps).
 * Everything else (effect, ioredis, the peers) stays external: imported from where the importing
 * package finds it in node_modules, as it would be without the build.
 */
import { build } from "esbuild"
import { fileURLToPath } from "node:url"

const resolving = Symbol("resolving")
const here = fileURLToPath(new URL(".", import.meta.url))

await build({
  absWorkingDir: here,
  entryPoints: ["src/main.ts", "src/worker.ts", "src/profile.ts"],
  outdir: ".build",
  outExtension: { ".js": ".mjs" },
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  sourcemap: false,
  logLevel: "warning",
  plugins: [{
    name: "external-packages-but-lockstep",
    setup(b) {
      // bare imports are external, except lockstep's own workspace packages (TypeScript sources)
      b.onResolve({ filter: /^[^./]/ }, async (args) => {
        if (args.kind === "entry-point" || args.path.startsWith("@lockstep/") || args.path.startsWith("node:") || args.pluginData === resolving) {
          return undefined
        }
        const found = await b.resolve(args.path, { resolveDir: args.resolveDir, kind: args.kind, pluginData: resolving })
        return found.errors.length > 0 ? { errors: found.errors } : { path: found.path, external: true }
      })
    }
  }]
})
