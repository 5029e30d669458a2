// Builds the API reference, docs/api/, from the JSDoc of the public modules of every package
// (packages/*/src/*.ts, as scripts/package-exports.mjs defines them; nothing of src/internal) with
// @effect/docgen, the generator of Effect's own API pages:
// - docs/api/README.md: the packages;
// - docs/api/<package>/README.md: the package's modules, with the subpath each is imported from;
// - docs/api/<package>/<Module>.md: one page per module, every export with its signature, its
//   description, its examples and the version it was added in (`index` is the package's root).
//
//   node scripts/docs-api.mjs          write docs/api (pnpm docs:api)
//   node scripts/docs-api.mjs --check  fail if docs/api is not what the sources give (CI)
//
// docgen fails on an export without a description or an `@since` tag. Each page is docgen's
// Markdown made plain for a forge: a title and links instead of Jekyll's front matter, headings one
// level down. The examples are not run by docgen (it would run them all, the ones that need a
// Redis server or start one too): `pnpm typecheck` compiles every ```ts block of an `@example`
// (scripts/extract-examples.mjs), so this script fails on an example that is not one.
//
// docgen reads its configuration from a docgen.json beside package.json, nowhere else (its command
// line flags are not read in 0.5.2): each package is run from a directory of its own under the
// package's node_modules/.cache, holding package.json's name, the docgen.json below, and `src`, a
// link to the package's sources, so that a new package needs no file of its own to be documented.
import { execFile } from "node:child_process"
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync
} from "node:fs"
import { availableParallelism, tmpdir } from "node:os"
import { dirname, join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { promisify } from "node:util"
import { publicModules } from "./package-exports.mjs"

const root = fileURLToPath(new URL("..", import.meta.url))
const docgen = join(root, "node_modules", ".bin", "docgen")
const apiDir = join(root, "docs", "api")
const check = process.argv.includes("--check")
const run = promisify(execFile)

/** The configuration every package is documented with. */
const docgenConfig = (parseTsconfig) => ({
  srcDir: "src",
  outDir: "out",
  // the modules of a subdirectory (src/internal) are not public
  exclude: ["src/*/**/*.ts"],
  enforceDescriptions: true,
  enforceVersion: true,
  // the signatures of constants are printed from their inferred types: infer them as tsc does here
  parseCompilerOptions: parseTsconfig
})

/** The packages with public modules, by directory name, with their manifests. */
const packages = () =>
  readdirSync(join(root, "packages"), { withFileTypes: true })
    .filter((entry) => entry.isDirectory() && existsSync(join(root, "packages", entry.name, "package.json")))
    .map((entry) => {
      const dir = join(root, "packages", entry.name)
      const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
      const modules = existsSync(join(dir, "src")) ? publicModules(dir) : []
      return { name: entry.name, dir, manifest, modules }
    })
    .filter((pkg) => pkg.modules.length > 0)
    .sort((a, b) => a.name.localeCompare(b.name))

/** Runs docgen on one package; resolves to its Markdown by module name. */
const generate = async (pkg) => {
  const stage = join(pkg.dir, "node_modules", ".cache", "lockstep-docgen")
  rmSync(stage, { recursive: true, force: true })
  mkdirSync(stage, { recursive: true })
  writeFileSync(
    join(stage, "package.json"),
    JSON.stringify({ name: pkg.manifest.name, homepage: pkg.manifest.homepage ?? "" })
  )
  writeFileSync(join(stage, "docgen.json"), JSON.stringify(docgenConfig(join(root, "tsconfig.base.json")), null, 2))
  symlinkSync(relative(stage, join(pkg.dir, "src")), join(stage, "src"), "dir")
  try {
    try {
      await run(docgen, [], {
        cwd: stage,
        env: { ...process.env, DOCGEN_RUN_EXAMPLES: "false", NO_COLOR: "1", FORCE_COLOR: "0" },
        maxBuffer: 16 * 1024 * 1024
      })
    } catch (error) {
      const output = `${error.stdout ?? ""}${error.stderr ?? ""}`
      // docgen's errors name the files as src/...: name the package's
      throw new Error(`docgen failed on ${pkg.manifest.name}:\n${output.replaceAll(" src/", ` packages/${pkg.name}/src/`)}`)
    }
    const out = join(stage, "out", "modules")
    const pages = new Map()
    for (const module of pkg.modules) {
      const file = join(out, `${module}.ts.md`)
      if (!existsSync(file)) throw new Error(`docgen wrote no page for packages/${pkg.name}/src/${module}.ts`)
      pages.set(module, readFileSync(file, "utf8"))
    }
    return pages
  } finally {
    rmSync(stage, { recursive: true, force: true })
  }
}

/** The lines of `text` with whether each is inside a fenced code block (fence lines included). */
const fenced = (text) => {
  let inside = false
  return text.split("\n").map((line) => {
    if (/^```/.test(line)) {
      inside = !inside
      return { line, code: true }
    }
    return { line, code: inside }
  })
}

/** The problems of a docgen page: an example that is not a ```ts block is not compiled by typecheck. */
const exampleProblems = (pkg, module, markdown) => {
  const problems = []
  const lines = markdown.split("\n")
  lines.forEach((line, i) => {
    if (line !== "**Example**") return
    const next = lines.slice(i + 1).find((l) => l.trim() !== "")
    if (next !== "```ts") {
      problems.push(`packages/${pkg.name}/src/${module}.ts: an @example that is not a \`\`\`ts block (pnpm typecheck compiles only those)`)
    }
  })
  return problems
}

/** The first sentence of a paragraph, on one line: up to a full stop outside parentheses and code. */
const firstSentence = (paragraph) => {
  const text = paragraph.replace(/\s+/g, " ").trim()
  let depth = 0
  let code = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (c === "`") code = !code
    else if (!code && c === "(") depth++
    else if (!code && c === ")") depth = Math.max(0, depth - 1)
    else if (!code && depth === 0 && c === "." && (i + 1 === text.length || text[i + 1] === " ")) return text.slice(0, i + 1)
  }
  return text
}

/**
 * The descriptions of the `export * from` statements of a module, by module specifier. docgen
 * reads the first comment before a statement, which for the first export of a file is the
 * module's own: the comment right before the statement is the export's.
 */
const reexportDescriptions = (source) => {
  const descriptions = new Map()
  for (const m of source.matchAll(/\/\*\*((?:(?!\*\/)[\s\S])*)\*\/\s*export \*(?: as \w+)? from "([^"]+)"/g)) {
    const lines = []
    for (const line of m[1].split("\n").map((l) => l.replace(/^\s*\* ?/, ""))) {
      if (/^@\w/.test(line.trim())) break
      lines.push(line)
    }
    descriptions.set(m[2], lines.join("\n").trim())
  }
  return descriptions
}

const importPath = (pkg, module) => (module === "index" ? pkg.manifest.name : `${pkg.manifest.name}/${module}`)

const banner = (source) => `<!-- generated by \`pnpm docs:api\` from ${source}: edit the JSDoc there, not this page -->`

/**
 * A docgen page made plain Markdown: its Jekyll front matter becomes a title and links, its
 * headings go one level down under that title, a re-export (`export * as Lock from "./Lock.js"`)
 * has its own description and a link to the page of the module it re-exports. `pageOf` gives that
 * page's path from docs/api for a module specifier, if it is one of the reference's. Returns the
 * page, the module's overview (its first paragraph) and its problems.
 */
const page = (pkg, module, markdown, pageOf) => {
  const source = `packages/${pkg.name}/src/${module}.ts`
  const start = markdown.indexOf(`## ${module} overview`)
  if (start === -1) throw new Error(`${source}: docgen's page has no overview heading`)
  const body = markdown.slice(start).split("\n").slice(1).join("\n").trim()
  const overview = body.split(/\n\s*\n/)[0] ?? ""
  const reexports = reexportDescriptions(readFileSync(join(root, source), "utf8"))
  const problems = []
  const lines = []
  // between a re-export's heading and its signature: the description docgen took
  let skipping = false
  // the re-export whose signature block is open
  let reexport = undefined
  for (const { line, code } of fenced(body)) {
    if (skipping && line !== "**Signature**") continue
    skipping = false
    if (code) {
      lines.push(line)
      const signature = /^export \*(?: as (\w+))? from "([^"]+)"$/.exec(line)
      if (signature) {
        reexport = { name: signature[1] ?? signature[2], specifier: signature[2] }
      } else if (line === "```" && reexport !== undefined) {
        const target = pageOf(pkg, reexport.specifier)
        const link = target && relativeLink(`${pkg.name}/${module}.md`, target)
        if (link !== undefined) lines.push("", `The module's page: [${reexport.name}](${link}).`)
        reexport = undefined
      }
      continue
    }
    const from = /^## From "([^"]+)"$/.exec(line)
    if (from) {
      const description = reexports.get(from[1]) ?? ""
      if (description === "") problems.push(`${source}: the re-export of "${from[1]}" has no description`)
      lines.push(`#${line}`, "", description, "")
      skipping = true
    } else if (line === '<h2 class="text-delta">Table of contents</h2>') {
      lines.push("## Contents")
    } else {
      lines.push(/^#{1,5} /.test(line) ? `#${line}` : line)
    }
  }
  const title = module === "index" ? `\`${pkg.manifest.name}\`` : `\`${importPath(pkg, module)}\``
  const text = [
    banner(source),
    "",
    `# ${title}`,
    "",
    `[API reference](../README.md) › [${pkg.manifest.name}](README.md) · source: [${source}](../../../${source})`,
    "",
    lines.join("\n"),
    ""
  ].join("\n")
  return { text, overview, problems }
}

/** The link from one page of docs/api to another, both given relative to docs/api. */
const relativeLink = (from, to) => relative(dirname(join(apiDir, from)), join(apiDir, to)).split("\\").join("/")

const packageIndex = (pkg, overviews) =>
  [
    banner(`packages/${pkg.name}/src`),
    "",
    `# \`${pkg.manifest.name}\``,
    "",
    `[API reference](../README.md) · the package's page: [packages/${pkg.name}/README.md](../../../packages/${pkg.name}/README.md)`,
    "",
    pkg.manifest.description ? `${pkg.manifest.description}.` : "",
    "",
    "| module | import from | what it is |",
    "|---|---|---|",
    ...pkg.modules.map(
      (module) => `| [${module}](${module}.md) | \`${importPath(pkg, module)}\` | ${firstSentence(overviews.get(module) ?? "").replaceAll("|", "\\|")} |`
    ),
    ""
  ].join("\n")

const apiIndex = (pkgs) =>
  [
    banner("packages/*/src"),
    "",
    "# API reference",
    "",
    "Every export of every public module of the lockstep packages: its signature, what it does, an",
    "example and the version it was added in. The pages are generated from the JSDoc of the sources",
    "by `pnpm docs:api` ([@effect/docgen](https://github.com/Effect-TS/docgen)); the guides are in",
    "the [documentation](../README.md).",
    "",
    "| package | what it is |",
    "|---|---|",
    ...pkgs.map((pkg) => `| [\`${pkg.manifest.name}\`](${pkg.name}/README.md) | ${pkg.manifest.description ?? ""} |`),
    ""
  ].join("\n")

/** Every file of the reference, by path relative to docs/api. */
const build = async () => {
  const pkgs = packages()
  const files = new Map()
  const problems = []
  const results = new Map()
  // docgen runs tsc's parser over the package: as many at a time as there are cores
  const queue = [...pkgs]
  const worker = async () => {
    for (let pkg = queue.shift(); pkg !== undefined; pkg = queue.shift()) {
      // every package's failures, not only the first one's
      await generate(pkg).then(
        (pages) => results.set(pkg.name, pages),
        (error) => problems.push(error.message)
      )
    }
  }
  await Promise.all(Array.from({ length: Math.max(1, Math.min(availableParallelism(), pkgs.length)) }, worker))
  if (problems.length > 0) throw new Error(problems.join("\n"))
  // "./Lock.js" from a module of `pkg`, or "@lockstep/core/Rules" from anywhere
  const pageOf = (pkg, specifier) => {
    const local = /^\.\/(\w+)\.js$/.exec(specifier)
    if (local) return pkg.modules.includes(local[1]) ? `${pkg.name}/${local[1]}.md` : undefined
    const other = pkgs.find((p) => specifier === p.manifest.name || specifier.startsWith(`${p.manifest.name}/`))
    if (other === undefined) return undefined
    const module = specifier === other.manifest.name ? "index" : specifier.slice(other.manifest.name.length + 1)
    return other.modules.includes(module) ? `${other.name}/${module}.md` : undefined
  }
  for (const pkg of pkgs) {
    const overviews = new Map()
    for (const [module, markdown] of results.get(pkg.name)) {
      problems.push(...exampleProblems(pkg, module, markdown))
      const { text, overview, problems: pageProblems } = page(pkg, module, markdown, pageOf)
      problems.push(...pageProblems)
      overviews.set(module, overview)
      files.set(`${pkg.name}/${module}.md`, text)
    }
    files.set(`${pkg.name}/README.md`, packageIndex(pkg, overviews))
  }
  files.set("README.md", apiIndex(pkgs))
  if (problems.length > 0) throw new Error(problems.join("\n"))
  return files
}

/** The files below `dir`, by path relative to it. */
const filesBelow = (dir) =>
  existsSync(dir)
    ? readdirSync(dir, { recursive: true, withFileTypes: true })
        .filter((entry) => entry.isFile())
        .map((entry) => relative(dir, join(entry.parentPath, entry.name)).split("\\").join("/"))
    : []

const main = async () => {
  const started = Date.now()
  const files = await build()
  if (check) {
    const stale = []
    for (const [path, text] of files) {
      const abs = join(apiDir, path)
      if (!existsSync(abs)) stale.push(`missing: docs/api/${path}`)
      else if (readFileSync(abs, "utf8") !== text) stale.push(`out of date: docs/api/${path}`)
    }
    for (const path of filesBelow(apiDir)) if (!files.has(path)) stale.push(`not generated: docs/api/${path}`)
    if (stale.length > 0) {
      console.error(`docs/api is not what the sources give (run pnpm docs:api and commit it):\n  ${stale.join("\n  ")}`)
      process.exit(1)
    }
    console.log(`docs/api: ${files.size} pages up to date (${((Date.now() - started) / 1000).toFixed(1)}s)`)
    return
  }
  // written beside and moved in whole, so that a failed build leaves the old reference
  const next = mkdtempSync(join(tmpdir(), "lockstep-api-"))
  for (const [path, text] of files) {
    mkdirSync(join(next, path, ".."), { recursive: true })
    writeFileSync(join(next, path), text)
  }
  rmSync(apiDir, { recursive: true, force: true })
  cpSync(next, apiDir, { recursive: true })
  rmSync(next, { recursive: true, force: true })
  console.log(`docs/api: ${files.size} pages written (${((Date.now() - started) / 1000).toFixed(1)}s)`)
}

main().catch((error) => {
  console.error(error instanceof Error ? error.message : error)
  process.exit(1)
})
