// Checks one unpacked tarball (scripts/consumer-check.sh): the manifest pnpm packed has real
// versions for workspace dependencies and exports pointing at the build (never at src/ or
// internal modules), and the tarball holds the build, the sources for the source maps, the README
// and the LICENSE, and no tests.
import { execFileSync } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"

const [dir, tarball] = process.argv.slice(2)
const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
const problems = []
const text = JSON.stringify(manifest)
if (text.includes("workspace:")) problems.push("a workspace: range was packed")
const exported = JSON.stringify([manifest.exports, manifest.main, manifest.module, manifest.types, manifest.typesVersions])
if (exported.includes("/src/") || exported.includes(".ts\"") && !exported.includes(".d.ts\"")) problems.push("exports point at sources")
if (/internal/.test(exported)) problems.push("internal modules are exported")
for (const field of ["main", "module", "types", "typesVersions", "exports"]) {
  if (manifest[field] === undefined) problems.push(`${field} is missing`)
}
if (manifest.publishConfig?.exports !== undefined) problems.push("publishConfig.exports was packed")
const targets = (value) => (typeof value === "string" ? [value] : Object.values(value ?? {}).flatMap(targets))
for (const target of [...targets(manifest.exports), ...targets(manifest.typesVersions), manifest.main, manifest.module, manifest.types]) {
  if (!existsSync(join(dir, target))) problems.push(`${target} is named but not packed`)
}
for (const file of ["LICENSE", "README.md", "dist/cjs/package.json", "src/index.ts"]) {
  if (!existsSync(join(dir, file))) problems.push(`${file} is not packed`)
}
const files = execFileSync("tar", ["-tzf", tarball], { encoding: "utf8" }).trim().split("\n")
if (files.some((file) => /\/test\/|\.test\.ts$|tsconfig|\.tsbuildinfo$/.test(file))) problems.push("tests or build configuration are packed")
// @lockstep/cli installs as one program (npm install -g of its tarball alone): its bin is one
// bundled file, and nothing it depends on may be a @lockstep package (they are not published)
if (manifest.name === "@lockstep/cli") {
  for (const [name, target] of Object.entries(manifest.bin ?? {})) {
    if (!existsSync(join(dir, target))) problems.push(`bin ${name} (${target}) is not packed`)
    else if (!/^dist\/bin\/[^/]+\.cjs$/.test(target.replace(/^\.\//, ""))) problems.push(`bin ${name} is not the bundle (${target})`)
  }
  if (!existsSync(join(dir, "dist/bin/THIRD-PARTY-LICENSES.txt"))) problems.push("dist/bin/THIRD-PARTY-LICENSES.txt is not packed")
  const required = Object.keys({ ...manifest.dependencies, ...manifest.optionalDependencies })
    .concat(Object.keys(manifest.peerDependencies ?? {}).filter((name) => manifest.peerDependenciesMeta?.[name]?.optional !== true))
  const lockstep = required.filter((name) => name.startsWith("@lockstep/"))
  if (lockstep.length > 0) problems.push(`an install would fetch ${lockstep.join(", ")}, which are not published`)
}
if (problems.length > 0) {
  console.error(`${manifest.name}: ${problems.join("; ")}`)
  process.exit(1)
}
const ranges = Object.entries({ ...manifest.dependencies, ...manifest.peerDependencies })
  .map(([name, range]) => `${name} ${range}${manifest.peerDependenciesMeta?.[name]?.optional === true ? " (optional)" : ""}`)
  .join(", ")
console.log(`${manifest.name}@${manifest.version}: ${files.length} files; depends on ${ranges}`)
