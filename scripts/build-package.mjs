// Builds the package in the current directory to dist/, as it is published:
// - dist/esm: ES modules, .d.ts and source maps, by tsc (tsconfig.build.json);
// - dist/cjs: the same modules as CommonJS (esbuild, file by file from src, with source maps), with
//   the .d.ts copied beside them and a package.json that makes both CommonJS to Node and TypeScript.
// It also copies the repository's LICENSE in, and checks that `publishConfig.exports` names exactly
// the public modules (every src/*.ts; nothing under src/internal).
import { execFileSync } from "node:child_process"
import { copyFileSync, cpSync, existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join, relative } from "node:path"
import * as esbuild from "esbuild"

const root = new URL("..", import.meta.url).pathname

const dir = process.cwd()
const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
const fail = (message) => {
  console.error(`${manifest.name}: ${message}`)
  process.exit(1)
}

// the published exports must be exactly the public modules
const modules = readdirSync(join(dir, "src"))
  .filter((file) => file.endsWith(".ts") && !file.endsWith(".d.ts"))
  .map((file) => file.slice(0, -3))
const expected = ["./package.json", ...modules.map((m) => (m === "index" ? "." : `./${m}`))].sort()
const published = Object.keys(manifest.publishConfig?.exports ?? {}).sort()
if (JSON.stringify(expected) !== JSON.stringify(published)) {
  fail(`publishConfig.exports ${JSON.stringify(published)} must name the public modules ${JSON.stringify(expected)}`)
}
const dev = Object.keys(manifest.exports ?? {}).sort()
if (JSON.stringify(expected) !== JSON.stringify(dev)) {
  fail(`exports ${JSON.stringify(dev)} must name the public modules ${JSON.stringify(expected)}`)
}

rmSync(join(dir, "dist"), { recursive: true, force: true })
execFileSync(join(root, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.build.json"], { cwd: dir, stdio: "inherit" })

const sources = []
const walk = (at) => {
  for (const entry of readdirSync(at, { withFileTypes: true })) {
    const path = join(at, entry.name)
    if (entry.isDirectory()) walk(path)
    else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts")) sources.push(path)
  }
}
walk(join(dir, "src"))
esbuild.buildSync({
  entryPoints: sources,
  outdir: join(dir, "dist", "cjs"),
  outbase: join(dir, "src"),
  format: "cjs",
  platform: "node",
  target: "node20",
  sourcemap: true,
  bundle: false,
  logLevel: "warning"
})
// the declarations, next to the CommonJS files they describe
cpSync(join(dir, "dist", "esm"), join(dir, "dist", "cjs"), {
  recursive: true,
  filter: (path) => !path.endsWith(".js") && !path.endsWith(".js.map")
})
writeFileSync(join(dir, "dist", "cjs", "package.json"), JSON.stringify({ type: "commonjs" }, null, 2) + "\n")

copyFileSync(join(root, "LICENSE"), join(dir, "LICENSE"))
if (!existsSync(join(dir, "README.md"))) fail("has no README.md")
console.log(`${manifest.name}: built ${modules.length} public modules to ${relative(root, join(dir, "dist"))}`)
