// The public modules of a package are its top-level src/*.ts files (index.ts is "."); nothing under
// src/internal is public. From that listing follow three manifest fields, kept here in one place:
// - `exports`: the sources, for the workspace (tests, tsc, tsx and the bench run without a build);
// - `publishConfig.exports`: the build, `import` and `require` each with its own types (pnpm puts
//   it in place of `exports` when it packs);
// - `publishConfig.typesVersions`: the subpaths' CommonJS types for resolvers that predate
//   `exports` (TypeScript's `node10`), as Effect's own packages ship them.
//
//   node scripts/package-exports.mjs          check every package (exit 1 on a difference)
//   node scripts/package-exports.mjs --write  rewrite the fields that differ
//
// scripts/build-package.mjs runs the check before it builds.
import { readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

/** The public modules of the package in `dir`, by name ("index" is the package root). */
export const publicModules = (dir) =>
  readdirSync(join(dir, "src"), { withFileTypes: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts"))
    .map((entry) => entry.name.slice(0, -3))
    .sort((a, b) => (a === "index" ? -1 : b === "index" ? 1 : a < b ? -1 : a > b ? 1 : 0))

const subpath = (module) => (module === "index" ? "." : `./${module}`)

/** The three fields as they must be for the package in `dir`. */
export const expectedFields = (dir) => {
  const modules = publicModules(dir)
  const exports = { "./package.json": "./package.json" }
  const publishExports = { "./package.json": "./package.json" }
  const typesVersions = {}
  for (const module of modules) {
    exports[subpath(module)] = `./src/${module}.ts`
    publishExports[subpath(module)] = {
      import: { types: `./dist/esm/${module}.d.ts`, default: `./dist/esm/${module}.js` },
      require: { types: `./dist/cjs/${module}.d.ts`, default: `./dist/cjs/${module}.js` }
    }
    if (module !== "index") typesVersions[module] = [`./dist/cjs/${module}.d.ts`]
  }
  return { modules, exports, publishExports, typesVersions: { "*": typesVersions } }
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b)

/** The differences between the manifest of the package in `dir` and the expected fields. */
export const checkManifest = (dir) => {
  const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
  const expected = expectedFields(dir)
  const problems = []
  if (!same(manifest.exports, expected.exports)) problems.push("exports")
  if (!same(manifest.publishConfig?.exports, expected.publishExports)) problems.push("publishConfig.exports")
  if (!same(manifest.publishConfig?.typesVersions, expected.typesVersions)) problems.push("publishConfig.typesVersions")
  return { manifest, expected, problems }
}

const writeManifest = (dir) => {
  const { manifest, expected, problems } = checkManifest(dir)
  if (problems.length === 0) return false
  manifest.exports = expected.exports
  const publishConfig = {}
  for (const [key, value] of Object.entries(manifest.publishConfig ?? {})) {
    if (key === "exports" || key === "typesVersions") continue
    publishConfig[key] = value
  }
  publishConfig.typesVersions = expected.typesVersions
  publishConfig.exports = expected.publishExports
  manifest.publishConfig = publishConfig
  writeFileSync(join(dir, "package.json"), JSON.stringify(manifest, null, 2) + "\n")
  return true
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = fileURLToPath(new URL("..", import.meta.url))
  const write = process.argv.includes("--write")
  let failed = false
  for (const name of readdirSync(join(root, "packages")).sort()) {
    const dir = join(root, "packages", name)
    if (write) {
      if (writeManifest(dir)) console.log(`packages/${name}/package.json: exports rewritten`)
    } else {
      const { manifest, problems } = checkManifest(dir)
      if (problems.length > 0) {
        failed = true
        console.error(`${manifest.name}: ${problems.join(", ")} differ from src/ (run node scripts/package-exports.mjs --write)`)
      }
    }
  }
  if (failed) process.exit(1)
}
