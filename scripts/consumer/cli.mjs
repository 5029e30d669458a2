// The packed @lockstep/cli as a user runs it (scripts/consumer-check.sh), in a project where the
// tarballs were installed: `lockstep run` with plain node against a redis-server this starts on a
// free loopback port, twice at once on one key (the second waits, the fences increase), with the
// command's exit code and output passed through, `--no-wait` on a held key, and an exit within a
// second of the command's; and the library entry point, imported as a program of the project does.
import { execFileSync, spawn } from "node:child_process"
import { createServer } from "node:net"
import { setTimeout as sleep } from "node:timers/promises"

const port = await new Promise((resolve) => {
  const server = createServer().listen(0, "127.0.0.1", () => {
    const { port } = server.address()
    server.close(() => resolve(port))
  })
})
const redis = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdio: "ignore" })
const url = `redis://127.0.0.1:${port}`
const fail = (message) => {
  redis.kill("SIGKILL")
  console.error(`lockstep cli: ${message}`)
  process.exit(1)
}
for (let i = 0; ; i++) {
  try {
    if (execFileSync("redis-cli", ["-p", String(port), "ping"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim() === "PONG") break
  } catch { /* not up yet */ }
  if (i > 100) fail("redis-server did not start")
  await sleep(50)
}

const lockstep = (args) =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, ["node_modules/.bin/lockstep", ...args], { stdio: ["ignore", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk) => (stdout += chunk))
    child.stderr.on("data", (chunk) => (stderr += chunk))
    child.on("close", (code) => resolve({ code, stdout, stderr }))
  })

const script = 'echo "$LOCKSTEP_KEY $LOCKSTEP_FENCE $(date +%s%N)"; sleep 0.3; date +%s%N; exit 3'
const [first, second] = await Promise.all([0, 1].map(() => lockstep(["run", "--backend", url, "consumer", "--", "sh", "-c", script])))
for (const result of [first, second]) {
  if (result.code !== 3 || result.stderr !== "") fail(`run: exit ${result.code}, stderr ${JSON.stringify(result.stderr)}`)
}
const section = (result) => {
  const [head, end] = result.stdout.trim().split("\n")
  const [key, fence, start] = head.split(" ")
  if (key !== "consumer") fail(`run: LOCKSTEP_KEY is ${key}`)
  return { fence: BigInt(fence), start: BigInt(start), end: BigInt(end) }
}
const [a, b] = [section(first), section(second)].sort((x, y) => (x.start < y.start ? -1 : 1))
if (b.start < a.end) fail("run: the two commands overlapped")
if (b.fence <= a.fence) fail(`run: the fences did not increase (${a.fence}, ${b.fence})`)

const holding = spawn(process.execPath, ["node_modules/.bin/lockstep", "run", "-b", url, "held", "--", "sleep", "5"], { stdio: "ignore" })
for (let i = 0; ; i++) {
  const status = await lockstep(["status", "--backend", url, "--json", "held"])
  if (JSON.parse(status.stdout).holders.length === 1) break
  if (i > 100) fail("status: the holder did not show")
  await sleep(50)
}
const refused = await lockstep(["run", "--backend", url, "--no-wait", "held", "--", "echo", "ran"])
if (refused.code !== 75 || refused.stdout !== "" || !/^lockstep: "held" is held by /.test(refused.stderr)) {
  fail(`run --no-wait: exit ${refused.code}, ${JSON.stringify(refused)}`)
}
holding.kill("SIGTERM")

// lockstep exits as soon as its command has ended and the lock is released, whatever the lease
const lags = []
for (const flags of [[], ["--lease", "5s"]]) {
  const stamped = await lockstep(["run", "--backend", url, ...flags, "lag", "--", "node", "-e", "console.log(Date.now())"])
  const lag = Date.now() - Number(stamped.stdout.trim())
  if (stamped.code !== 0 || lag > 1_000) fail(`run ${flags.join(" ")}: exit ${stamped.code}, ${lag} ms after its command`)
  lags.push(lag)
}

const { Cli } = await import("@lockstep/cli")
if (typeof Cli.main !== "function" || Cli.ExitCode.conflict !== 75) fail("import of @lockstep/cli: no Cli.main or Cli.ExitCode")
redis.kill("SIGTERM")
console.log(`lockstep run: ok (fences ${a.fence} < ${b.fence}, exit code 3 passed through, --no-wait exits 75, exits ${lags.join(" and ")} ms after its command); import of @lockstep/cli: ok`)
