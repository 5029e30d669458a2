// Runs every program of examples/ (or those named: `node scripts/run-examples.mjs fencing
// testing`), two at a time, each with a time limit, against the machine's Redis and PostgreSQL
// (REDIS_URL, LOCKSTEP_PG_URL). Prints each one's output once it has ended, then one line per
// example with its time; exits 1 if any failed or ran out of time.
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"

const root = fileURLToPath(new URL("../", import.meta.url))
const tsx = `${root}node_modules/.bin/tsx`
const vitest = `${root}node_modules/.bin/vitest`

const examples = [
  { name: "http-orders", command: [tsx, "examples/http-orders/main.ts"] },
  { name: "worker-pool", command: [tsx, "examples/worker-pool/main.ts"] },
  { name: "run-once", command: [tsx, "examples/run-once/main.ts"] },
  { name: "run-once-cli", command: ["bash", "examples/run-once/cli.sh"] },
  { name: "testing", command: [vitest, "run", "--root", "examples/testing"] },
  { name: "multi-lock", command: [tsx, "examples/multi-lock/main.ts"] },
  { name: "fencing", command: [tsx, "examples/fencing/main.ts"] }
]

const timeoutMs = Number(process.env.EXAMPLES_TIMEOUT_S ?? 60) * 1000
const concurrency = Number(process.env.EXAMPLES_CONCURRENCY ?? 2)

const named = process.argv.slice(2)
const unknown = named.filter((name) => !examples.some((example) => example.name === name))
if (unknown.length > 0) {
  console.error(`no example named ${unknown.join(", ")}; the examples: ${examples.map((e) => e.name).join(", ")}`)
  process.exit(64)
}
const selected = named.length === 0 ? examples : examples.filter((example) => named.includes(example.name))

/** Runs one example in a process group of its own (killed whole at the time limit); its outcome. */
const run = (example) =>
  new Promise((resolve) => {
    const started = Date.now()
    const [command, ...args] = example.command
    const child = spawn(command, args, { cwd: root, detached: true, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1" } })
    let output = ""
    child.stdout.on("data", (chunk) => (output += chunk))
    child.stderr.on("data", (chunk) => (output += chunk))
    let timedOut = false
    const timer = setTimeout(() => {
      timedOut = true
      try {
        process.kill(-child.pid, "SIGKILL")
      } catch {
        // already gone
      }
    }, timeoutMs)
    child.on("close", (code, signal) => {
      clearTimeout(timer)
      const seconds = (Date.now() - started) / 1000
      const ok = code === 0 && !timedOut
      const why = timedOut ? `ran out of time (${timeoutMs / 1000} s)` : code !== 0 ? `exit ${code ?? signal}` : "ok"
      console.log(`\n== ${example.name} (${example.command.slice(1).join(" ")}): ${why}, ${seconds.toFixed(1)} s\n${output.trimEnd()}`)
      resolve({ name: example.name, ok, why, seconds })
    })
  })

const started = Date.now()
const queue = [...selected]
const outcomes = []
await Promise.all(
  Array.from({ length: Math.min(concurrency, queue.length) }, async () => {
    for (let example = queue.shift(); example !== undefined; example = queue.shift()) outcomes.push(await run(example))
  })
)

console.log(`\n== examples, ${((Date.now() - started) / 1000).toFixed(1)} s in all (${concurrency} at a time):`)
for (const example of selected) {
  const outcome = outcomes.find((o) => o.name === example.name)
  console.log(`  ${outcome.ok ? "ok    " : "FAILED"} ${example.name.padEnd(14)} ${outcome.seconds.toFixed(1).padStart(5)} s  ${outcome.ok ? "" : outcome.why}`)
}
const failed = outcomes.filter((o) => !o.ok).length
console.log(`examples: ${outcomes.length - failed} passed, ${failed} failed`)
process.exit(failed > 0 ? 1 : 0)
