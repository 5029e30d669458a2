// Renders the diagrams of the guides: every Mermaid source docs/diagrams/<name>.mmd to
// docs/diagrams/<name>.svg, with @mermaid-js/mermaid-cli in the machine's Chromium (one browser
// for all of them). The SVGs are committed, so that a forge shows them in the guides.
//
//   node scripts/docs-diagrams.mjs          render the sources whose SVG is missing or stale
//   node scripts/docs-diagrams.mjs --all    render every source
//   node scripts/docs-diagrams.mjs --check  fail if a source does not render (a syntax error), or
//                                           its SVG is missing or stale (CI)
//
// Rendering is not byte-stable (another Chromium or Mermaid lays text out a pixel apart), so an
// SVG is judged by what it was rendered from, not by its bytes: its first line names its source
// and the SHA-256 of that source with the rendering options below.
//
// Chromium: $PUPPETEER_EXECUTABLE_PATH, else /usr/bin/chromium (Debian's `chromium` package).
// Puppeteer never downloads a browser of its own here: its install script is not run
// (pnpm.ignoredBuiltDependencies), and PUPPETEER_SKIP_DOWNLOAD=1 keeps it from it elsewhere.
import { createHash } from "node:crypto"
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("..", import.meta.url))
const dir = join(root, "docs", "diagrams")
const check = process.argv.includes("--check")
const all = process.argv.includes("--all")

/** How every diagram is rendered; part of each SVG's stamp, so a change here makes them all stale. */
const options = {
  backgroundColor: "white",
  mermaidConfig: {
    theme: "default",
    // a font every viewer has (or a metric-compatible one), so that text fits the boxes laid out for it
    fontFamily: "arial, helvetica, sans-serif",
    // labels as SVG text, not HTML in a foreignObject: the SVGs are shown as images
    htmlLabels: false,
    flowchart: { htmlLabels: false },
    sequence: { mirrorActors: true, wrap: false }
  }
}

const stampOf = (name, source) =>
  `<!-- docs/diagrams/${name}.mmd sha256:${createHash("sha256").update(JSON.stringify(options)).update(source).digest("hex")} (rendered by pnpm docs:diagrams) -->`

const chromium = () => {
  const path = process.env.PUPPETEER_EXECUTABLE_PATH || "/usr/bin/chromium"
  if (!existsSync(path)) {
    console.error(`no Chromium at ${path}: install Debian's chromium package, or set PUPPETEER_EXECUTABLE_PATH`)
    process.exit(1)
  }
  return path
}

const main = async () => {
  const sources = existsSync(dir)
    ? readdirSync(dir).filter((file) => file.endsWith(".mmd")).sort().map((file) => file.slice(0, -4))
    : []
  const diagrams = sources.map((name) => {
    const source = readFileSync(join(dir, `${name}.mmd`), "utf8")
    const svg = join(dir, `${name}.svg`)
    const firstLine = existsSync(svg) ? readFileSync(svg, "utf8").split("\n", 1)[0] : undefined
    const stamp = stampOf(name, source)
    const state = firstLine === undefined ? "missing" : firstLine === stamp ? "current" : "stale"
    return { name, source, svg, stamp, state }
  })
  // an SVG whose source is gone
  const orphans = existsSync(dir)
    ? readdirSync(dir).filter((file) => file.endsWith(".svg") && !sources.includes(file.slice(0, -4)))
    : []
  // in check mode every source is rendered, so that one that does not parse fails
  const toRender = check || all ? diagrams : diagrams.filter((d) => d.state !== "current")
  const started = Date.now()
  const failures = []
  if (toRender.length > 0) {
    const executablePath = chromium()
    const [{ renderMermaid }, puppeteer] = await Promise.all([import("@mermaid-js/mermaid-cli"), import("puppeteer")])
    const browser = await puppeteer.launch({
      executablePath,
      headless: true,
      // Chromium refuses to start its sandbox as root (CI runs as root); the pages are our own sources
      args: process.getuid?.() === 0 ? ["--no-sandbox"] : []
    })
    try {
      for (const diagram of toRender) {
        try {
          const { data } = await renderMermaid(browser, diagram.source, "svg", { ...options, svgId: diagram.name })
          if (!check) {
            writeFileSync(diagram.svg, `${diagram.stamp}\n${Buffer.from(data).toString("utf8")}\n`)
            console.log(`docs/diagrams/${diagram.name}.svg: rendered`)
          }
        } catch (error) {
          failures.push(`docs/diagrams/${diagram.name}.mmd does not render: ${error instanceof Error ? error.message : error}`)
        }
      }
    } finally {
      await browser.close()
    }
  }
  const seconds = ((Date.now() - started) / 1000).toFixed(1)
  if (check) {
    for (const d of diagrams) {
      if (d.state !== "current") failures.push(`docs/diagrams/${d.name}.svg is ${d.state} (run pnpm docs:diagrams and commit it)`)
    }
    for (const file of orphans) failures.push(`docs/diagrams/${file} has no source docs/diagrams/${file.slice(0, -4)}.mmd`)
    if (failures.length > 0) {
      console.error(failures.join("\n"))
      process.exit(1)
    }
    console.log(`docs/diagrams: ${diagrams.length} diagrams render and their SVGs are up to date (${seconds}s)`)
    return
  }
  for (const file of orphans) console.warn(`docs/diagrams/${file} has no source: remove it`)
  if (failures.length > 0) {
    console.error(failures.join("\n"))
    process.exit(1)
  }
  console.log(`docs/diagrams: ${toRender.length} of ${diagrams.length} rendered (${seconds}s)`)
}

await main()
