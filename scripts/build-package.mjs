// Builds the package in the current directory to dist/, as it is published (`build` of every
// package runs this; the root `build` runs them all, dependencies first):
// - dist/esm: ES modules, .d.ts, declaration maps and source maps, by tsc (tsconfig.build.json,
//   which extends the root tsconfig.base.json);
// - dist/cjs: the same modules as CommonJS, each ES module of dist/esm transformed on its own by
//   esbuild (its source map composed with tsc's, so it maps to src/), with the .d.ts copied beside
//   them and a package.json {"type":"commonjs"} that makes the directory CommonJS to Node and to
//   TypeScript (so the `require` condition's types are CommonJS declarations).
// It first checks that the manifest's exports name exactly the public modules
// (scripts/package-exports.mjs), and copies the repository's LICENSE in (gitignored copies).
import { execFileSync } from "node:child_process"
import { copyFileSync, cpSync, existsSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import * as esbuild from "esbuild"
import { checkManifest } from "./package-exports.mjs"

const root = fileURLToPath(new URL("..", import.meta.url))
const dir = process.cwd()
const { manifest, expected, problems } = checkManifest(dir)
const fail = (message) => {
  console.error(`${manifest.name}: ${message}`)
  process.exit(1)
}
if (problems.length > 0) {
  fail(`${problems.join(", ")} must name the public modules (run node scripts/package-exports.mjs --write)`)
}
if (!existsSync(join(dir, "README.md"))) fail("has no README.md")

const dist = join(dir, "dist")
rmSync(dist, { recursive: true, force: true })
execFileSync(join(root, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.build.json"], { cwd: dir, stdio: "inherit" })

const files = (at, suffix) =>
  readdirSync(at, { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith(suffix))
    .map((entry) => join(entry.parentPath, entry.name))
const esm = join(dist, "esm")
const cjs = join(dist, "cjs")
const modules = files(esm, ".js")
esbuild.buildSync({
  entryPoints: modules,
  outdir: cjs,
  outbase: esm,
  format: "cjs",
  platform: "node",
  target: "node20",
  bundle: false,
  // reads tsc's map of each input, so the CommonJS maps point at src/ as the ES module maps do;
  // src/ is published, so the maps need not embed it
  sourcemap: true,
  sourcesContent: false,
  logLevel: "warning"
})
// the declarations (and their maps, which point at ../../src as from dist/esm), beside the CommonJS
cpSync(esm, cjs, { recursive: true, filter: (path) => !path.endsWith(".js") && !path.endsWith(".js.map") })
writeFileSync(join(cjs, "package.json"), JSON.stringify({ type: "commonjs" }, null, 2) + "\n")

for (const [format, at] of [["esm", esm], ["cjs", cjs]]) {
  const count = files(at, ".js").length
  if (count !== modules.length) fail(`dist/${format} has ${count} modules, not ${modules.length}`)
  for (const module of expected.modules) {
    for (const suffix of [".js", ".js.map", ".d.ts", ".d.ts.map"]) {
      if (!existsSync(join(at, module + suffix))) fail(`dist/${format}/${module}${suffix} was not built`)
    }
  }
}

copyFileSync(join(root, "LICENSE"), join(dir, "LICENSE"))
console.log(
  `${manifest.name}: built ${expected.modules.length} public modules (${modules.length} in all) to ${relative(root, dist)}/esm and /cjs`
)
