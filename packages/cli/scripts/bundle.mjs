// Bundles the `lockstep` bin into one file, dist/bin/lockstep.cjs (run by the package's `build`,
// after scripts/build-package.mjs has built the library's modules): the command line with every
// package it runs on inlined (effect, @effect/cli, @effect/platform-node, the @lockstep backends,
// ioredis, @effect/sql with the PostgreSQL, MySQL and SQLite drivers, node-zookeeper-client), so
// that the published package installs as one program with nothing to resolve beside it
// (`npm install -g lockstep-cli-<version>.tgz`), one copy of each, whatever else is installed.
//
// Left out: better-sqlite3 (a native module, built for the machine: `sqlite:` loads it from beside
// the package when it is used, and says how to install it when it is missing) and pg-native (pg's
// optional native client, never used). CommonJS, so that the bundle requires those only when they
// are used (an ES module bundle would import them as it starts).
//
// The licences of the packages inlined are written beside it (THIRD-PARTY-LICENSES.txt).
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join, relative, sep } from "node:path"
import { fileURLToPath } from "node:url"
import * as esbuild from "esbuild"

const dir = fileURLToPath(new URL("..", import.meta.url))
const out = join(dir, "dist", "bin")
mkdirSync(out, { recursive: true })

/** The modules the bundle loads from beside the package, when they are used. */
export const external = ["better-sqlite3", "pg-native", "msgpackr-extract"]

const result = await esbuild.build({
  absWorkingDir: dir,
  entryPoints: ["src/internal/bin.ts"],
  outfile: join(out, "lockstep.cjs"),
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node20",
  external,
  // the licences go to a file of their own
  legalComments: "none",
  metafile: true,
  logLevel: "warning"
})

// every package directory an input came from, with its manifest and licence
const packages = new Map()
for (const input of Object.keys(result.metafile.inputs)) {
  const path = join(dir, input)
  const at = path.lastIndexOf(`${sep}node_modules${sep}`)
  if (at < 0) continue
  const rest = path.slice(at + 14).split(sep)
  const root = path.slice(0, at + 14) + (rest[0].startsWith("@") ? join(rest[0], rest[1]) : rest[0])
  if (packages.has(root)) continue
  const manifest = JSON.parse(readFileSync(join(root, "package.json"), "utf8"))
  const licence = readdirSync(root).find((name) => /^(licen[cs]e|copying)(\.|$)/i.test(name))
  packages.set(root, { manifest, text: licence === undefined ? undefined : readFileSync(join(root, licence), "utf8").trim() })
}
const sorted = [...packages.values()].sort((a, b) => (a.manifest.name < b.manifest.name ? -1 : 1))
const missing = sorted.filter((p) => p.text === undefined && p.manifest.license === undefined)
if (missing.length > 0) {
  console.error(`@lockstep/cli: no licence found for ${missing.map((p) => p.manifest.name).join(", ")}`)
  process.exit(1)
}
writeFileSync(
  join(out, "THIRD-PARTY-LICENSES.txt"),
  "dist/bin/lockstep.cjs inlines these packages; their licences follow.\n\n" +
    sorted.map(({ manifest, text }) =>
      `${"-".repeat(78)}\n${manifest.name}@${manifest.version} (${manifest.license ?? "see below"})\n\n${text ?? `License: ${manifest.license}`}\n`
    ).join("\n")
)

const bytes = result.metafile.outputs[relative(dir, join(out, "lockstep.cjs"))]?.bytes ?? 0
if (!existsSync(join(out, "lockstep.cjs"))) {
  console.error("@lockstep/cli: dist/bin/lockstep.cjs was not written")
  process.exit(1)
}
console.log(
  `@lockstep/cli: bundled the bin to ${relative(join(dir, "..", ".."), join(out, "lockstep.cjs"))} (${(bytes / 1e6).toFixed(1)} MB, ${sorted.length} packages inlined; ${external.join(", ")} loaded from beside it)`
)
