// Writes every ```ts block of README.md to readme-examples/example-N.ts so `pnpm typecheck` compiles them.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"

const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8")
const blocks = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1])
const dir = new URL("../readme-examples/", import.meta.url)
rmSync(dir, { recursive: true, force: true })
mkdirSync(dir)
blocks.forEach((code, i) => writeFileSync(new URL(`example-${i + 1}.ts`, dir), code))
console.log(`README: ${blocks.length} examples extracted for typechecking`)
