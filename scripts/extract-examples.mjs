// Writes the examples `pnpm typecheck` compiles: every ```ts block of README.md to
// readme-examples/example-N.ts, every ```ts block of a guide (docs/<page>.md, docs/<dir>/<page>.md)
// to readme-examples/docs-<page>-N.ts (<dir>-<page> below docs/), every ```ts block of a package's
// README (packages/<package>/README.md) to jsdoc-examples/<package>/README-N.ts, and every ```ts block of an `@example` tag in the JSDoc of a public
// module (packages/*/src/*.ts) to jsdoc-examples/<package>/<Module>-<line>.ts, <line> being where
// the block starts in the module.
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"

const root = new URL("../", import.meta.url)

const fresh = (path) => {
  const dir = new URL(path, root)
  rmSync(dir, { recursive: true, force: true })
  mkdirSync(dir, { recursive: true })
  return dir
}

/** The ```ts blocks of a Markdown text. */
const markdownExamples = (text) => [...text.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1])

const readme = readFileSync(new URL("README.md", root), "utf8")
const blocks = markdownExamples(readme)
const readmeDir = fresh("readme-examples/")
blocks.forEach((code, i) => writeFileSync(new URL(`example-${i + 1}.ts`, readmeDir), code))
console.log(`README: ${blocks.length} examples extracted for typechecking`)

/** The Markdown files below `dir` (a URL ending in /), as paths relative to it, in order. */
const markdownFiles = (dir, prefix = "") => {
  let entries
  try {
    entries = readdirSync(dir, { withFileTypes: true })
  } catch {
    return []
  }
  return entries
    .sort((a, b) => a.name.localeCompare(b.name))
    .flatMap((entry) =>
      entry.isDirectory()
        ? markdownFiles(new URL(`${entry.name}/`, dir), `${prefix}${entry.name}/`)
        : entry.name.endsWith(".md") ? [`${prefix}${entry.name}`] : []
    )
}

let guideCount = 0
const docs = new URL("docs/", root)
for (const page of markdownFiles(docs)) {
  const name = page.replace(/\.md$/, "").replaceAll("/", "-")
  markdownExamples(readFileSync(new URL(page, docs), "utf8")).forEach((code, i) => {
    writeFileSync(new URL(`docs-${name}-${i + 1}.ts`, readmeDir), `// docs/${page}, example ${i + 1}\n${code}`)
    guideCount++
  })
}
console.log(`docs: ${guideCount} examples of the guides extracted for typechecking`)

/** The ```ts blocks of the `@example` tags of `source`: each with the line it starts on (1-based). */
const jsdocExamples = (source) => {
  const examples = []
  for (const comment of source.matchAll(/\/\*\*[\s\S]*?\*\//g)) {
    const firstLine = source.slice(0, comment.index).split("\n").length
    const lines = comment[0].split("\n")
    let inExample = false
    let block = undefined
    lines.forEach((line, i) => {
      const text = line.replace(/^\s*\/?\*\*? ?/, "")
      if (block !== undefined) {
        if (/^```\s*$/.test(text)) {
          examples.push(block)
          block = undefined
        } else {
          block.code.push(text)
        }
      } else if (/^@example\b/.test(text)) {
        inExample = true
      } else if (/^@\w/.test(text)) {
        inExample = false
      } else if (inExample && /^```ts\s*$/.test(text)) {
        block = { line: firstLine + i, code: [] }
      }
    })
    if (block !== undefined) throw new Error(`an @example block that does not end, line ${block.line}`)
  }
  return examples
}

const jsdocDir = fresh("jsdoc-examples/")
let count = 0
let packageReadmeCount = 0
const packages = new URL("packages/", root)
for (const pkg of readdirSync(packages).sort()) {
  const src = new URL(`${pkg}/src/`, packages)
  let modules
  try {
    modules = readdirSync(src).filter((name) => name.endsWith(".ts")).sort()
  } catch {
    continue
  }
  let readmeText
  try {
    readmeText = readFileSync(new URL(`${pkg}/README.md`, packages), "utf8")
  } catch {
    readmeText = ""
  }
  const readmeExamples = markdownExamples(readmeText)
  if (readmeExamples.length > 0) mkdirSync(new URL(`${pkg}/`, jsdocDir), { recursive: true })
  readmeExamples.forEach((code, i) => {
    writeFileSync(new URL(`${pkg}/README-${i + 1}.ts`, jsdocDir), `// packages/${pkg}/README.md, example ${i + 1}\n${code}`)
    packageReadmeCount++
  })
  for (const module of modules) {
    const examples = jsdocExamples(readFileSync(new URL(module, src), "utf8"))
    if (examples.length === 0) continue
    const dir = new URL(`${pkg}/`, jsdocDir)
    mkdirSync(dir, { recursive: true })
    for (const { line, code } of examples) {
      const name = `${module.replace(/\.ts$/, "")}-${line}.ts`
      writeFileSync(new URL(name, dir), `// packages/${pkg}/src/${module}:${line}\n${code.join("\n")}\n`)
      count++
    }
  }
}
console.log(`JSDoc: ${count} @example blocks of the public modules extracted for typechecking`)
console.log(`packages: ${packageReadmeCount} examples of the packages' READMEs extracted for typechecking`)
