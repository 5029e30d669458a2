// Checks every relative link of the documentation: README.md, docs/**/*.md, examples/**/README.md
// and packages/*/README.md. A link's file (or folder) must exist, and its #anchor must be a heading
// of the Markdown file it points to (GitHub's slugs) or an `<a id>` / `<a name>` there. Links with
// a scheme (https:, mailto:) are not checked. Exits 1 with the list of broken links.
//
//   node scripts/check-links.mjs [--pending FILE]
//
// FILE (default scripts/links-pending.txt) names paths, one a line, relative to the repository's
// root (`#` starts a comment), that count as present although they are not yet: each link to one
// is listed as pending, and a listed path that exists is reported so that it can leave the list.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs"
import { dirname, join, posix, relative, resolve } from "node:path"
import { fileURLToPath } from "node:url"

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..")

const args = process.argv.slice(2)
const pendingFlag = args.indexOf("--pending")
const pendingFile = pendingFlag === -1 ? join(root, "scripts/links-pending.txt") : resolve(args[pendingFlag + 1] ?? "")

/** The paths of `pendingFile`, relative to the root, without a trailing slash. */
const readPending = () => {
  if (!existsSync(pendingFile)) return new Set()
  return new Set(
    readFileSync(pendingFile, "utf8")
      .split("\n")
      .map((line) => line.replace(/#.*/, "").trim())
      .filter((line) => line !== "")
      .map((line) => line.replace(/\/+$/, ""))
  )
}

/** Every file below `dir` (relative to the root) whose name `keep` accepts, skipping node_modules. */
const walk = (dir, keep) => {
  const abs = join(root, dir)
  if (!existsSync(abs)) return []
  return readdirSync(abs, { withFileTypes: true }).flatMap((entry) => {
    if (entry.name === "node_modules" || entry.name.startsWith(".")) return []
    const path = posix.join(dir, entry.name)
    if (entry.isDirectory()) return walk(path, keep)
    return keep(entry.name) ? [path] : []
  })
}

const sources = () => [
  ...(existsSync(join(root, "README.md")) ? ["README.md"] : []),
  ...walk("docs", (name) => name.endsWith(".md")),
  ...walk("examples", (name) => name === "README.md"),
  ...readdirSync(join(root, "packages"))
    .map((pkg) => `packages/${pkg}/README.md`)
    .filter((path) => existsSync(join(root, path)))
].sort()

/**
 * The lines of a Markdown text outside fenced code blocks, each with its 1-based number; the
 * fenced ones are blanked, so that a `# comment` in a shell block is no heading and a link in an
 * example is not followed.
 */
const proseLines = (text) => {
  let fence = undefined
  return text.split("\n").map((line, i) => {
    const opening = /^ {0,3}(`{3,}|~{3,})/.exec(line)
    if (fence === undefined && opening) {
      fence = opening[1]
      return { n: i + 1, text: "" }
    }
    if (fence !== undefined) {
      if (new RegExp(`^ {0,3}${fence[0]}{${fence.length},}\\s*$`).test(line)) fence = undefined
      return { n: i + 1, text: "" }
    }
    return { n: i + 1, text: line }
  })
}

/** What a heading's inline Markdown shows: code, emphasis, links and HTML reduced to their text. */
const headingText = (raw) =>
  raw
    .replace(/\s+#+\s*$/, "")
    .replace(/!\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/\[([^\]]*)\]\[[^\]]*\]/g, "$1")
    .replace(/<[^>]+>/g, "")
    .trim()

/**
 * GitHub's slug of a heading (github-slugger): lower case, every character that is not a letter,
 * a mark, a number, `_`, `-` or a space removed, spaces turned into `-`.
 */
const slug = (text) =>
  headingText(text)
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc}\- ]/gu, "")
    .replace(/ /g, "-")

const anchorsCache = new Map()

/** The anchors of a Markdown file: its headings' slugs (repeats numbered -1, -2, ...) and HTML ids. */
const anchorsOf = (path) => {
  const cached = anchorsCache.get(path)
  if (cached) return cached
  const anchors = new Set()
  const seen = new Map()
  for (const { text } of proseLines(readFileSync(path, "utf8"))) {
    const heading = /^ {0,3}#{1,6}\s+(.*)$/.exec(text)
    if (heading) {
      const base = slug(heading[1])
      const count = seen.get(base) ?? 0
      seen.set(base, count + 1)
      anchors.add(count === 0 ? base : `${base}-${count}`)
    }
    for (const html of text.matchAll(/<a\s[^>]*\b(?:id|name)="([^"]+)"/gi)) anchors.add(html[1])
  }
  anchorsCache.set(path, anchors)
  return anchors
}

/** The link targets of one line of prose (inline links and images, reference definitions, HTML). */
const targetsOf = (line) => {
  const text = line.replace(/`+[^`]*`+/g, (code) => " ".repeat(code.length))
  const targets = []
  for (const m of text.matchAll(/!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)/g)) targets.push(m[1])
  const definition = /^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$/.exec(text)
  if (definition) targets.push(definition[1])
  for (const m of text.matchAll(/<(?:a|img)\s[^>]*\b(?:href|src)="([^"]*)"/gi)) targets.push(m[1])
  return targets
}

const pending = readPending()
const usedPending = new Map()
const broken = []
let checked = 0

for (const source of sources()) {
  const sourceAbs = join(root, source)
  for (const { n, text } of proseLines(readFileSync(sourceAbs, "utf8"))) {
    for (const target of targetsOf(text)) {
      if (target === "" || /^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith("//")) continue
      checked++
      const hash = target.indexOf("#")
      const pathPart = decodeURIComponent(hash === -1 ? target : target.slice(0, hash))
      const anchor = hash === -1 ? undefined : decodeURIComponent(target.slice(hash + 1))
      const where = `${source}:${n}`
      const abs = pathPart === "" ? sourceAbs : resolve(dirname(sourceAbs), pathPart)
      const rel = relative(root, abs).split("\\").join("/")
      if (rel.startsWith("..")) {
        broken.push(`${where}: ${target} (outside the repository)`)
        continue
      }
      if (!existsSync(abs)) {
        const listed = [...pending].find((p) => rel === p || rel.startsWith(`${p}/`))
        if (listed === undefined) broken.push(`${where}: ${target} (no such file or folder: ${rel})`)
        else usedPending.set(listed, [...(usedPending.get(listed) ?? []), where])
        continue
      }
      if (anchor === undefined || anchor === "") continue
      const file = statSync(abs).isDirectory() ? join(abs, "README.md") : abs
      // line anchors (#L10) and anchors into other kinds of files are the forge's business
      if (!file.endsWith(".md") || /^L\d+(-L\d+)?$/.test(anchor)) continue
      if (!existsSync(file)) {
        broken.push(`${where}: ${target} (a folder without README.md for #${anchor})`)
        continue
      }
      if (!anchorsOf(file).has(anchor)) broken.push(`${where}: ${target} (no heading or anchor #${anchor} in ${relative(root, file)})`)
    }
  }
}

for (const [path, places] of usedPending) {
  console.log(`pending: ${path} (listed in ${relative(root, pendingFile)}), linked from ${places.join(", ")}`)
}
for (const path of pending) {
  if (existsSync(join(root, path))) console.log(`exists now, remove it from ${relative(root, pendingFile)}: ${path}`)
}
if (broken.length > 0) {
  console.error(`${broken.length} broken link(s) of ${checked}:`)
  for (const line of broken) console.error(`  ${line}`)
  process.exit(1)
}
console.log(`links: ${checked} relative links checked, none broken`)
