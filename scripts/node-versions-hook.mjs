// Loaded with `node --import` by scripts/node-versions.sh: sends every import or require of
// `better-sqlite3` to the copy of the package built for the running Node (its native addon is built
// for one Node ABI; the one in node_modules is Node 20's, which the main suite uses).
// LOCKSTEP_BETTER_SQLITE3 is that copy's package directory.
import * as Module from "node:module"
import { join } from "node:path"
import { pathToFileURL } from "node:url"

const dir = process.env["LOCKSTEP_BETTER_SQLITE3"]
if (!dir) throw new Error("node-versions-hook.mjs: LOCKSTEP_BETTER_SQLITE3 is not set")
const url = pathToFileURL(join(dir, "lib", "index.js")).href

if (typeof Module.registerHooks !== "function") {
  throw new Error(`node-versions-hook.mjs: Node ${process.version} lacks module.registerHooks (22.15 and later have it)`)
}
// in-thread, for import and require alike
Module.registerHooks({
  resolve: (specifier, context, nextResolve) =>
    specifier === "better-sqlite3" ? { url, format: "commonjs", shortCircuit: true } : nextResolve(specifier, context)
})
