/**
 * `lockstep --help` and usage errors: colour only on a terminal and without NO_COLOR, and the help
 * names every backend lockstep takes.
 */
import { spawnSync } from "node:child_process"
import { describe, expect, it } from "vitest"
import { buildBin, lockstep, tempDir } from "./fixtures/lockstep.js"

const ESC = "\u001b"

/** `script` (util-linux) runs a command on a pseudo-terminal. */
const hasScript = spawnSync("script", ["--version"]).status === 0

describe("lockstep --help", () => {
  const dir = tempDir()
  const bin = buildBin(dir)

  it("piped: plain text, no escape sequences, on stdout and in a usage error on stderr", async () => {
    const help = await lockstep(bin, ["--help"])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("lockstep run")
    expect(help.stdout).not.toContain(ESC)
    const runHelp = await lockstep(bin, ["run", "--help"])
    expect(runHelp.stdout).toContain("EXAMPLES")
    expect(runHelp.stdout).not.toContain(ESC)
    const bad = await lockstep(bin, ["status", "--kind", "x"])
    expect(bad.code).toBe(64)
    expect(bad.stderr).not.toBe("")
    expect(bad.stderr).not.toContain(ESC)
  })

  it("names every backend: Redis (Sentinel, Cluster), PostgreSQL, MySQL/MariaDB, SQLite, ZooKeeper", async () => {
    const { stdout } = await lockstep(bin, ["--help"])
    const description = stdout.slice(stdout.indexOf("DESCRIPTION"))
    for (const name of ["Redis", "Sentinel", "Redis Cluster", "PostgreSQL", "MySQL", "MariaDB", "SQLite", "ZooKeeper"]) {
      expect(description).toContain(name)
    }
    for (const flag of ["--prefix", "--accept-eviction"]) expect((await lockstep(bin, ["run", "--help"])).stdout).toContain(flag)
  })

  it.runIf(hasScript)("on a terminal: in colour, unless NO_COLOR is set", async () => {
    const onTerminal = (env: Record<string, string>) =>
      spawnSync("script", ["-qec", `${JSON.stringify(process.execPath)} ${JSON.stringify(bin)} --help`, "/dev/null"], {
        encoding: "utf8",
        env: { ...process.env, ...env }
      }).stdout
    expect(onTerminal({})).toContain(ESC)
    expect(onTerminal({ NO_COLOR: "1" })).not.toContain(ESC)
    expect(onTerminal({ NO_COLOR: "1" })).toContain("lockstep run")
  })
})
