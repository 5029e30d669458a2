/**
 * Where the ZooKeeper server and the `java` that runs it are found: given by the caller, else by
 * environment variables, else Debian's `zookeeper` package. The lookup reads the environment and
 * the file system through a `Host`, so that it is a pure function under test.
 *
 * @since 0.1.0
 * @internal
 */
import { existsSync, readdirSync } from "node:fs"
import * as path from "node:path"
import { Either } from "effect"

/** What the caller gives (`ZooKeeperServer.make`'s options); each field overrides its lookup. */
export interface Choice {
  readonly java?: string | undefined
  readonly classpath?: ReadonlyArray<string> | undefined
}

/** A `java` binary and the classpath that runs `QuorumPeerMain` with it. */
export interface Installation {
  readonly java: string
  readonly classpath: ReadonlyArray<string>
  /** Where the classpath came from, for messages (`ZOOKEEPER_HOME=/opt/zookeeper`, ...). */
  readonly source: string
}

/** What the lookup reads. */
export interface Host {
  readonly env: Readonly<Record<string, string | undefined>>
  readonly exists: (file: string) => boolean
  /** The names of the entries of `dir`; none when it cannot be read. */
  readonly list: (dir: string) => ReadonlyArray<string>
  /** The separator of a classpath in a variable (`:`, `;` on Windows). */
  readonly delimiter: string
}

/** The running process's environment and file system. */
export const processHost: Host = {
  env: process.env,
  exists: existsSync,
  list: (dir) => {
    try {
      return readdirSync(dir)
    } catch {
      return []
    }
  },
  delimiter: path.delimiter
}

/** Debian's `zookeeper` package: the server jar (its manifest names the rest of the classpath). */
export const DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
const DEBIAN_CONF_DIR = "/etc/zookeeper/conf"
/** An SLF4J binding that logs to stderr; without one the server logs nothing. */
const DEBIAN_SLF4J_SIMPLE_JAR = "/usr/share/java/slf4j-simple.jar"

/** The server's own jar (`zookeeper-3.8.4.jar`, `zookeeper.jar`), not `zookeeper-jute-…` and the like. */
const SERVER_JAR = /^zookeeper(-\d[^/]*)?\.jar$/

const HOW_TO_INSTALL =
  "install Debian's zookeeper package, or set ZOOKEEPER_HOME to an unpacked Apache ZooKeeper binary " +
  "release (its lib/*.jar form the classpath), or ZOOKEEPER_CLASSPATH to the server's classpath " +
  "(or pass the classpath option)"

/** A variable's value; an empty one counts as unset. */
const variable = (host: Host, name: string): string | undefined => {
  const value = host.env[name]
  return value === undefined || value === "" ? undefined : value
}

/** `java` option, else `JAVA`, else `$JAVA_HOME/bin/java`, else `java` on `PATH`. */
export const findJava = (choice: Choice, host: Host): string => {
  if (choice.java !== undefined) return choice.java
  const java = variable(host, "JAVA")
  if (java !== undefined) return java
  const home = variable(host, "JAVA_HOME")
  return home === undefined ? "java" : path.join(home, "bin", "java")
}

/** A wildcard entry (`lib/*`, as `java -cp` takes it) exists when its directory does. */
const entryExists = (host: Host, entry: string): boolean =>
  host.exists(path.basename(entry) === "*" ? path.dirname(entry) : entry)

/** `entries` from `source`, or why not: every entry must exist. */
const given = (
  host: Host,
  entries: ReadonlyArray<string>,
  source: string
): Either.Either<Omit<Installation, "java">, string> => {
  const missing = entries.filter((entry) => !entryExists(host, entry))
  return missing.length === 0
    ? Either.right({ classpath: entries, source })
    : Either.left(`${source} names what does not exist: ${missing.join(", ")}`)
}

/**
 * An Apache ZooKeeper binary release unpacked at `home`: the jars at its top (older releases keep
 * the server jar there) and in `lib/`, and `conf/` (its logging configuration) if it has one.
 */
const release = (host: Host, home: string): Either.Either<Omit<Installation, "java">, string> => {
  const source = `ZOOKEEPER_HOME=${home}`
  const jars = (dir: string): ReadonlyArray<string> =>
    host.list(dir).filter((name) => name.endsWith(".jar")).sort().map((name) => path.join(dir, name))
  const lib = path.join(home, "lib")
  const all = [...jars(home), ...jars(lib)]
  if (!all.some((jar) => SERVER_JAR.test(path.basename(jar)))) {
    return Either.left(
      `${source}: no ZooKeeper server jar (zookeeper-<version>.jar) in ${home} or ${lib}; ` +
        "set ZOOKEEPER_HOME to an unpacked Apache ZooKeeper binary release (apache-zookeeper-<version>-bin)"
    )
  }
  const conf = path.join(home, "conf")
  return Either.right({ classpath: host.exists(conf) ? [...all, conf] : all, source })
}

/**
 * The classpath: the `classpath` option, else `ZOOKEEPER_CLASSPATH` (entries separated as `PATH`'s),
 * else `ZOOKEEPER_HOME` (an Apache binary release), else Debian's `zookeeper` package. The first
 * one given is the one used: a wrong one is reported, not passed over.
 */
export const findClasspath = (choice: Choice, host: Host): Either.Either<Omit<Installation, "java">, string> => {
  if (choice.classpath !== undefined) {
    return choice.classpath.length === 0
      ? Either.left("the classpath option is empty")
      : given(host, choice.classpath, "the classpath option")
  }
  const classpath = variable(host, "ZOOKEEPER_CLASSPATH")
  if (classpath !== undefined) {
    return given(host, classpath.split(host.delimiter).filter((entry) => entry !== ""), "ZOOKEEPER_CLASSPATH")
  }
  const home = variable(host, "ZOOKEEPER_HOME")
  if (home !== undefined) return release(host, home)
  if (host.exists(DEBIAN_JAR)) {
    return Either.right({
      classpath: [DEBIAN_JAR, DEBIAN_CONF_DIR, ...(host.exists(DEBIAN_SLF4J_SIMPLE_JAR) ? [DEBIAN_SLF4J_SIMPLE_JAR] : [])],
      source: "Debian's zookeeper package"
    })
  }
  return Either.left(
    `no ZooKeeper found: no classpath option, ZOOKEEPER_CLASSPATH or ZOOKEEPER_HOME, and no ${DEBIAN_JAR}; ${HOW_TO_INSTALL}`
  )
}

/** The installation `choice` and `host` lead to, or what was looked for and how to provide it. */
export const find = (choice: Choice, host: Host): Either.Either<Installation, string> =>
  Either.map(findClasspath(choice, host), (found) => ({ ...found, java: findJava(choice, host) }))

/** The hint of a `java` that cannot be started. */
export const JAVA_NOT_FOUND =
  " (not found: install a Java runtime, e.g. Debian's default-jre-headless, or set JAVA to the java binary or " +
  "JAVA_HOME to the runtime's directory)"
