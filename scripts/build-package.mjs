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
import { copyFileSync, cpSync, existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { dirname, join, relative } from "node:path"
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
const effectRange = manifest.peerDependencies?.effect ?? manifest.dependencies?.effect
if (effectRange !== undefined) guardEffectImports(esm, effectRange)
const modules = files(esm, ".js")
esbuild.buildSync({
  // the guard of effect's version is written for CommonJS on its own (writeEffectGuard)
  entryPoints: modules.filter((module) => !module.endsWith(join("internal", "effect-guard.js"))),
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
if (effectRange !== undefined) writeEffectGuard(cjs, "cjs", effectRange)

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

/**
 * An application that loads another line of effect than the one we are built for (Effect 4, say,
 * which npm installs by default) must get one clear error naming both versions, not Node's
 * `does not provide an export named …`, which an ES module's named imports raise while the module
 * graph is linked, before any of our code could run. So every module's imports from effect are
 * rewritten to one namespace import of `effect`, taken from a guard module (internal/effect-guard.js)
 * that checks the version when it is evaluated, which is before the module importing it runs;
 * the names are then read from that namespace. Each rewrite stays on its line, so the source maps
 * still hold. The declarations (.d.ts) are not touched.
 */
function guardEffectImports(esm, range) {
  const guard = join(esm, "internal", "effect-guard.js")
  const importLine = /^import (\{[^}]*\}|\* as (\w+)) from "effect(?:\/(\w+))?";$/gm
  for (const file of files(esm, ".js")) {
    const source = readFileSync(file, "utf8")
    let first = true
    const rewritten = source.replace(importLine, (_, what, namespace, module) => {
      const from = module === undefined ? "effect$" : `effect$.${module}`
      const binding = namespace !== undefined
        ? `const ${namespace} = ${from};`
        : `const ${what.replace(/\b(\w+) as (\w+)\b/g, "$1: $2")} = ${from};`
      if (!first) return binding
      first = false
      let path = relative(dirname(file), guard).replaceAll("\\", "/")
      if (!path.startsWith(".")) path = `./${path}`
      return `import { effect as effect$ } from "${path}"; ${binding}`
    })
    if (rewritten !== source) writeFileSync(file, rewritten)
  }
  writeEffectGuard(esm, "esm", range)
}

/**
 * The guard module of `importLine`'s rewrite, as an ES module or as CommonJS. It reads effect's
 * version from its package.json where Node's require can (not in a bundle without node_modules,
 * nor in a browser: there it judges by effect's modules alone), and refuses another line of effect.
 */
function writeEffectGuard(at, format, range) {
  const [major, minor] = range.replace(/^\^/, "").split(".").map(Number)
  const check = `
let version, where = "";
try {
  version = requireHere("effect/package.json").version;
  where = " (from " + requireHere.resolve("effect/package.json").replace(/[\\\\/]package\\.json$/, "") + ")";
} catch {}
const [major, minor] = (version ?? "").split(".").map(Number);
// Effect ${major} has these modules; the next line has neither
const line = typeof effect.Context === "object" && typeof effect.Either === "object";
if (version !== undefined ? major !== ${major} || minor < ${minor} : !line) {
  throw new Error(
    "${manifest.name} needs effect ${range} (the Effect ${major} line), but this application loaded " +
      (version !== undefined ? "effect " + version + where : "another line of effect (it has no Context or Either module)") +
      ": install effect@${range} beside it (npm install effect@${range})"
  );
}
`
  const source = format === "esm"
    ? `// Checks the version of effect before any module of this package runs (see scripts/build-package.mjs)
import * as effect from "effect";
// Node's require, without importing node:module (a browser bundle has none)
let requireHere;
try {
  requireHere = globalThis.process?.getBuiltinModule?.("node:module")?.createRequire(import.meta.url);
} catch {}
requireHere ??= () => { throw new Error("no require"); };${check}export { effect };
`
    : `"use strict";
// Checks the version of effect before any module of this package runs (see scripts/build-package.mjs)
const effect = require("effect");
const requireHere = require;${check}exports.effect = effect;
`
  writeFileSync(join(at, "internal", "effect-guard.js"), source)
}
